// Exact α-entmax attention (α = 2: β = 1; α = 1.5: β = 2) that scores every allowed pair and spends the
// entmax on the few keys that can carry weight.
//
// For a query with scores s_j = scale · q·k_j over its keys and m = max_j s_j, write x_j = (s_j − m)/β ≤ 0
// ((α − 1)(s_j − m), since α − 1 = 1/β). The threshold τ with Σ_j [x_j − τ]₊^β = 1 lies in [−1, 0): the
// maximum alone gives [0 − τ]₊^β ≤ 1. So every key with s_j ≤ m − β has p_j = 0 exactly, whatever the rest
// of the row. On a trained model's rows that leaves a few dozen to a few hundred keys of thousands.
//
// Forward, per tile of kTile queries of one (batch, head) group: the scores against a chunk of kChunk keys at
// a time (the register-tiled product of vectors.h, kᵀ packed once per group, the chunk holding the tile's
// diagonal first). Per row a running floor stays at or below its threshold m + β·τ in score units: the
// threshold of any subset of a row is a lower bound of the row's, and the floor is that of the row's lane
// maxima so far (Tile::raise), then of its kept entries once they pile up (Tile::tighten). One pass over the
// chunk's row updates the lane maxima and gives the chunk's own maximum; where that lies above the floor, a
// second keeps the entries above it (`filter`). A chunk is not scored at all when an upper bound on its
// scores, scale·q·c + ‖scale·q‖·r for the centroid c and radius r of its keys, lies below every row's floor
// (inputs whose support is local; a trained model's scattered supports leave none). Then, over the kept
// entries only: τ by the search of exact_entmax.cpp (Newton steps from below on a norm, each checked for
// being the polynomial root on its support), p_j = (x_j − τ)₊^β / Σ, o = Σ p_j v_j. Per query the forward
// returns m and τ, all the backward needs.
//
// Approximate mode scans the indexer's low-rank rows (q_index, k_index) the same way, keeping entries down to
// the floor less the margin, takes each query's predicted set Ŝ from them (Index, `predicted`) and runs the
// entmax above with the exact scores over Ŝ.
//
// Backward, with g_j = p_j^{2−α} ((x_j − τ)^{β−1} up to the normaliser) and dp_j = do·v_j, the scores'
// gradient is ds_j = g_j (dp_j − Σ g dp / Σ g) on the support and 0 elsewhere; dq = scale Σ ds_j k_j,
// dk_j += scale ds_j q, dv_j += p_j do. The scores are computed again (chunks that cannot reach the exact
// threshold m + β·τ skipped), so nothing n × m is stored. dk and dv gather every query's share: each thread
// adds into its own rows of a group, summed in thread order after the group, so the result depends on the
// thread count but not on the schedule.
//
// The scores are sums over the head dim in order (vectors.h), the same in the backward as in the forward, so
// both see the same support. The reference is dense α-entmax attention (attention_kernels/indexed/scanned.py).

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "coded_product.h"
#include "vectors.h"

namespace {

using vectors::allocated, vectors::dot, vectors::guarded, vectors::kWidth, vectors::largest, vectors::product,
    vectors::total, vectors::Vec, vectors::whole_vectors;

constexpr int64_t kTile = 48;    // queries per tile: 8 register tiles of 6 rows
constexpr int64_t kChunk = 128;  // keys per chunk: a tile's scores (24 KiB in float) stay in the first cache
constexpr int kMaxSteps = 100;   // of the threshold search, as exact_entmax.cpp
constexpr int kFloorSteps = 3;   // Newton steps of a row's running floor (Tile::raise)
constexpr int64_t kTrigger = 64; // kept entries of a row that first raise its floor to their threshold

// The rounding of s − m around a threshold m + β·τ: floors are lowered by it, so that no entry with x > τ is
// left out.
template <typename Real>
Real rounding(Real m, int beta) {
    return 4 * std::numeric_limits<Real>::epsilon() * (std::abs(m) + Real(beta));
}

// The bits of the lanes of a comparison's result (all bits set in a lane that holds): lane i at bit i.
template <typename Real>
uint32_t lane_bits(const Vec<Real>& a, const Vec<Real>& b) {
#ifdef __AVX512F__
    if constexpr (sizeof(Real) == 4) {
        return _mm512_cmp_ps_mask(reinterpret_cast<const __m512&>(a), reinterpret_cast<const __m512&>(b), _CMP_GT_OQ);
    } else {
        return _mm512_cmp_pd_mask(reinterpret_cast<const __m512d&>(a), reinterpret_cast<const __m512d&>(b), _CMP_GT_OQ);
    }
#elif defined(__AVX2__)
    if constexpr (sizeof(Real) == 4) {
        return _mm256_movemask_ps(_mm256_cmp_ps(reinterpret_cast<const __m256&>(a), reinterpret_cast<const __m256&>(b), _CMP_GT_OQ));
    } else {
        return _mm256_movemask_pd(_mm256_cmp_pd(reinterpret_cast<const __m256d&>(a), reinterpret_cast<const __m256d&>(b), _CMP_GT_OQ));
    }
#else
    uint32_t bits = 0;
    for (int lane = 0; lane < kWidth<Real>; ++lane) bits |= uint32_t(a[lane] > b[lane]) << lane;
    return bits;
#endif
}

// One call's inputs, per (batch·head) group g: q (G, n, d), k (G, m, d), v (G, m, dv); key_valid (G, m) or
// null (every key); causal: query i sees keys j ≤ i.
template <typename Real>
struct Problem {
    const Real *q, *k, *v;
    const uint8_t* key_valid;
    int64_t G, n, m, d, dv;
    Real scale;
    int beta;
    bool causal;
    bool coded = false;  // scores from 7-bit codes (coded_product.h): the approximate mode's low-rank scan in float

    int64_t chunks() const { return (m + kChunk - 1) / kChunk; }
    // Keys [0, keys) that a tile's rows from `first` may see.
    int64_t keys(int64_t first, int64_t rows) const { return causal ? std::min(m, first + rows) : m; }
};

// Per group and chunk: kᵀ of the chunk's keys (d × kChunk, zero past m; a chunk's own block, as the product
// reads it: rows of kᵀ over all m keys lie 4·m bytes apart, and at m = 4096 every row of a chunk fell in the
// same set of the first-level cache), and per chunk the centroid of its valid keys, its norm, their
// radius around it and whether it holds any. Coded problems: also per chunk the keys' codes (quads × kChunk ×
// 4 bytes), corrections and steps (coded_product.h; zero past m).
template <typename Real>
struct Keys {
    std::vector<Real> panel, centroid, center_norm, radius;
    std::vector<uint8_t> any, whole;  // a valid key; every key valid
    std::vector<int8_t> codes;
    std::vector<int32_t> correction;
    std::vector<float> step;

    void build(const Problem<Real>& p, int threads) {
        const int64_t chunks = p.chunks(), d = p.d;
        if constexpr (std::is_same_v<Real, float>)
            if (p.coded) code(p, threads);
        panel.assign(p.G * chunks * d * kChunk, Real(0));
        centroid.assign(p.G * chunks * d, Real(0));
        radius.assign(p.G * chunks, Real(0)), center_norm.assign(p.G * chunks, Real(0));
        any.assign(p.G * chunks, 0), whole.assign(p.G * chunks, 0);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int64_t gc = 0; gc < p.G * chunks; ++gc) {
            const int64_t g = gc / chunks, c0 = (gc % chunks) * kChunk, c1 = std::min(p.m, c0 + kChunk);
            const Real* k = p.k + g * p.m * d;
            Real* block = panel.data() + gc * d * kChunk;
            Real* center = centroid.data() + gc * d;
            int64_t count = 0;
            for (int64_t j = c0; j < c1; ++j) {
                for (int64_t t = 0; t < d; ++t) block[t * kChunk + j - c0] = k[j * d + t];
                if (p.key_valid != nullptr && !p.key_valid[g * p.m + j]) continue;
                for (int64_t t = 0; t < d; ++t) center[t] += k[j * d + t];
                ++count;
            }
            any[gc] = count > 0, whole[gc] = count == c1 - c0;
            if (count == 0) continue;
            Real norm = 0;
            for (int64_t t = 0; t < d; ++t) center[t] /= Real(count), norm += center[t] * center[t];
            center_norm[gc] = std::sqrt(norm);
            Real far = 0;
            for (int64_t j = c0; j < c1; ++j) {
                if (p.key_valid != nullptr && !p.key_valid[g * p.m + j]) continue;
                Real sq = 0;
                for (int64_t t = 0; t < d; ++t) sq += (k[j * d + t] - center[t]) * (k[j * d + t] - center[t]);
                far = std::max(far, sq);
            }
            radius[gc] = std::sqrt(far);
        }
    }

    // The coded keys, each on its own grid (as quantised.py): codes, corrections and steps per chunk.
    void code(const Problem<float>& p, int threads) {
        const int64_t chunks = p.chunks(), quads = coded::quads(p.d);
        codes.assign(p.G * chunks * quads * kChunk * 4, 0);
        correction.assign(p.G * chunks * kChunk, 0), step.assign(p.G * chunks * kChunk, 0);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int64_t g = 0; g < p.G; ++g)
            for (int64_t j = 0; j < p.m; ++j) {
                const int64_t gc = g * chunks + j / kChunk, at = gc * kChunk + j % kChunk;
                const float* k = p.k + (g * p.m + j) * p.d;
                int8_t* block = codes.data() + gc * quads * kChunk * 4 + (j % kChunk) * 4;
                const float key_step = coded::step_of(k, p.d);
                int32_t sum = 0;
                for (int64_t t = 0; t < p.d; ++t) {
                    const int code = coded::code_of(k[t], key_step);
                    block[(t / 4) * kChunk * 4 + t % 4] = int8_t(code), sum += code;
                }
                correction[at] = coded::kOffset * sum, step[at] = key_step;
            }
    }
};

// The `valid` (≤ kWidth) values from `from` on, `rest` in the other lanes: a whole vector in one load (a copy
// of a size known only at run time goes through the stack).
template <typename Real>
Vec<Real> lanes_or(const Real* from, int64_t valid, Real rest) {
    Vec<Real> v = Vec<Real>{} + rest;
    if (valid == kWidth<Real>) {
        std::memcpy(&v, from, sizeof v);
    } else {
        std::memcpy(&v, from, valid * sizeof(Real));
    }
    return v;
}

#if defined(__AVX2__) && !defined(__AVX512F__)
// Per mask of 8 lanes, the indices of its set lanes in order, a byte each (the rest 0): AVX2's stand-in for
// AVX-512's compress, a permutation that moves the kept lanes to the front.
constexpr std::array<uint64_t, 256> left_packs() {
    std::array<uint64_t, 256> table{};
    for (uint32_t mask = 0; mask < 256; ++mask) {
        int at = 0;
        for (uint32_t lane = 0; lane < 8; ++lane)
            if (mask >> lane & 1u) table[mask] |= uint64_t(lane) << (8 * at++);
    }
    return table;
}
constexpr std::array<uint64_t, 256> kLeftPack = left_packs();
#endif

// The entries of s (count of them) above `floor`, as (s − shift)·factor into `to` and their keys (keys[i], or
// first + i where keys is null) into `to_key`, in order; returns how many. `to` and `to_key` may be s and keys
// themselves (each write lands at or before what it replaces) and must have room for a vector past the last
// entry written. With AVX-512 (float) every vector is compressed in registers and stored whole, with no branch
// at all: hits are scattered at random, so a branch per entry, or even per vector, is mispredicted often (a
// test for an empty vector cost 10–20 % on a trained model's rows). AVX2 (float) does the same with a
// permutation from a table (kLeftPack): on a trained model's rows the branch per kept lane it replaces was
// half of the forward's time outside the products.
template <typename Real>
int64_t filter(const Real* s, const int32_t* keys, int32_t first, int64_t count, Real floor, Real shift,
               Real factor, Real* to, int32_t* to_key) {
    constexpr int64_t w = kWidth<Real>;
    const Vec<Real> bar = Vec<Real>{} + floor;
    const Real inf = std::numeric_limits<Real>::infinity();
    int64_t n = 0;
    for (int64_t j = 0; j < count; j += w) {
        const int64_t valid = std::min(w, count - j);
        const Vec<Real> v = lanes_or(s + j, valid, -inf);
        const uint32_t bits = lane_bits<Real>(v, bar);
#ifdef __AVX512F__
        if constexpr (sizeof(Real) == 4) {
            const __m512i index = keys != nullptr
                                      ? _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << valid) - 1), keys + j)
                                      : _mm512_add_epi32(_mm512_set1_epi32(first + int32_t(j)),
                                                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
            const Vec<Real> x = (v - shift) * factor;
            _mm512_storeu_ps(to + n, _mm512_maskz_compress_ps(static_cast<__mmask16>(bits), reinterpret_cast<const __m512&>(x)));
            _mm512_storeu_si512(to_key + n, _mm512_maskz_compress_epi32(static_cast<__mmask16>(bits), index));
            n += __builtin_popcount(bits);
            continue;
        }
#elif defined(__AVX2__)
        if constexpr (sizeof(Real) == 4) {
            const __m256i order = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(kLeftPack[bits])));
            const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            const __m256i index =
                keys != nullptr
                    ? _mm256_maskload_epi32(keys + j, _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(valid)), lanes))
                    : _mm256_add_epi32(_mm256_set1_epi32(first + int32_t(j)), lanes);
            const Vec<Real> x = (v - shift) * factor;
            _mm256_storeu_ps(to + n, _mm256_permutevar8x32_ps(reinterpret_cast<const __m256&>(x), order));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(to_key + n), _mm256_permutevar8x32_epi32(index, order));
            n += __builtin_popcount(bits);
            continue;
        }
#endif
        for (uint32_t left = bits; left != 0; left &= left - 1) {
            const int lane = __builtin_ctz(left);
            to[n] = (v[lane] - shift) * factor;
            to_key[n] = keys != nullptr ? keys[j + lane] : first + int32_t(j + lane);
            ++n;
        }
    }
    return n;
}

// A row's entries that may carry weight: x_j = (s_j − m)/β > −1 in `x` (its length rounded up to whole
// vectors, −∞ in the rest) and their keys; after `select`, only the support, with p_j in `x`.
template <typename Real>
struct Support {
    std::vector<Real> x;
    std::vector<int32_t> key;
    int64_t size = 0;

    void allocate(int64_t m) { x.assign(whole_vectors<Real>(m) + kWidth<Real>, 0), key.assign(m + kWidth<Real>, 0); }

    // From kept scores s (count of them, keys beside): those above `floor`, as (s − shift)/β.
    void gather(const Real* s, const int32_t* keys, int64_t count, Real shift, Real floor, int beta) {
        size = filter(s, keys, 0, count, floor, shift, Real(1) / Real(beta), x.data(), key.data());  // 1/β exact
        for (int64_t i = size; i < whole_vectors<Real>(size); ++i) x[i] = -std::numeric_limits<Real>::infinity();
    }

    // τ with Σ [x − τ]₊^β = 1 (x ≤ 0 with max 0, so τ in [−1, 0)), from τ = −1: the search of
    // exact_entmax.cpp's `solve` on one row. Each pass gives Σ (x − τ)₊, Σ (x − τ)₊², |{x > τ}| and checks
    // the previous pass's candidate τ′ (the polynomial root on its support): τ′ is τ* when {x > τ′} kept
    // that support's size. Otherwise a Newton step from below (never past τ*).
    Real threshold(int beta) const {
        constexpr int64_t w = kWidth<Real>;
        Real tau = -1, candidate = std::numeric_limits<Real>::infinity(), support = -1;
        for (int step = 0; step < kMaxSteps; ++step) {
            Vec<Real> a = {}, b = {}, c = {}, e = {};
            for (int64_t j = 0; j < size; j += w) {
                Vec<Real> xs;
                std::memcpy(&xs, x.data() + j, sizeof xs);
                e += xs > candidate ? Real(1) : Real(0);
                Vec<Real> y = xs - tau;
                y = y > 0 ? y : 0;
                a += y, b += y * y, c += y > 0 ? Real(1) : Real(0);
            }
            const Real s1 = total<Real>(a), s2 = total<Real>(b), k = total<Real>(c);
            if (total<Real>(e) == support) return candidate;
            if (beta == 1) {
                tau = candidate = tau + (s1 - 1) / (k > 1 ? k : 1);
            } else {
                const Real disc = s1 * s1 - k * (s2 - 1), root = disc > 0 ? std::sqrt(disc) : 0;
                candidate = tau + (s2 - 1) / (s1 + root == 0 ? 1 : s1 + root);
                tau += (s2 - std::sqrt(s2)) / (s1 == 0 ? 1 : s1);
            }
            support = k;
        }
        return tau;
    }

    // Keeps the entries with x > τ, with p = [x − τ]^β / Σ in `x` (the support, in its order).
    void select(Real tau, int beta) {
        int64_t kept = 0;
        Real sum = 0;
        for (int64_t i = 0; i < size; ++i) {
            if (!(x[i] > tau)) continue;
            const Real y = x[i] - tau;
            x[kept] = beta == 2 ? y * y : y, key[kept] = key[i], sum += x[kept], ++kept;
        }
        size = kept;
        if (sum > 0)
            for (int64_t i = 0; i < size; ++i) x[i] /= sum;
    }
};

// o = Σ_e weight_e · y[key_e] over `count` entries, rows of y of `dim` Reals from `base`: in registers, dim
// of NV vectors at most.
template <typename Real, int NV>
void weighted_rows(const Real* weight, const int32_t* key, int64_t count, const Real* base, int64_t dim, Real* o) {
    constexpr int64_t w = kWidth<Real>;
    Vec<Real> acc[NV] = {};
    for (int64_t e = 0; e < count; ++e) {
        const Real* y = base + int64_t(key[e]) * dim;
        for (int u = 0; u < NV; ++u) acc[u] += weight[e] * vectors::load<Real>(y + u * w, std::min(w, dim - u * w));
    }
    for (int u = 0; u < NV; ++u) vectors::store<Real>(o + u * w, acc[u], std::min(w, dim - u * w));
}

template <typename Real>
void weighted_sum(const Real* weight, const int32_t* key, int64_t count, const Real* base, int64_t dim, Real* o) {
    switch ((dim + kWidth<Real> - 1) / kWidth<Real>) {
        case 1: return weighted_rows<Real, 1>(weight, key, count, base, dim, o);
        case 2: return weighted_rows<Real, 2>(weight, key, count, base, dim, o);
        case 3: return weighted_rows<Real, 3>(weight, key, count, base, dim, o);
        case 4: return weighted_rows<Real, 4>(weight, key, count, base, dim, o);
        default: break;
    }
    std::fill(o, o + dim, Real(0));
    for (int64_t e = 0; e < count; ++e) {
        const Real* y = base + int64_t(key[e]) * dim;
        for (int64_t c = 0; c < dim; ++c) o[c] += weight[e] * y[c];
    }
}

// A thread's work space for one tile: its rows of scale·q, the chunk's scores, and per row the kept entries
// (the scores above its running floor, and their keys).
template <typename Real>
struct Tile {
    std::vector<Real> qs, norm, scores, best, floor, kept;
    std::vector<Real> bar;   // a scan's floors less its margin, per row (what entries must pass)
    std::vector<Real> high;  // per row two vectors' lanes of running maxima (over even and odd vectors of keys)
    std::vector<int32_t> kept_key;
    std::vector<int64_t> kept_count, trigger;
    std::vector<const Real*> a, b;
    std::vector<Real*> c;
    std::vector<uint8_t> codes;       // coded problems: per row its query codes u (quads · 4 bytes)
    std::vector<const uint8_t*> code_rows;
    std::vector<float> factor;        // and scale·step_q
    int64_t room = 0;  // kept entries a row may hold: each key once
    Support<Real> support, exact;  // a row's gathered entries; approximate mode: the exact scores of Ŝ
    std::vector<int64_t> order;    // approximate mode: the cap's ranking

    void allocate(const Problem<Real>& p) {
        const int64_t width = whole_vectors<Real>(kChunk);
        room = p.m + kWidth<Real>;  // every key once, and a vector's slack (filter)
        qs.assign(kTile * p.d, 0), norm.assign(kTile, 0), scores.assign(kTile * width, 0), best.assign(kTile, 0);
        floor.assign(kTile, 0), bar.assign(kTile, 0), high.assign(2 * kTile * kWidth<Real>, 0);
        kept.resize(kTile * room), kept_key.resize(kTile * room), kept_count.assign(kTile, 0), trigger.assign(kTile, kTrigger);
        a.resize(kTile), b.resize(p.d), c.resize(kTile);
        for (int64_t r = 0; r < kTile; ++r) a[r] = qs.data() + r * p.d, c[r] = scores.data() + r * width;
        support.allocate(p.m), exact.allocate(p.m);
        if (!p.coded) return;
        const int64_t row = coded::quads(p.d) * 4;
        codes.assign(kTile * row, coded::kOffset), code_rows.resize(kTile), factor.assign(kTile, 0);
        for (int64_t r = 0; r < kTile; ++r) code_rows[r] = codes.data() + r * row;
    }

    // The tile's rows [first, first + rows) of group g: scale·q and its norm (coded: its codes and factor); no
    // entry kept yet.
    void start(const Problem<Real>& p, int64_t g, int64_t first, int64_t rows) {
        for (int64_t r = 0; r < rows; ++r) {
            const Real* q = p.q + (g * p.n + first + r) * p.d;
            if constexpr (std::is_same_v<Real, float>) {
                if (p.coded) {
                    const float step = coded::step_of(q, p.d);
                    uint8_t* u = codes.data() + r * coded::quads(p.d) * 4;
                    for (int64_t t = 0; t < p.d; ++t) u[t] = uint8_t(coded::code_of(q[t], step) + coded::kOffset);
                    factor[r] = p.scale * step;
                }
            }
            Real* to = qs.data() + r * p.d;
            Real sq = 0;
            for (int64_t t = 0; t < p.d; ++t) to[t] = p.scale * q[t], sq += to[t] * to[t];
            norm[r] = std::sqrt(sq);
            best[r] = floor[r] = -std::numeric_limits<Real>::infinity();
            std::fill_n(high.data() + 2 * r * kWidth<Real>, 2 * kWidth<Real>, -std::numeric_limits<Real>::infinity());
            kept_count[r] = 0, trigger[r] = kTrigger;
        }
    }

    // Whether chunk `chunk` may hold, for some row, a score above floor_r (per row: the running maximum − β
    // in the forward, the exact threshold in the backward): its bound scale·q·c + ‖scale·q‖·r, with a margin
    // for the rounding of both sides.
    bool reaches(const Problem<Real>& p, const Keys<Real>& keys, int64_t g, int64_t chunk, int64_t rows,
                 const Real* floor) const {
        const int64_t gc = g * p.chunks() + chunk;
        if (!keys.any[gc]) return false;
        const Real* center = keys.centroid.data() + gc * p.d;
        const Real slack = 64 * std::numeric_limits<Real>::epsilon() * Real(p.d);
        for (int64_t r = 0; r < rows; ++r) {
            const Real bound = dot(qs.data() + r * p.d, center, p.d) + norm[r] * keys.radius[gc];
            if (bound + slack * norm[r] * (keys.center_norm[gc] + keys.radius[gc]) > floor[r]) return true;
        }
        return false;
    }

    // The scores of rows [0, rows) against keys [c0, c1) of group g, in `scores` (invalid keys and, causal,
    // later keys −∞ in the row's first `c1 − c0` entries).
    void score(const Problem<Real>& p, const Keys<Real>& keys, int64_t g, int64_t first, int64_t rows,
               int64_t c0, int64_t c1) {
        const int64_t gc = g * p.chunks() + c0 / kChunk;
        bool done = false;
        if constexpr (std::is_same_v<Real, float>) {
            if (p.coded) {
                const int64_t quads = coded::quads(p.d);
                coded::product(code_rows.data(), factor.data(), rows, keys.codes.data() + gc * quads * kChunk * 4,
                               kChunk, quads / 2, keys.correction.data() + gc * kChunk, keys.step.data() + gc * kChunk,
                               c1 - c0, c.data());
                done = true;
            }
        }
        if (!done) {
            const Real* block = keys.panel.data() + gc * p.d * kChunk;
            for (int64_t t = 0; t < p.d; ++t) b[t] = block + t * kChunk;
            product(a.data(), 1, rows, b.data(), p.d, c1 - c0, c.data());
        }
        const Real inf = std::numeric_limits<Real>::infinity();
        const bool whole = keys.whole[g * p.chunks() + c0 / kChunk];
        for (int64_t r = 0; r < rows; ++r) {
            Real* row = c[r];
            if (!whole)
                for (int64_t j = c0; j < c1; ++j)
                    if (!p.key_valid[g * p.m + j]) row[j - c0] = -inf;
            if (p.causal)
                for (int64_t j = std::max(c0, first + r + 1); j < c1; ++j) row[j - c0] = -inf;
        }
    }

    // Row r's entries of the chunk (`width` of them, from key c0 on) above `floor`, appended to its kept ones.
    void keep_above(int64_t r, int64_t c0, int64_t width, Real floor) {
        const int64_t at = r * room + kept_count[r];
        kept_count[r] += filter(c[r], static_cast<const int32_t*>(nullptr), int32_t(c0), width, floor, Real(0), Real(1),
                                kept.data() + at, kept_key.data() + at);
    }

    // Row r's running maximum and floor after its first `width` entries of the chunk. The floor is m + β·τ_T
    // for the row's lane maxima T (each lane of the two vectors `high` the largest of its own keys, so T is
    // 2·kWidth distinct entries): a subset's threshold, τ_T ≤ τ, and a few Newton steps from −1 on it stay
    // below τ_T (convexity, as exact_entmax.cpp's start). Where many keys lie near the maximum (flat rows)
    // this floor sits well above m − β, and far fewer entries are kept.
    // Returns the chunk's own largest entry (the caller skips a chunk with none above the floor).
    Real raise(int64_t r, int64_t width, int beta) {
        constexpr int64_t w = kWidth<Real>;
        const Real inf = std::numeric_limits<Real>::infinity();
        Real* lanes = high.data() + 2 * r * w;
        Vec<Real> even = vectors::load<Real>(lanes), odd = vectors::load<Real>(lanes + w);
        Vec<Real> own = Vec<Real>{} - inf;
        int64_t j = 0;
        for (; j + 2 * w <= width; j += 2 * w) {
            const Vec<Real> a = lanes_or(c[r] + j, w, -inf), b = lanes_or(c[r] + j + w, w, -inf);
            even = a > even ? a : even, odd = b > odd ? b : odd;
            own = a > own ? a : own, own = b > own ? b : own;
        }
        for (; j < width; j += w) {
            const Vec<Real> a = lanes_or(c[r] + j, std::min(w, width - j), -inf);
            even = a > even ? a : even, own = a > own ? a : own;
        }
        std::memcpy(lanes, &even, sizeof even), std::memcpy(lanes + w, &odd, sizeof odd);
        const Real top = largest<Real>(own);
        const Real m = largest<Real>(even > odd ? even : odd);
        if (m == -inf || m == best[r]) return top;  // the floor moves with the maximum only (a lower one is valid)
        const Real inverse = Real(1) / Real(beta);
        Real tau = -1;
        for (int step = 0; step < kFloorSteps; ++step) {
            Vec<Real> a[2], b[2], k[2];
            for (int half = 0; half < 2; ++half) {
                const Vec<Real> y = ((half == 0 ? even : odd) - m) * inverse - tau;  // −∞ in lanes without a key
                a[half] = y > 0 ? y : 0, b[half] = a[half] * a[half], k[half] = y > 0 ? Real(1) : Real(0);
            }
            const Real s1 = total<Real>(a[0] + a[1]), s2 = total<Real>(b[0] + b[1]);
            tau += beta == 1 ? (s1 - 1) / total<Real>(k[0] + k[1]) : (s2 - std::sqrt(s2)) / s1;
        }
        // minus the rounding of s − m, so that no entry with x > τ is left out
        best[r] = m, floor[r] = std::max(floor[r], m + Real(beta) * tau - rounding(m, beta));  // both valid
        return top;
    }

    // Where row r kept `trigger` entries or more: its floor raised to the threshold of those entries (a
    // subset's, so still ≤ the row's) and the entries below it dropped; the next trigger twice what is left.
    // Rows with many keys near their maximum (a flat row: the lane maxima's floor is low) keep a short list.
    void tighten(int64_t r, int beta, Real below) {
        if (kept_count[r] < trigger[r]) return;
        gather(r, best[r], floor[r], beta);
        floor[r] = std::max(floor[r], best[r] + Real(beta) * support.threshold(beta) - rounding(best[r], beta));
        Real* s = kept.data() + r * room;
        int32_t* key = kept_key.data() + r * room;
        const int64_t left = filter(s, key, 0, kept_count[r], floor[r] - below, Real(0), Real(1), s, key);
        kept_count[r] = left, trigger[r] = std::max(kTrigger, 2 * left);
    }

    // Row r's kept entries above `floor` into `support`, as (s − shift)/β.
    void gather(int64_t r, Real shift, Real floor, int beta) {
        support.gather(kept.data() + r * room, kept_key.data() + r * room, kept_count[r], shift, floor, beta);
    }
};

// Each tile (g, first) of the call, causal tiles longest first, so the dynamic schedule ends balanced.
template <typename Real>
std::vector<std::pair<int64_t, int64_t>> tiles(const Problem<Real>& p) {
    std::vector<std::pair<int64_t, int64_t>> all;
    const int64_t count = (p.n + kTile - 1) / kTile;
    for (int64_t t = count - 1; t >= 0; --t)
        for (int64_t g = 0; g < p.G; ++g) all.emplace_back(g, t * kTile);
    return all;
}

// The kept entries of every row of tile (g, first): chunks in order (the diagonal's first), each scored
// unless the bound rules it out against the row's floor; entries above floor − `below` kept. The forward's
// floors run (the lane maxima's, then the kept entries' thresholds); the backward's are `exact_floor`.
// Returns the number of chunks scored; the rows' maxima in tile.best.
template <typename Real>
int64_t scan(const Problem<Real>& p, const Keys<Real>& keys, Tile<Real>& tile, int64_t g, int64_t first,
             int64_t rows, const Real* exact_floor, Real below, int64_t& visible) {
    const int64_t limit = p.keys(first, rows), last = (limit - 1) / kChunk;
    std::vector<Real>& floor = tile.bar;
    int64_t scored = 0;
    visible = last + 1;
    for (int64_t step = 0; step <= last; ++step) {
        const int64_t chunk = step == 0 ? last : step - 1;
        const int64_t c0 = chunk * kChunk, c1 = std::min(limit, c0 + kChunk);
        for (int64_t r = 0; r < rows; ++r) floor[r] = (exact_floor != nullptr ? exact_floor[r] : tile.floor[r]) - below;
        if (step > 0 && !tile.reaches(p, keys, g, chunk, rows, floor.data())) continue;
        ++scored;
        tile.score(p, keys, g, first, rows, c0, c1);
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t width = p.causal ? std::min(c1, first + r + 1) - c0 : c1 - c0;
            if (width <= 0) continue;
            if (exact_floor == nullptr) {
                const Real top = tile.raise(r, width, p.beta);
                floor[r] = tile.floor[r] - below;
                if (!(top > floor[r])) continue;  // nothing of this chunk above the floor: no pass to keep any
            }
            if (floor[r] == -std::numeric_limits<Real>::infinity()) continue;
            tile.keep_above(r, c0, width, floor[r]);
            if (exact_floor == nullptr) tile.tighten(r, p.beta, below), floor[r] = tile.floor[r] - below;
        }
    }
    return scored;
}

// The approximate mode's indexer: q_index (G, n, r) and k_index (G, m, r) score in place of q and k, and a
// query's predicted set is Ŝ = {j : x′_j ≥ τ′ − δ} of its low-rank row x′ (the `candidates` largest where
// more), over which entmax runs with the exact scores.
template <typename Real>
struct Index {
    const Real *q, *k;
    int64_t rank, candidates;
    Real margin;  // δ ≥ 0
    bool coded;   // the low-rank scores from 7-bit codes where Real is float (coded_product.h)

    // The indexer's problem: p with the low-rank rows in place of q and k.
    Problem<Real> low(const Problem<Real>& p) const {
        Problem<Real> out = p;
        out.q = q, out.k = k, out.d = rank, out.coded = coded && std::is_same_v<Real, float>;
        return out;
    }
};

// Ŝ of row r after the low-rank scan, in tile.support.key (tile.support.size of them, in scan order), from
// its low-rank maximum `shift` and threshold τ′ = `tau` (the forward solves it: `tau` null); returns
// whether the cap cut it.
template <typename Real>
bool predicted(Tile<Real>& tile, int64_t r, const Index<Real>& index, int beta, Real shift, Real floor, Real& tau,
               bool solve) {
    Support<Real>& s = tile.support;
    tile.gather(r, shift, floor, beta);
    if (solve) tau = s.threshold(beta);
    const Real bar = tau - index.margin;
    int64_t kept = 0;
    for (int64_t e = 0; e < s.size; ++e)
        if (s.x[e] >= bar) s.x[kept] = s.x[e], s.key[kept] = s.key[e], ++kept;
    s.size = kept;
    if (kept <= index.candidates) return false;
    // the `candidates` largest x′ (ties by scan order, so the choice is the same in the backward)
    std::vector<int64_t>& order = tile.order;
    order.resize(kept);
    for (int64_t e = 0; e < kept; ++e) order[e] = e;
    const auto larger = [&](int64_t a, int64_t b) { return s.x[a] > s.x[b] || (s.x[a] == s.x[b] && a < b); };
    std::nth_element(order.begin(), order.begin() + index.candidates, order.end(), larger);
    std::sort(order.begin(), order.begin() + index.candidates);
    for (int64_t e = 0; e < index.candidates; ++e) s.key[e] = s.key[order[e]];
    s.size = index.candidates;
    return true;
}

// The exact scores of query i (group g) against the keys of `chosen` into `exact`, as x = (s − shift)/β with
// shift their maximum (`solve`) or the given one; returns the shift. The dot products a vector's width of keys
// at a time (vectors::scaled_dots), where a call and a reduction per key had been a sixth of the approximate
// mode's time on a trained model's flattest layer.
template <typename Real>
Real exact_scores(const Problem<Real>& p, int64_t g, int64_t i, const Support<Real>& chosen, Support<Real>& exact,
                  Real shift, bool solve) {
    vectors::scaled_dots<Real>(p.q + i * p.d, p.k + g * p.m * p.d, chosen.key.data(), chosen.size, p.d, p.scale,
                               exact.x.data());
    Real m = -std::numeric_limits<Real>::infinity();
    for (int64_t e = 0; e < chosen.size; ++e) exact.key[e] = chosen.key[e], m = std::max(m, exact.x[e]);
    exact.size = chosen.size;
    if (solve) shift = m;
    const Real inverse = Real(1) / Real(p.beta);
    for (int64_t e = 0; e < exact.size; ++e) exact.x[e] = (exact.x[e] - shift) * inverse;
    for (int64_t e = exact.size; e < whole_vectors<Real>(exact.size); ++e)
        exact.x[e] = -std::numeric_limits<Real>::infinity();
    return shift;
}

// What a forward keeps per query for its backward: m and τ of the exact scores over the set entmax ran on
// (a query with no key: τ = +∞), and in approximate mode m′ and τ′ of its low-rank row.
template <typename Real>
struct Saved {
    Real *shift, *tau, *low_shift, *low_tau;
};

// out (G, n, dv) and `saved`; counts[0] += chunks scored, [1] += chunks visible, [2] += entries entmax ran
// over (certified: those kept above the floor; approximate: |Ŝ|), [3] += queries whose Ŝ was capped, [4] +=
// queries with a key.
template <typename Real>
void forward(const Problem<Real>& p, const Index<Real>* index, Real* out, Saved<Real> saved, int64_t* counts,
             int threads) {
    const Problem<Real> scanned = index != nullptr ? index->low(p) : p;
    const Real below = index != nullptr ? Real(p.beta) * index->margin : Real(0);
    Keys<Real> keys;
    keys.build(scanned, threads);
    const auto work = tiles(p);
    const Real inf = std::numeric_limits<Real>::infinity();
    std::atomic<bool> short_of_memory{false};
    int64_t scored = 0, visible = 0, kept = 0, capped = 0, live = 0;
#pragma omp parallel num_threads(threads) if (threads > 1) reduction(+ : scored, visible, kept, capped, live)
    {
        Tile<Real> tile;
        const bool ready = allocated([&] { tile.allocate(scanned); }, short_of_memory);
#pragma omp for schedule(dynamic, 1)
        for (size_t w = 0; w < work.size(); ++w) {
            if (!ready) continue;
            const auto [g, first] = work[w];
            const int64_t rows = std::min(kTile, p.n - first);
            tile.start(scanned, g, first, rows);
            int64_t seen = 0;
            scored += scan(scanned, keys, tile, g, first, rows, static_cast<const Real*>(nullptr), below, seen);
            visible += seen;
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t i = g * p.n + first + r;
                Real* o = out + i * p.dv;
                const Real m = tile.best[r];
                if (m == -inf) {
                    std::fill(o, o + p.dv, Real(0));
                    saved.shift[i] = 0, saved.tau[i] = inf;
                    if (index != nullptr) saved.low_shift[i] = 0, saved.low_tau[i] = inf;
                    continue;
                }
                ++live;
                Support<Real>* support = &tile.support;
                if (index == nullptr) {
                    tile.gather(r, m, tile.floor[r], p.beta);
                    saved.shift[i] = m;
                } else {
                    Real low_tau = 0;
                    capped += predicted(tile, r, *index, p.beta, m, tile.floor[r] - below, low_tau, true);
                    saved.low_shift[i] = m, saved.low_tau[i] = low_tau;
                    saved.shift[i] = exact_scores(p, g, i, tile.support, tile.exact, Real(0), true);
                    support = &tile.exact;
                }
                kept += support->size;
                const Real t = support->threshold(p.beta);
                support->select(t, p.beta);
                weighted_sum(support->x.data(), support->key.data(), support->size, p.v + g * p.m * p.dv, p.dv, o);
                saved.tau[i] = t;
            }
        }
    }
    if (short_of_memory) throw std::bad_alloc();
    counts[0] += scored, counts[1] += visible, counts[2] += kept, counts[3] += capped, counts[4] += live;
}

// Query i's share of the gradients from its support (keys and p in `support`) and grad_i: dq_i written, dk and
// dv added into `own` ((m, d + dv) rows of the group: dk then dv).
template <typename Real>
void row_gradient(const Problem<Real>& p, int64_t g, int64_t i, const Support<Real>& support, const Real* grad,
                  Real* own, Real* dq, std::vector<Real>& weight, std::vector<Real>& dp) {
    const Real* go = grad + i * p.dv;
    const Real* qi = p.q + i * p.d;
    weight.resize(support.size), dp.resize(support.size);
    Real wsum = 0, wdp = 0;
    for (int64_t e = 0; e < support.size; ++e) {
        const Real dpe = dot(go, p.v + (g * p.m + support.key[e]) * p.dv, p.dv);  // do · v_j
        weight[e] = p.beta == 2 ? std::sqrt(support.x[e]) : Real(1);  // g = p^{2−α}
        dp[e] = dpe, wsum += weight[e], wdp += weight[e] * dpe;
    }
    const Real mean = wsum > 0 ? wdp / wsum : 0;
    for (int64_t e = 0; e < support.size; ++e) {
        const Real ds = p.scale * weight[e] * (dp[e] - mean);  // scale · ∂L/∂s_j
        dp[e] = ds;
        Real* dkj = own + int64_t(support.key[e]) * (p.d + p.dv);
        Real* dvj = dkj + p.d;
        for (int64_t c = 0; c < p.d; ++c) dkj[c] += ds * qi[c];
        for (int64_t c = 0; c < p.dv; ++c) dvj[c] += support.x[e] * go[c];
    }
    weighted_sum(dp.data(), support.key.data(), support.size, p.k + g * p.m * p.d, p.d, dq + i * p.d);
}

// dq (G, n, d), dk (G, m, d), dv (G, m, dv) from grad (G, n, dv) and what the forward saved: the scan runs
// again with each row's exact floor (certified: m + β·τ; approximate: the low-rank m′ + β(τ′ − δ)), which
// finds the same set the forward ran entmax over.
template <typename Real>
void backward(const Problem<Real>& p, const Index<Real>* index, const Real* grad, Saved<Real> saved, Real* dq,
              Real* dk, Real* dv, int threads) {
    const Problem<Real> scanned = index != nullptr ? index->low(p) : p;
    Keys<Real> keys;
    keys.build(scanned, threads);
    const int64_t count = (p.n + kTile - 1) / kTile, width = p.m * (p.d + p.dv);
    const int parts = std::max(threads, 1);
    std::vector<Real> sums;  // per thread: dk then dv of one group, (m, d + dv)
    std::atomic<bool> short_of_memory{false};
    if (!allocated([&] { sums.assign(parts * width, Real(0)); }, short_of_memory)) throw std::bad_alloc();
    const Real* floor_shift = index != nullptr ? saved.low_shift : saved.shift;
    const Real* floor_tau = index != nullptr ? saved.low_tau : saved.tau;
    const Real margin = index != nullptr ? index->margin : Real(0);
    for (int64_t g = 0; g < p.G; ++g) {
        std::fill(sums.begin(), sums.end(), Real(0));
#pragma omp parallel num_threads(threads) if (threads > 1)
        {
            Tile<Real> tile;
            std::vector<Real> floor(kTile), weight, dp;
            const bool ready = allocated([&] { tile.allocate(scanned); }, short_of_memory);
#ifdef _OPENMP
            Real* own = sums.data() + int64_t(omp_get_thread_num()) * width;
#else
            Real* own = sums.data();
#endif
#pragma omp for schedule(static, 1)
            for (int64_t t = 0; t < count; ++t) {
                if (!ready) continue;
                const int64_t first = t * kTile, rows = std::min(kTile, p.n - first);
                tile.start(scanned, g, first, rows);
                for (int64_t r = 0; r < rows; ++r) {
                    const int64_t i = g * p.n + first + r;
                    const Real m = floor_shift[i];
                    floor[r] = std::isinf(floor_tau[i]) ? std::numeric_limits<Real>::infinity()
                                                        : m + Real(p.beta) * (floor_tau[i] - margin) - rounding(m, p.beta);
                }
                int64_t seen = 0;
                scan(scanned, keys, tile, g, first, rows, floor.data(), Real(0), seen);
                for (int64_t r = 0; r < rows; ++r) {
                    const int64_t i = g * p.n + first + r;
                    if (std::isinf(saved.tau[i])) {
                        std::fill(dq + i * p.d, dq + (i + 1) * p.d, Real(0));
                        continue;
                    }
                    Support<Real>* support = &tile.support;
                    if (index == nullptr) {
                        tile.gather(r, saved.shift[i], floor[r], p.beta);
                    } else {
                        Real low_tau = saved.low_tau[i];
                        predicted(tile, r, *index, p.beta, saved.low_shift[i], floor[r], low_tau, false);
                        exact_scores(p, g, i, tile.support, tile.exact, saved.shift[i], false);
                        support = &tile.exact;
                    }
                    support->select(saved.tau[i], p.beta);  // p_j
                    row_gradient(p, g, i, *support, grad, own, dq, weight, dp);
                }
            }
        }
        if (short_of_memory) throw std::bad_alloc();
        for (int64_t j = 0; j < p.m; ++j) {
            Real* dkj = dk + (g * p.m + j) * p.d;
            Real* dvj = dv + (g * p.m + j) * p.dv;
            std::fill(dkj, dkj + p.d, Real(0)), std::fill(dvj, dvj + p.dv, Real(0));
            for (int part = 0; part < parts; ++part) {
                const Real* from = sums.data() + part * width + j * (p.d + p.dv);
                for (int64_t c = 0; c < p.d; ++c) dkj[c] += from[c];
                for (int64_t c = 0; c < p.dv; ++c) dvj[c] += from[p.d + c];
            }
        }
    }
}

}  // namespace

// q (G, n, d), k (G, m, d), v (G, m, dv) contiguous; key_valid (G, m) bytes or null; beta 1 (α = 2) or 2
// (α = 1.5); causal 0 or 1 (n = m). Approximate mode where q_index (G, n, rank) and k_index (G, m, rank) are
// not null, with margin δ and the cap `candidates`, its low-rank scores from 7-bit codes (float) where `coded`
// is 1. Forward: out (G, n, dv); shift, tau (G, n) and in approximate mode low_shift, low_tau (G, n) for the
// backward; counts (5,) added to. Backward: grad (G, n, dv) and what the forward saved give dq, dk, dv.
// Returns 0, −1 when memory ran out, −2 for a β it does not take.
#define EXPORT(SUFFIX, REAL)                                                                                       \
    extern "C" int scanned_forward_##SUFFIX(const REAL* q, const REAL* k, const REAL* v, const uint8_t* key_valid,  \
                                            const REAL* q_index, const REAL* k_index, int64_t G, int64_t n,         \
                                            int64_t m, int64_t d, int64_t dv, int64_t rank, double scale,           \
                                            int64_t beta, int64_t causal, double margin, int64_t candidates,        \
                                            int64_t coded, REAL* out, REAL* shift, REAL* tau, REAL* low_shift,      \
                                            REAL* low_tau, int64_t* counts, int threads) {                          \
        if (beta != 1 && beta != 2) return -2;                                                                      \
        const Problem<REAL> p{q, k, v, key_valid, G, n, m, d, dv, REAL(scale), int(beta), causal != 0};             \
        const Index<REAL> index{q_index, k_index, rank, candidates, REAL(margin), coded != 0};                      \
        const Index<REAL>* chosen = q_index != nullptr ? &index : nullptr;                                          \
        return guarded([&] { forward(p, chosen, out, Saved<REAL>{shift, tau, low_shift, low_tau}, counts, threads); }); \
    }                                                                                                               \
    extern "C" int scanned_backward_##SUFFIX(const REAL* q, const REAL* k, const REAL* v, const uint8_t* key_valid, \
                                             const REAL* q_index, const REAL* k_index, int64_t G, int64_t n,        \
                                             int64_t m, int64_t d, int64_t dv, int64_t rank, double scale,          \
                                             int64_t beta, int64_t causal, double margin, int64_t candidates,       \
                                             int64_t coded, const REAL* grad, REAL* shift, REAL* tau,               \
                                             REAL* low_shift, REAL* low_tau, REAL* dq, REAL* dk, REAL* dv_out,      \
                                             int threads) {                                                         \
        if (beta != 1 && beta != 2) return -2;                                                                      \
        const Problem<REAL> p{q, k, v, key_valid, G, n, m, d, dv, REAL(scale), int(beta), causal != 0};             \
        const Index<REAL> index{q_index, k_index, rank, candidates, REAL(margin), coded != 0};                      \
        const Index<REAL>* chosen = q_index != nullptr ? &index : nullptr;                                          \
        const Saved<REAL> saved{shift, tau, low_shift, low_tau};                                                    \
        return guarded([&] { backward(p, chosen, grad, saved, dq, dk, dv_out, threads); });                         \
    }

EXPORT(float, float)
EXPORT(double, double)
