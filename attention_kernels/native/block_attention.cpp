// Attention over blocks whose every row is a whole query, fused: for a few queries at a time their scores,
// their α-entmax (or softmax) and their outputs, with the scores never leaving the first-level cache.
//
// A block is L queries q_{queries_r} against M keys k_{keys_c} (attention_kernels/bucketed/planning.py), and
// with one bucket id per token and no pattern, each query sits in one row of one block. Entry (r, c) is a
// key of row r when key_pos_c ≤ limit_r (the causal cut and the padding; with no mask, every entry). For a
// tile of R rows:
//
//     width_r  = |{c : key_pos_c ≤ limit_r}|     (0: the row has no key)
//     S_rc     = (scale · q_r) · k_c      for c < max_r width_r     (kᵀ packed once per block)
//     P_r      = α-entmax(S_r) over its first width_r columns           (row_entmax.h)
//     out_r    = Σ_c P_rc v_c              written at the query's own row of the output
//
// Keys ascend by position within a bucket's block, so the keys of a row are its first width_r columns and
// no entry needs a test, and when causal a tile's rows stop at their own position: a bucket of L queries
// computes about (1 + R / L) times its attended pairs (R = 12), where blocks cut into chunks of 64 rows
// compute whole chunk-by-prefix rectangles (1.5 times at L = 128).
//
// A query may also attend E keys of its own beyond its block row (`extra`: the window band's keys that share
// no id with it, attention_kernels/bucketed/band_keys.py). Their scores are dot products of the scaled query
// with each such key, appended to the row's block scores, so the row's α-entmax covers both, and their
// probabilities add Σ_e P_re v_e to its output. A query with no block row at all (no id, or no key holds its
// id) comes as a block of its own with no keys (M = 0).
//
// The reference is the unfused path of attention_kernels/bucketed/torch_path.py (scores, then
// `exact_entmax`, then the output product, a chunk of blocks at a time); each query's arithmetic is the same
// as there up to the sums' order, and the same whatever the number of threads.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "panels.h"
#include "row_entmax.h"
#include "vectors.h"

namespace {

using row_entmax::kGroup, row_entmax::kNoKey, row_entmax::Query, row_entmax::Row;
using panels::padded_stride, panels::prefetch_rows;
using vectors::allocated, vectors::guarded, vectors::pack_transposed, vectors::product, vectors::whole_vectors;

// Queries whose scores, probabilities and outputs are computed together: two of the products' register
// tiles of rows, and few enough that a causal tile's rows stop near their own position.
constexpr int64_t kTileRows = 12;

// How many of the M columns hold keys of a row: those whose position is at most the row's `limit`. Positions
// ascend along a block's keys (planning.py sorts a bucket's keys by position and pads after them; the caller
// checks it), so they are the first ones, found by a binary search, and no entry among them needs a test.
int64_t row_width(const float* key_pos, int64_t M, float limit) {
    return std::upper_bound(key_pos, key_pos + M, limit) - key_pos;
}

// A thread's buffers: the block's kᵀ panel (d × stride), its value rows (pointers, and copies where a value
// row is not whole vectors), a tile's scaled queries (kTileRows × d) and scores (kTileRows × stride), and its
// rows' widths.
template <typename Real>
struct Buffers {
    std::vector<Real> panel, values, queries, scores, scratch, extra_probs;
    std::vector<const Real*> panel_rows, value_rows, query_rows;
    std::vector<Real*> score_rows, out_rows;
    std::vector<int64_t> widths, extra_keys, extra_counts;

    bool allocate(int64_t d, int64_t dv, int64_t L, int64_t M, int64_t E, bool copy_values,
                  std::atomic<bool>& short_of_memory) {
        const int64_t stride = padded_stride<Real>(M), value_stride = whole_vectors<Real>(dv);
        return allocated(
            [&] {
                panel.assign(d * stride, Real(0));
                values.assign(copy_values ? M * value_stride : 0, Real(0));
                queries.assign(kTileRows * d, Real(0));
                scores.assign(kTileRows * padded_stride<Real>(M + E), Real(0));  // a row's keys, then its own
                scratch.assign(value_stride, Real(0));
                extra_probs.assign(kTileRows * E, Real(0));
                panel_rows.resize(d), value_rows.resize(M), query_rows.resize(kTileRows);
                score_rows.resize(kTileRows), out_rows.resize(kTileRows);
                widths.resize(L), extra_keys.resize(kTileRows * E), extra_counts.resize(kTileRows);
            },
            short_of_memory);
    }
};

// The probabilities of a tile's `count` rows in place of their scores (rows[i].width entries each), by
// β: 0 softmax, 1 (α = 2) or 2 (α = 1.5).
template <typename Real>
void probabilities(Row<Real>* rows, int64_t count, int beta) {
    const Real scale = beta == 2 ? Real(0.5) : Real(1);  // α − 1, and 1 for softmax
    Query<Real> queries[kTileRows];
    Real from[kTileRows], tau[kTileRows];
    for (int64_t i = 0; i < count; ++i) {
        queries[i] = {rows + i, rows[i].width > 0 ? 1 : 0, 0, scale};
        typename row_entmax::Vec<Real> high[2];
        const Real m = queries[i].largest(false, high);  // every entry of a row's width is a key: no mask
        queries[i].shift = m > kNoKey ? m : 0;        // a row without keys: any finite shift does
        if (beta != 0) from[i] = queries[i].start(high, beta);
    }
    if (beta == 0) {
        for (int64_t i = 0; i < count; ++i) queries[i].softmax(true);
        return;
    }
    for (int64_t first = 0; first < count; first += kGroup)
        row_entmax::solve(queries + first, static_cast<int>(std::min<int64_t>(kGroup, count - first)), beta,
                          from + first, tau + first);
    for (int64_t i = 0; i < count; ++i) queries[i].write_probabilities(tau[i], beta);
}

// A tile row's own keys (query `query`'s E entries of `extra`, −1 for none), compacted into `keys`, and
// their scores (the scaled query's dot products) from `scores` on; returns how many there are.
template <typename Real>
int64_t extra_scores(const Real* scaled, const Real* k, const int64_t* extra, int64_t query, int64_t E,
                     int64_t d, int64_t* keys, Real* scores) {
    int64_t count = 0;
    for (int64_t e = 0; e < E; ++e) {
        const int64_t key = extra[query * E + e];
        if (key < 0) continue;
        keys[count] = key;
        scores[count++] = vectors::dot<Real>(scaled, k + key * d, d);
    }
    return count;
}

// out[queries[b][r]] = Σ_c P_rc v[keys[b][c]] (+ Σ_e P_re v[extra_e]) for every row r with a key; other rows
// of `out` untouched. q (·, d), k (·, d), v (·, dv); queries (blocks, L), keys (blocks, M); key_pos (blocks,
// M) and limit (blocks, L), or both null when every entry is a key (and every row a query); extra (·, E) each
// query's own keys (−1 for none), or null. The queries are scaled as a tile copies them, the product the
// unfused path forms on the whole q.
template <typename Real>
void block_attention(const Real* q, const Real* k, const Real* v, const int64_t* queries, const int64_t* keys,
                     const float* key_pos, const float* limit, const int64_t* extra, int64_t E, int64_t blocks,
                     int64_t L, int64_t M, int64_t d, int64_t dv, Real scale, int beta, Real* out, int threads) {
    if (extra == nullptr) E = 0;
    const bool copy_values = dv != whole_vectors<Real>(dv);  // the products read B's rows as whole vectors
    const int64_t value_stride = whole_vectors<Real>(dv);
    std::atomic<bool> short_of_memory{false};
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        Buffers<Real> buf;
        const bool ready = buf.allocate(d, dv, L, M, E, copy_values, short_of_memory);
        // consecutive blocks to a thread (a static schedule), so the next block it prefetches is its own
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b) {
            if (!ready) continue;
            const int64_t* rows = queries + b * L;
            const int64_t* cols = keys + b * M;
            if (b + 1 < blocks) {  // its rows lie anywhere in memory: on their way while this block runs
                prefetch_rows(k, cols + M, M, d);
                prefetch_rows(v, cols + M, M, dv);
                prefetch_rows(q, rows + L, std::min(kTileRows, L), d);
            }
            const float* pos = key_pos != nullptr ? key_pos + b * M : nullptr;
            int64_t widest = 0;
            for (int64_t r = 0; r < L; ++r) {
                buf.widths[r] = pos != nullptr ? row_width(pos, M, limit[b * L + r]) : M;
                widest = std::max(widest, buf.widths[r]);
            }
            if (widest == 0 && E == 0) continue;  // padding rows only
            const int64_t panel_stride = padded_stride<Real>(widest);
            const int64_t stride = padded_stride<Real>(widest + E);  // a score row: its block's keys, its own
            pack_transposed(k, cols, widest, d, buf.panel.data(), panel_stride);
            for (int64_t t = 0; t < d; ++t) buf.panel_rows[t] = buf.panel.data() + t * panel_stride;
            for (int64_t c = 0; c < widest; ++c) {
                const Real* row = v + cols[c] * dv;
                if (copy_values) {
                    std::memcpy(&buf.values[c * value_stride], row, dv * sizeof(Real));
                    row = &buf.values[c * value_stride];
                }
                buf.value_rows[c] = row;
            }
            for (int64_t r0 = 0; r0 < L; r0 += kTileRows) {
                const int64_t count = std::min(kTileRows, L - r0);
                if (r0 + count < L) prefetch_rows(q, rows + r0 + count, std::min(kTileRows, L - r0 - count), d);
                const int64_t* width = buf.widths.data() + r0;
                const int64_t tile_width = *std::max_element(width, width + count);
                if (tile_width == 0 && E == 0) continue;
                Row<Real> tile[kTileRows];
                int64_t* own = buf.extra_counts.data();  // each row's own keys
                for (int64_t i = 0; i < count; ++i) {
                    Real* scores = buf.scores.data() + i * stride;
                    Real* scaled = buf.queries.data() + i * d;
                    const Real* query = q + rows[r0 + i] * d;
                    for (int64_t t = 0; t < d; ++t) scaled[t] = scale * query[t];
                    buf.query_rows[i] = scaled;
                    buf.score_rows[i] = scores;
                    own[i] = 0;
                }
                if (tile_width > 0)
                    product(buf.query_rows.data(), 1, count, buf.panel_rows.data(), d, tile_width,
                            buf.score_rows.data());
                for (int64_t i = 0; i < count; ++i) {
                    const bool padding = limit != nullptr && limit[b * L + r0 + i] < 0;
                    if (E > 0 && !padding)  // after the block's keys: the product wrote up to tile_width
                        own[i] = extra_scores(buf.query_rows[i], k, extra, rows[r0 + i], E, d,
                                              buf.extra_keys.data() + i * E, buf.score_rows[i] + width[i]);
                    tile[i].data = buf.score_rows[i], tile[i].width = width[i] + own[i];  // every entry a key
                    // a row without keys (padding among them) computes into scratch, its output row untouched
                    buf.out_rows[i] = tile[i].width > 0 ? out + rows[r0 + i] * dv : buf.scratch.data();
                }
                probabilities(tile, count, beta);
                for (int64_t i = 0; i < count; ++i) {
                    Real* probs = buf.extra_probs.data() + i * E;  // set aside: the zeros below may cover them
                    std::copy(buf.score_rows[i] + width[i], buf.score_rows[i] + width[i] + own[i], probs);
                    // the columns past a row's width are no keys of it, but the output product reads them
                    for (int64_t j = width[i]; j < tile_width; j += vectors::kWidth<Real>)
                        vectors::store<Real>(buf.score_rows[i] + j, vectors::Vec<Real>{},
                                             std::min(vectors::kWidth<Real>, tile_width - j));
                }
                if (tile_width > 0)
                    product(buf.score_rows.data(), 1, count, buf.value_rows.data(), tile_width, dv,
                            buf.out_rows.data());
                for (int64_t i = 0; i < count; ++i) {  // out_r += Σ_e P_re v_e (out_r is 0 where M = 0)
                    const Real* probs = buf.extra_probs.data() + i * E;
                    const int64_t* keys_of_row = buf.extra_keys.data() + i * E;
                    Real* to = buf.out_rows[i];
                    for (int64_t e = 0; e < own[i]; ++e) {
                        const Real p = probs[e];
                        const Real* value = v + keys_of_row[e] * dv;
                        for (int64_t t = 0; t < dv; ++t) to[t] += p * value[t];
                    }
                }
            }
        }
    }
    if (short_of_memory) throw std::bad_alloc();
}

}  // namespace

// Returns 0 once done, −1 when memory ran out (see vectors::guarded); beta as row_entmax.h (0: softmax).
#define EXPORT(SUFFIX, REAL)                                                                                      \
    extern "C" int block_attention_##SUFFIX(const REAL* q, const REAL* k, const REAL* v, const int64_t* queries,   \
                                            const int64_t* keys, const float* key_pos, const float* limit,         \
                                            const int64_t* extra, int64_t E, int64_t blocks, int64_t L, int64_t M, \
                                            int64_t d, int64_t dv, double scale, int64_t beta, REAL* out,          \
                                            int threads) {                                                        \
        return guarded([&] {                                                                                      \
            block_attention(q, k, v, queries, keys, key_pos, limit, extra, E, blocks, L, M, d, dv,                 \
                            static_cast<REAL>(scale), static_cast<int>(beta), out, threads);                      \
        });                                                                                                       \
    }

EXPORT(float, float)
EXPORT(double, double)
