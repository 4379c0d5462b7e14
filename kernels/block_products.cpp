// The two products of a block of attention, its rows and columns read through index lists (the blocks of
// kernels/bucket_blocks.py: L sorted queries against M sorted keys):
//
//     scores   S_rc = q_{queries_r} · k_{keys_c}                    (L × M, over d)
//     outputs  O_r  = Σ_c P_rc v_{keys_c}                           (L × d_v, over M)
//
// Both are C = A·B with A's rows and B's rows given by pointers: for the scores B is kᵀ (d × M), packed per
// block into a panel the cache keeps while every row of A passes over it; for the outputs B's rows are the
// values where they lie. No gather a batched matmul would need, and the product runs on 512-bit vectors: on
// machines whose BLAS takes a narrower path (MKL on AMD processors), 1.4 to 2 times the matmul's rate.
//
// The reference is the batched matmul of the gathered rows (kernels/block_products.py); the sums run over
// the inner dimension in order, so the results differ from it by round-off only.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

// Vectors of 64 bytes of float or double (GCC's and Clang's vector extensions: the compiler picks the
// instructions).
template <typename Real>
using Vec __attribute__((vector_size(64))) = Real;
template <typename Real>
constexpr int64_t kWidth = 64 / sizeof(Real);

// The first `valid` (≤ kWidth) lanes of v, written from `to` on: one store, masked where the vector is not
// whole (a copy of a size known only at run time would be a call).
template <typename Real>
void store(Real* to, const Vec<Real>& v, int64_t valid) {
    if (valid == kWidth<Real>) {
        std::memcpy(to, &v, sizeof v);
        return;
    }
#ifdef __AVX512F__
    const unsigned lanes = (1u << valid) - 1;
    if constexpr (std::is_same_v<Real, float>) {
        _mm512_mask_storeu_ps(to, static_cast<__mmask16>(lanes), static_cast<__m512>(v));
    } else {
        _mm512_mask_storeu_pd(to, static_cast<__mmask8>(lanes), static_cast<__m512d>(v));
    }
#else
    std::memcpy(to, &v, valid * sizeof(Real));
#endif
}

// A tile of C: kRows rows × kVectors vectors of columns, 24 running sums of the 32 vector registers, with
// the kVectors of B and one broadcast of A beside them. Each step of the inner dimension loads 4 vectors and
// 6 scalars for 24 fused multiply-adds.
constexpr int kRows = 6;
constexpr int kVectors = 4;

// C[r][..] = Σ_t A[r][t] · B[t][..] for the R rows `a` (A[r][t] at a[r][t · step]) and NV vectors of
// columns of the rows `b` (B[t] from b[t] on, whole vectors readable) from column `col` on; the first `cols`
// columns of each row are written to c[r] + col.
template <typename Real, int R, int NV>
void tile(const Real* const* a, int64_t step, const Real* const* b, int64_t depth, int64_t col,
          int64_t cols, Real* const* c) {
    Vec<Real> sum[R][NV] = {};
    for (int64_t t = 0; t < depth; ++t) {
        Vec<Real> row[NV];
        for (int v = 0; v < NV; ++v) std::memcpy(&row[v], b[t] + col + v * kWidth<Real>, sizeof row[v]);
        for (int r = 0; r < R; ++r) {
            const Real x = a[r][t * step];
            for (int v = 0; v < NV; ++v) sum[r][v] += x * row[v];
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int v = 0; v < NV; ++v) {
            const int64_t valid = std::min<int64_t>(cols - v * kWidth<Real>, kWidth<Real>);
            if (valid > 0) store<Real>(c[r] + col + v * kWidth<Real>, sum[r][v], valid);
        }
    }
}

template <typename Real, int R>
void strip(const Real* const* a, int64_t step, const Real* const* b, int64_t depth, int64_t col,
           int64_t cols, Real* const* c) {
    switch (std::min<int64_t>((cols + kWidth<Real> - 1) / kWidth<Real>, kVectors)) {
        case 1: return tile<Real, R, 1>(a, step, b, depth, col, cols, c);
        case 2: return tile<Real, R, 2>(a, step, b, depth, col, cols, c);
        case 3: return tile<Real, R, 3>(a, step, b, depth, col, cols, c);
        default: return tile<Real, R, kVectors>(a, step, b, depth, col, cols, c);
    }
}

// C = A·B for `rows` rows of A (pointers, A[r][t] at a[r][t · step], t < depth) and the `depth` rows of B
// (pointers, each readable for `cols` rounded up to whole vectors), into the rows c (pointers).
template <typename Real>
void product(const Real* const* a, int64_t step, int64_t rows, const Real* const* b, int64_t depth,
             int64_t cols, Real* const* c) {
    // column strips outside, so a strip of B (depth × 64 floats: 16 KiB at depth 64) stays in the
    // first-level cache while every tile of rows passes over it
    for (int64_t col = 0; col < cols; col += kVectors * kWidth<Real>) {
        const int64_t left = cols - col;
        int64_t r = 0;
        for (; r + kRows <= rows; r += kRows) strip<Real, kRows>(a + r, step, b, depth, col, left, c + r);
        switch (rows - r) {
            case 1: strip<Real, 1>(a + r, step, b, depth, col, left, c + r); break;
            case 2: strip<Real, 2>(a + r, step, b, depth, col, left, c + r); break;
            case 3: strip<Real, 3>(a + r, step, b, depth, col, left, c + r); break;
            case 4: strip<Real, 4>(a + r, step, b, depth, col, left, c + r); break;
            case 5: strip<Real, 5>(a + r, step, b, depth, col, left, c + r); break;
            default: break;
        }
    }
}

template <typename Real>
int64_t whole_vectors(int64_t n) {
    return (n + kWidth<Real> - 1) / kWidth<Real> * kWidth<Real>;
}

// Asks for the rows x[rows[0..count)] (of `width` Reals) to be brought into the cache: the next block's, whose
// rows lie anywhere in memory, while this block's product runs.
template <typename Real>
void prefetch_rows(const Real* x, const int64_t* rows, int64_t count, int64_t width) {
    for (int64_t i = 0; i < count; ++i)
        for (int64_t j = 0; j < width; j += 64 / sizeof(Real)) __builtin_prefetch(x + rows[i] * width + j);
}

// One stage of a transpose of a square of vectors (rows a, b = a + bit of it): the lanes of a with `bit`
// set trade places with the lanes of b without it, a[i + bit] ↔ b[i]; over bit = 1, 2, 4, ... lane i of row
// r ends where lane r of row i was.
template <int bit, typename Real, size_t... lane>
void exchange(Vec<Real>& a, Vec<Real>& b, std::index_sequence<lane...>) {
    constexpr int n = sizeof...(lane);
#ifdef __clang__
    const Vec<Real> low = __builtin_shufflevector(a, b, (lane & bit ? int(lane) - bit + n : int(lane))...);
    const Vec<Real> high = __builtin_shufflevector(a, b, (lane & bit ? int(lane) + n : int(lane) + bit)...);
#else  // GCC's own shuffle, in every version (its __builtin_shufflevector came with GCC 12)
    using Index = std::conditional_t<sizeof(Real) == 4, int32_t, int64_t>;
    typedef Index Indices __attribute__((vector_size(64)));
    const Vec<Real> low = __builtin_shuffle(a, b, Indices{(lane & bit ? Index(lane) - bit + n : Index(lane))...});
    const Vec<Real> high = __builtin_shuffle(a, b, Indices{(lane & bit ? Index(lane) + n : Index(lane) + bit)...});
#endif
    a = low, b = high;
}

template <int bit, typename Real, int n>
void stage(Vec<Real> (&rows)[n]) {
    for (int r = 0; r < n; ++r)
        if (!(r & bit)) exchange<bit, Real>(rows[r], rows[r + bit], std::make_index_sequence<n>{});
}

// panel[t][c] = x[rows[c]][t] for c < count, t < depth (panel rows of `stride`): squares of a vector's width
// of lanes at a time, read as whole rows and transposed in registers, so every write fills a cache line
// (the depth's last partial square lane by lane).
template <typename Real>
void pack_transposed(const Real* x, const int64_t* rows, int64_t count, int64_t depth, Real* panel,
                     int64_t stride) {
    constexpr int n = kWidth<Real>;
    for (int64_t c = 0; c < count; c += n) {
        const int64_t valid = std::min<int64_t>(n, count - c);
        const Real* from[n];
        for (int j = 0; j < n; ++j) from[j] = x + rows[c + std::min<int64_t>(j, valid - 1)] * depth;
        int64_t t = 0;
        for (; t + n <= depth; t += n) {
            Vec<Real> square[n];
            for (int j = 0; j < n; ++j) std::memcpy(&square[j], from[j] + t, sizeof square[j]);
            stage<1, Real, n>(square), stage<2, Real, n>(square), stage<4, Real, n>(square);
            if constexpr (n == 16) stage<8, Real, n>(square);
            for (int j = 0; j < n; ++j) store<Real>(panel + (t + j) * stride + c, square[j], valid);
        }
        for (; t < depth; ++t) {
            Vec<Real> column;
            for (int j = 0; j < n; ++j) column[j] = from[j][t];
            store<Real>(panel + t * stride + c, column, valid);
        }
    }
}

// A thread's buffers for the blocks it takes: B's rows (pointers, and a panel where they are copies), A's
// rows and C's rows (pointers).
template <typename Real>
struct Buffers {
    std::vector<Real> panel;
    std::vector<const Real*> a, b;
    std::vector<Real*> c;

    // False when memory ran out (then `short_of_memory` is set): an exception may not leave a parallel
    // region, so the threads still go through the loop of blocks, without work, and the caller throws after.
    bool allocate(int64_t panel_size, int64_t a_rows, int64_t b_rows, std::atomic<bool>& short_of_memory) {
        try {
            panel.assign(panel_size, Real(0)), a.resize(a_rows), b.resize(b_rows), c.resize(a_rows);
            return true;
        } catch (const std::bad_alloc&) {
            short_of_memory = true;
            return false;
        }
    }
};

// scores (blocks, L, M): scores[b][r][c] = q[queries[b][r]] · k[keys[b][c]], q and k rows of d. Each thread
// takes consecutive blocks (a static schedule), so the next block it prefetches is its own.
template <typename Real>
void block_scores(const Real* q, const Real* k, const int64_t* queries, const int64_t* keys, int64_t blocks,
                  int64_t L, int64_t M, int64_t d, Real* scores, int threads) {
    const int64_t stride = whole_vectors<Real>(M);
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

// Runs `body`: 0 once done, −1 when memory ran out (no exception may cross into C).
template <typename F>
int guarded(F&& body) {
    try {
        body();
        return 0;
    } catch (const std::bad_alloc&) {
        return -1;
    }
}

}  // namespace

// 1 where the products run on 512-bit vectors (AVX-512), whose 32 registers hold a tile's 24 running sums;
// elsewhere (fewer or narrower registers) the tile would spill, and the batched matmul is as fast.
extern "C" int block_products_wide() {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

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
