// The two products of a block of attention, its rows and columns read through index lists (the blocks of
// attention_kernels/bucketed/planning.py: L sorted queries against M sorted keys):
//
//     scores   S_rc = q_{queries_r} · k_{keys_c}                    (L × M, over d)
//     outputs  O_r  = Σ_c P_rc v_{keys_c}                           (L × d_v, over M)
//
// Both are C = A·B with A's rows and B's rows given by pointers: for the scores B is kᵀ (d × M), packed per
// block into a panel the cache keeps while every row of A passes over it; for the outputs B's rows are the
// values where they lie. No gather a batched matmul would need, and the product runs on 512-bit vectors: on
// machines whose BLAS takes a narrower path (MKL on AMD processors), 1.4 to 2 times the matmul's rate.
//
// The reference is the batched matmul of the gathered rows (attention_kernels/bucketed/block_products.py);
// the sums run over the inner dimension in order, so the results differ from it by round-off only.

#include <algorithm>
#include <atomic>
#include <new>
#include <utility>
#include <vector>

#include "panels.h"
#include "vectors.h"

namespace {

using panels::padded_stride, panels::prefetch_rows;
using vectors::allocated, vectors::guarded, vectors::kWidth, vectors::pack_transposed, vectors::product, vectors::Vec,
    vectors::whole_vectors;

// A thread's buffers for the blocks it takes: B's rows (pointers, and a panel where they are copies), A's
// rows and C's rows (pointers).
template <typename Real>
struct Buffers {
    std::vector<Real> panel;
    std::vector<const Real*> a, b;
    std::vector<Real*> c;

    // False when memory ran out (see `allocated`).
    bool allocate(int64_t panel_size, int64_t a_rows, int64_t b_rows, std::atomic<bool>& short_of_memory) {
        const auto all = [&] { panel.assign(panel_size, Real(0)), a.resize(a_rows), b.resize(b_rows), c.resize(a_rows); };
        return allocated(all, short_of_memory);
    }
};

// scores (blocks, L, M): scores[b][r][c] = q[queries[b][r]] · k[keys[b][c]], q and k rows of d. Each thread
// takes consecutive blocks (a static schedule), so the next block it prefetches is its own.
template <typename Real>
void block_scores(const Real* q, const Real* k, const int64_t* queries, const int64_t* keys, int64_t blocks,
                  int64_t L, int64_t M, int64_t d, Real* scores, int threads) {
    const int64_t stride = padded_stride<Real>(M);
    std::atomic<bool> short_of_memory{false};
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        Buffers<Real> buffers;  // the panel: kᵀ of the block, d × stride, the columns past M 0
        const bool ready = buffers.allocate(d * stride, L, d, short_of_memory);
        for (int64_t t = 0; ready && t < d; ++t) buffers.b[t] = buffers.panel.data() + t * stride;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b) {
            if (!ready) continue;
            if (b + 1 < blocks) {
                prefetch_rows(k, keys + (b + 1) * M, M, d);
                prefetch_rows(q, queries + (b + 1) * L, L, d);
            }
            pack_transposed(k, keys + b * M, M, d, buffers.panel.data(), stride);
            for (int64_t r = 0; r < L; ++r)
                buffers.a[r] = q + queries[b * L + r] * d, buffers.c[r] = scores + (b * L + r) * M;
            product(buffers.a.data(), 1, L, buffers.b.data(), d, M, buffers.c.data());
        }
    }
    if (short_of_memory) throw std::bad_alloc();
}

// outputs[b][r] = Σ_c probs[b][r][c] · y[index[b][c]] (blocks, L, dy), or with `transpose`
// outputs[b][c] = Σ_r probs[b][r][c] · y[index[b][r]] (blocks, M, dy); probs (blocks, L, M), y rows of dy.
template <typename Real>
void block_outputs(const Real* probs, const Real* y, const int64_t* index, int64_t blocks, int64_t L, int64_t M,
                   int64_t dy, bool transpose, Real* outputs, int threads) {
    const int64_t stride = whole_vectors<Real>(dy);
    // without transpose A = P (rows r, contiguous over c); with, A = Pᵀ (rows c, a step of M over r)
    const int64_t rows = transpose ? M : L, depth = transpose ? L : M, step = transpose ? M : 1;
    // B's rows are y's own where they hold whole vectors; else copies padded with 0 (a panel)
    const bool whole = dy == stride;
    std::atomic<bool> short_of_memory{false};
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        Buffers<Real> buffers;
        const bool ready = buffers.allocate(whole ? 0 : depth * stride, rows, depth, short_of_memory);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b) {
            if (!ready) continue;
            if (b + 1 < blocks) prefetch_rows(y, index + (b + 1) * depth, depth, dy);
            for (int64_t t = 0; t < depth; ++t) {
                const Real* row = y + index[b * depth + t] * dy;
                if (!whole) std::memcpy(&buffers.panel[t * stride], row, dy * sizeof(Real));
                buffers.b[t] = whole ? row : buffers.panel.data() + t * stride;
            }
            for (int64_t r = 0; r < rows; ++r)
                buffers.a[r] = probs + b * L * M + (transpose ? r : r * M), buffers.c[r] = outputs + (b * rows + r) * dy;
            product(buffers.a.data(), step, rows, buffers.b.data(), depth, dy, buffers.c.data());
        }
    }
    if (short_of_memory) throw std::bad_alloc();
}

}  // namespace

#define EXPORT(SUFFIX, REAL)                                                                                   \
    extern "C" int block_scores_##SUFFIX(const REAL* q, const REAL* k, const int64_t* queries, const int64_t* keys, \
                                         int64_t blocks, int64_t L, int64_t M, int64_t d, REAL* scores,           \
                                         int threads) {                                                           \
        return guarded([&] { block_scores(q, k, queries, keys, blocks, L, M, d, scores, threads); });            \
    }                                                                                                             \
    extern "C" int block_outputs_##SUFFIX(const REAL* probs, const REAL* y, const int64_t* index, int64_t blocks, \
                                          int64_t L, int64_t M, int64_t dy, int64_t transpose, REAL* outputs,     \
                                          int threads) {                                                          \
        return guarded([&] { block_outputs(probs, y, index, blocks, L, M, dy, transpose != 0, outputs, threads); }); \
    }

EXPORT(float, float)
EXPORT(double, double)
