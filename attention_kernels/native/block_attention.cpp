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
// A query may also attend up to E keys of its own beyond its block row (`band`, (N, E): the window band's
// keys that share no id with it, attention_kernels/bucketed/band_keys.py, −1 for none). Their scores are
// computed first, in position order (`band_scores`: a query's band keys are its neighbours', so they stay in
// the cache, where in bucket order each tile would fetch its own), into `band_x` (N, E), with kNotBand in the
// slots that hold no key; the block pass appends a row's band scores to its block scores, so its α-entmax
// covers both, and writes their probabilities back in place (it reads band_x alone, a query's 4·E bytes,
// where rows come in bucket order); `band_outputs` then adds Σ_e P_ie v_e to each output, in position order
// again.
// A query with no block row at all (no id, or no key holds its id) comes as a block of its own with no keys
// (M = 0).
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
    std::vector<Real> panel, values, queries, scores, scratch;
    std::vector<const Real*> panel_rows, value_rows, query_rows;
    std::vector<Real*> score_rows, out_rows;
    std::vector<int64_t> widths, own;

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
                panel_rows.resize(d), value_rows.resize(M), query_rows.resize(kTileRows);
                score_rows.resize(kTileRows), out_rows.resize(kTileRows);
                widths.resize(L), own.resize(kTileRows);
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

// Consecutive queries whose band passes share one dense tile: their band keys are mostly the same.
constexpr int64_t kBandRows = 16;

// A band score slot that holds no key: below kNoKey, in float and double alike.
constexpr double kNotBand = -3.4028234663852886e38;

// The span [first, first + span) of flat key rows that the window slots [0, W) of queries [i0, i0 + rows)
// hold (span 0: none). Where consecutive queries are consecutive positions of one group, it is at most
// rows + W − 1 keys; elsewhere (a group's end) it may be anything. A row's window keys ascend along its slots
// (key i − r + e of its group, −1 where none), so its first and last held slots are its least and greatest.
inline int64_t band_span(const int64_t* band, int64_t E, int64_t W, int64_t i0, int64_t rows, int64_t* first) {
    int64_t lo = INT64_MAX, hi = -1;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t* slot = band + (i0 + r) * E;
        int64_t e = 0, f = W - 1;
        while (e < W && slot[e] < 0) ++e;
        if (e == W) continue;  // no window key
        while (slot[f] < 0) --f;
        lo = std::min(lo, slot[e]), hi = std::max(hi, slot[f]);
    }
    *first = lo;
    return hi < 0 ? 0 : hi - lo + 1;
}

// Whether the band passes take a chunk's window slots as one dense tile (the rows × span products of the
// block kernel's register tiles, then the band's entries read from it) rather than a dot product per key:
// where the tile holds at most twice the band's entries (a band of W ≥ kBandRows / 2 keys a row, consecutive
// positions). A narrow band (the diagonal) takes the dot products, as do the global slots.
inline bool band_tile(int64_t W, int64_t span) { return 2 * W >= kBandRows && span <= kBandRows + W - 1; }

// A thread's buffers for the band passes: a chunk's kᵀ panel (or its probability tile), scaled queries,
// scores tile, value rows and output rows, and one query's slots.
template <typename Real>
struct BandBuffers {
    std::vector<Real> panel, queries, tile, values, outputs, x;
    std::vector<int64_t> cols, keys, slots;
    std::vector<const Real*> panel_rows, query_rows, value_rows;
    std::vector<Real*> tile_rows, out_rows;
    int64_t stride = 0, value_stride = 0;

    bool allocate(int64_t d, int64_t dv, int64_t E, int64_t W, std::atomic<bool>& short_of_memory) {
        const int64_t span = kBandRows + W - 1;
        stride = padded_stride<Real>(span), value_stride = whole_vectors<Real>(dv);
        return allocated(
            [&] {
                panel.assign(std::max(d, kBandRows) * stride, Real(0));  // kᵀ (d × stride), or probabilities
                queries.assign(kBandRows * d, Real(0));
                tile.assign(kBandRows * stride, Real(0));
                values.assign(span * value_stride, Real(0));
                outputs.assign(kBandRows * value_stride, Real(0));
                x.assign(E, Real(0)), cols.resize(span), keys.resize(E), slots.resize(E);
                panel_rows.resize(d), query_rows.resize(kBandRows), value_rows.resize(span);
                tile_rows.resize(kBandRows), out_rows.resize(kBandRows);
            },
            short_of_memory);
    }
};

// band_x[i][e] = scaled · k_{band[i][e]} for slots [from, to) of query i that hold a key: a dot product each.
template <typename Real>
void slot_scores(const Real* scaled, const Real* k, const int64_t* band, int64_t E, int64_t i, int64_t from,
                 int64_t to, int64_t d, BandBuffers<Real>& buf, Real* band_x) {
    int64_t count = 0;
    for (int64_t e = from; e < to; ++e)
        if (band[i * E + e] >= 0) buf.keys[count] = band[i * E + e], buf.slots[count++] = e;
    if (count == 0) return;
    vectors::scaled_dots<Real>(scaled, k, buf.keys.data(), count, d, Real(1), buf.x.data());
    for (int64_t c = 0; c < count; ++c) band_x[i * E + buf.slots[c]] = buf.x[c];
}

// band_x[i][e] = (scale · q_i) · k_{band[i][e]} for the N queries, kNotBand where band[i][e] < 0: kBandRows
// consecutive queries at a time, whose window slots [0, W) hold mostly the same keys (see band_tile); the
// global slots [W, E) a dot product each.
template <typename Real>
void band_scores(const Real* q, const Real* k, const int64_t* band, int64_t E, int64_t W, int64_t N, int64_t d,
                 Real scale, Real* band_x, int threads) {
    std::atomic<bool> short_of_memory{false};
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        BandBuffers<Real> buf;
        const bool ready = buf.allocate(d, 0, E, W, short_of_memory);
#pragma omp for schedule(static)
        for (int64_t i0 = 0; i0 < N; i0 += kBandRows) {
            if (!ready) continue;
            const int64_t rows = std::min(kBandRows, N - i0);
            std::fill(band_x + i0 * E, band_x + (i0 + rows) * E, Real(kNotBand));
            for (int64_t r = 0; r < rows; ++r) {
                Real* scaled = buf.queries.data() + r * d;
                for (int64_t t = 0; t < d; ++t) scaled[t] = scale * q[(i0 + r) * d + t];
                buf.query_rows[r] = scaled, buf.tile_rows[r] = buf.tile.data() + r * buf.stride;
            }
            int64_t first;
            const int64_t span = band_span(band, E, W, i0, rows, &first);
            const bool tiled = span > 0 && band_tile(W, span);
            if (tiled) {
                for (int64_t c = 0; c < span; ++c) buf.cols[c] = first + c;
                pack_transposed(k, buf.cols.data(), span, d, buf.panel.data(), buf.stride);
                for (int64_t t = 0; t < d; ++t) buf.panel_rows[t] = buf.panel.data() + t * buf.stride;
                product(buf.query_rows.data(), 1, rows, buf.panel_rows.data(), d, span, buf.tile_rows.data());
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t e = 0; e < W; ++e) {
                        const int64_t key = band[(i0 + r) * E + e];
                        if (key >= 0) band_x[(i0 + r) * E + e] = buf.tile_rows[r][key - first];
                    }
            }
            for (int64_t r = 0; r < rows; ++r)
                slot_scores(buf.query_rows[r], k, band, E, i0 + r, tiled ? W : 0, E, d, buf, band_x);
        }
    }
    if (short_of_memory) throw std::bad_alloc();
}

// out_i += Σ_e band_p[i][e] · v_{band[i][e]} over the N queries' band keys, kBandRows consecutive queries at
// a time (the window slots as a dense tile where band_tile says, else a key at a time).
template <typename Real>
void band_outputs(const Real* v, const int64_t* band, int64_t E, int64_t W, int64_t N, const Real* band_p,
                  int64_t dv, Real* out, int threads) {
    constexpr int64_t w = vectors::kWidth<Real>;
    std::atomic<bool> short_of_memory{false};
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        BandBuffers<Real> buf;
        const bool ready = buf.allocate(0, dv, E, W, short_of_memory);
        const bool copy_values = dv != buf.value_stride;  // the products read B's rows as whole vectors
#pragma omp for schedule(static)
        for (int64_t i0 = 0; i0 < N; i0 += kBandRows) {
            if (!ready) continue;
            const int64_t rows = std::min(kBandRows, N - i0);
            int64_t first;
            const int64_t span = band_span(band, E, W, i0, rows, &first);
            const bool tiled = span > 0 && band_tile(W, span);
            if (tiled) {  // the chunk's window probabilities as a dense rows × span tile, times its values
                for (int64_t r = 0; r < rows; ++r) {
                    Real* probs = buf.panel.data() + r * buf.stride;
                    std::fill(probs, probs + span, Real(0));
                    for (int64_t e = 0; e < W; ++e) {
                        const int64_t key = band[(i0 + r) * E + e];
                        if (key >= 0) probs[key - first] = band_p[(i0 + r) * E + e];
                    }
                    buf.tile_rows[r] = probs, buf.out_rows[r] = buf.outputs.data() + r * buf.value_stride;
                }
                for (int64_t c = 0; c < span; ++c) {
                    const Real* row = v + (first + c) * dv;
                    if (copy_values) {
                        std::memcpy(&buf.values[c * buf.value_stride], row, dv * sizeof(Real));
                        row = &buf.values[c * buf.value_stride];
                    }
                    buf.value_rows[c] = row;
                }
                product(buf.tile_rows.data(), 1, rows, buf.value_rows.data(), span, dv, buf.out_rows.data());
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t t = 0; t < dv; ++t) out[(i0 + r) * dv + t] += buf.out_rows[r][t];
            }
            for (int64_t i = i0; i < i0 + rows; ++i) {  // the other slots: a vector of columns at a time
                for (int64_t t = 0; t < dv; t += w) {
                    const int64_t valid = std::min(w, dv - t);
                    vectors::Vec<Real> sum = vectors::load<Real>(out + i * dv + t, valid);
                    for (int64_t e = tiled ? W : 0; e < E; ++e) {
                        const int64_t key = band[i * E + e];
                        if (key >= 0) sum += band_p[i * E + e] * vectors::load<Real>(v + key * dv + t, valid);
                    }
                    vectors::store<Real>(out + i * dv + t, sum, valid);
                }
            }
        }
    }
    if (short_of_memory) throw std::bad_alloc();
}

// out[queries[b][r]] = Σ_c P_rc v[keys[b][c]] for every row r with a key; other rows of `out` untouched.
// q (·, d), k (·, d), v (·, dv); queries (blocks, L), keys (blocks, M); key_pos (blocks, M) and limit
// (blocks, L), or both null when every entry is a key (and every row a query). With band_x (N, E) (null:
// none), each query's band scores (band_scores, kNotBand for no key) join its row, and their probabilities
// replace them in place; band_outputs adds their outputs. The queries are scaled
// as a tile copies them, the product the unfused path forms on the whole q.
template <typename Real>
void block_attention(const Real* q, const Real* k, const Real* v, const int64_t* queries, const int64_t* keys,
                     const float* key_pos, const float* limit, int64_t E, Real* band_x, int64_t blocks, int64_t L,
                     int64_t M, int64_t d, int64_t dv, Real scale, int beta, Real* out, int threads) {
    if (band_x == nullptr) E = 0;
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
                if (r0 + count < L) {
                    prefetch_rows(q, rows + r0 + count, std::min(kTileRows, L - r0 - count), d);
                    if (E > 0) prefetch_rows(band_x, rows + r0 + count, std::min(kTileRows, L - r0 - count), E);
                }
                const int64_t* width = buf.widths.data() + r0;
                const int64_t tile_width = *std::max_element(width, width + count);
                if (tile_width == 0 && E == 0) continue;
                Row<Real> tile[kTileRows];
                int64_t* own = buf.own.data();  // each row's band keys
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
                    const int64_t query = rows[r0 + i];
                    for (int64_t e = 0; E > 0 && !padding && e < E; ++e)  // after the block's keys
                        if (band_x[query * E + e] > kNoKey) buf.score_rows[i][width[i] + own[i]++] = band_x[query * E + e];
                    tile[i].data = buf.score_rows[i], tile[i].width = width[i] + own[i];  // every entry a key
                    // a row without keys (padding among them) computes into scratch, its output row untouched
                    buf.out_rows[i] = tile[i].width > 0 ? out + rows[r0 + i] * dv : buf.scratch.data();
                }
                probabilities(tile, count, beta);
                for (int64_t i = 0; i < count; ++i) {
                    // the row's band probabilities back to its slots, before the zeros below may cover them
                    const int64_t query = rows[r0 + i];
                    const Real* probs = buf.score_rows[i] + width[i];
                    for (int64_t e = 0, c = 0; c < own[i]; ++e)
                        if (band_x[query * E + e] > kNoKey) band_x[query * E + e] = probs[c++];
                    // the columns past a row's width are no keys of it, but the output product reads them
                    for (int64_t j = width[i]; j < tile_width; j += vectors::kWidth<Real>)
                        vectors::store<Real>(buf.score_rows[i] + j, vectors::Vec<Real>{},
                                             std::min(vectors::kWidth<Real>, tile_width - j));
                }
                if (tile_width > 0)
                    product(buf.score_rows.data(), 1, count, buf.value_rows.data(), tile_width, dv,
                            buf.out_rows.data());
            }
        }
    }
    if (short_of_memory) throw std::bad_alloc();
}

}  // namespace

// Each returns 0 once done, −1 when memory ran out (see vectors::guarded); beta as row_entmax.h (0: softmax).
#define EXPORT(SUFFIX, REAL)                                                                                      \
    extern "C" int block_attention_##SUFFIX(const REAL* q, const REAL* k, const REAL* v, const int64_t* queries,   \
                                            const int64_t* keys, const float* key_pos, const float* limit,         \
                                            int64_t E, REAL* band_x, int64_t blocks, int64_t L, int64_t M,         \
                                            int64_t d, int64_t dv, double scale, int64_t beta, REAL* out,          \
                                            int threads) {                                                        \
        return guarded([&] {                                                                                      \
            block_attention(q, k, v, queries, keys, key_pos, limit, E, band_x, blocks, L, M, d, dv,                \
                            static_cast<REAL>(scale), static_cast<int>(beta), out, threads);                      \
        });                                                                                                       \
    }                                                                                                             \
    extern "C" int band_scores_##SUFFIX(const REAL* q, const REAL* k, const int64_t* band, int64_t E, int64_t W,   \
                                        int64_t N, int64_t d, double scale, REAL* band_x, int threads) {          \
        return guarded([&] { band_scores(q, k, band, E, W, N, d, static_cast<REAL>(scale), band_x, threads); }); \
    }                                                                                                             \
    extern "C" int band_outputs_##SUFFIX(const REAL* v, const int64_t* band, int64_t E, int64_t W, int64_t N,      \
                                         const REAL* band_p, int64_t dv, REAL* out, int threads) {                 \
        return guarded([&] { band_outputs(v, band, E, W, N, band_p, dv, out, threads); });                      \
    }

EXPORT(float, float)
EXPORT(double, double)
