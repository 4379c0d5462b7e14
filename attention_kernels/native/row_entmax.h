// α-entmax (α = 1.5 or 2) and softmax of one query over its rows of scores, in the first-level cache: the
// search for the threshold τ and the probabilities written over the scores. Shared by the kernel over rows of
// many parts (exact_entmax.cpp) and the fused block attention (block_attention.cpp).
//
// With m the query's largest score and x_j = (α − 1)(s_j − m) ≤ 0, τ solves
//
//     F(τ) = Σ_j (x_j − τ)₊^β = 1,   τ in [−1, 0),   and p_j = (x_j − τ)₊^β   (β = 1/(α − 1)).
//
// At τ ≤ τ* the support S = {x > τ} contains the true one. On S the equation is a polynomial one,
// Σ_S (y − δ) = 1 or Σ_S (y − δ)² = 1 with y = x − τ, whose (smaller) root τ′ = τ + δ is τ* exactly when
// {x > τ′} still has |S| elements: then it is S itself, and τ′ is the sort-based value. Otherwise a Newton
// step on F^{1/β} − 1 from below (a norm of (x − τ)₊: convex, so it never overshoots) brings τ closer.
// Softmax: p_j = e^{s_j − m} / Σ_k e^{s_k − m}.
//
// Which entries of a row are keys may be given by a rule instead of masked scores (`PartMask`, the blocks'
// mask of attention_kernels/bucketed/planning.py): entry (r, c) of block b is one when
// low_r ≤ key_pos_bc ≤ limit_r (a causal cut, a window band, padding) and no tag of row r equals a tag of
// column c (a pair another block holds). The rule is applied where the entries are loaded.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "vectors.h"

namespace row_entmax {
using vectors::exp_lanes, vectors::store;

constexpr int kMaxSteps = 100;  // as the reference: more than float64 resolution needs
constexpr int kGroup = 8;       // queries whose search steps interleave
constexpr int kStartSteps = 2;  // Newton steps on the lane maxima for the search's start (Query::start)

// Vectors of the registers' width (vectors::kBytes; GCC's and Clang's vector extensions: the compiler picks the
// instructions), and the float key positions and int32 tags of as many entries.
using vectors::kBytes;
typedef float Floats __attribute__((vector_size(kBytes)));
typedef float HalfFloats __attribute__((vector_size(kBytes / 2)));
typedef double Doubles __attribute__((vector_size(kBytes)));
typedef int32_t Ints __attribute__((vector_size(kBytes)));
typedef int32_t HalfInts __attribute__((vector_size(kBytes / 2)));
typedef int64_t Longs __attribute__((vector_size(kBytes)));
template <typename Real>
struct VectorOf;
template <>
struct VectorOf<float> {
    using type = Floats;
    using positions = Floats;
    using tags = Ints;
    using mask = Ints;  // what a comparison of two `type` gives
};
template <>
struct VectorOf<double> {
    using type = Doubles;
    using positions = HalfFloats;
    using tags = HalfInts;
    using mask = Longs;
};
template <typename Real>
using Vec = typename VectorOf<Real>::type;
template <typename Real>
using Positions = typename VectorOf<Real>::positions;
template <typename Real>
using Tags = typename VectorOf<Real>::tags;
template <typename Real>
using Mask = typename VectorOf<Real>::mask;
template <typename Real>
constexpr int kWidth = kBytes / sizeof(Real);

// Scores below half the masked value (−max float / 2) belong to no key.
constexpr double kNoKey = -0.5 * 3.4028234663852886e38;

// A vector of the `valid` (≤ its lanes) values from `from` on, `rest` in the lanes after them. Neither a whole
// vector nor scores go through the stack: a copy into `rest` there is a store and a wider load, which waits on
// the store (its forwarding fails for 512-bit vectors on AMD's Zen 4: a quarter of the search's time).
template <typename V, typename T>
V lanes(const T* from, int64_t valid, V rest) {
    if (valid * sizeof(T) == sizeof(V)) {  // a fixed-size copy into a fresh vector: one load instruction
        V whole;
        std::memcpy(&whole, from, sizeof whole);
        return whole;
    }
    if constexpr (std::is_same_v<V, vectors::Vec<T>>) {  // scores: a masked load, `rest` blended in
        const V loaded = vectors::load<T>(from, valid);
        return vectors::first_lanes<T>(valid) ? loaded : rest;
    } else {
        std::memcpy(&rest, from, valid * sizeof(T));
        return rest;
    }
}

// Which entries of a part of blocks (blocks × block_rows rows of `width`) are keys: entry c of row r is one
// when low[r] ≤ key_pos[c] ≤ limit[r] (the positions of the row's block) and no tag of the row equals one of
// the column.
struct PartMask {
    const float* key_pos;   // (blocks, width) key positions
    const float* limit;     // (rows,) the largest key position of each row
    const float* low;       // (rows,) the smallest, or null for none
    const int32_t* q_tags;  // (q_tag_count, rows), or null
    const int32_t* k_tags;  // (k_tag_count, blocks, width), or null when q_tags is
    int64_t q_tag_count, k_tag_count, blocks, block_rows;
};

// What a row's mask tests, from the least: nothing (every entry is a key), the upper limit, both limits,
// both limits and the tags. The loops over a row's entries are compiled once for each, so a row pays for
// no test it does not need.
enum Rule { kEvery, kLimit, kRange, kTagged };

// A row of scores and its part's mask resolved for it: its limits, its tags and its block's columns.
template <typename Real>
struct Row {
    Real* data = nullptr;
    int64_t width = 0;
    Rule rule = kEvery;
    const float* key_pos = nullptr;  // the positions of the row's block; null: every entry is a key
    float limit = 0, low = 0;
    const int32_t* q_tags = nullptr;  // the row's first tag; null: no tags
    const int32_t* k_tags = nullptr;  // the block's first tag of each column
    const PartMask* mask = nullptr;   // the tags' counts and strides

    Row() = default;
    Row(Real* scores, int64_t columns, const PartMask* part, int64_t r) : data(scores), width(columns) {
        if (part == nullptr) return;
        rule = part->q_tags != nullptr ? kTagged : part->low != nullptr ? kRange : kLimit;
        const int64_t block = r / part->block_rows;
        key_pos = part->key_pos + block * width;
        limit = part->limit[r];
        low = part->low != nullptr ? part->low[r] : -std::numeric_limits<float>::infinity();
        if (part->q_tags != nullptr) q_tags = part->q_tags + r, k_tags = part->k_tags + block * width, mask = part;
    }

    // True (all bits) in the lanes of entries j.. (`valid` of them) that are not keys of the row, by the
    // tests of `rule` (at least kLimit).
    template <Rule rule>
    Mask<Real> excluded(int64_t j, int64_t valid) const {
        const Vec<Real> at = __builtin_convertvector(lanes(key_pos + j, valid, Positions<Real>{}), Vec<Real>);
        Mask<Real> off = at > Real(limit);
        if constexpr (rule >= kRange) off |= at < Real(low);
        if constexpr (rule < kTagged) return off;
        const int64_t q_stride = mask->blocks * mask->block_rows, k_stride = mask->blocks * width;
        for (int64_t u = 0; u < mask->k_tag_count; ++u) {
            const Tags<Real> column = lanes(k_tags + u * k_stride + j, valid, Tags<Real>{});
            for (int64_t t = 0; t < mask->q_tag_count; ++t)
                off |= __builtin_convertvector(column == q_tags[t * q_stride], Mask<Real>);
        }
        return off;
    }
};

template <typename Real>
struct Query {
    Row<Real>* rows;  // the query's rows (its own: largest(true) rewrites their rules)
    int64_t count;    // how many
    Real shift;       // m
    Real scale;       // α − 1

    // Σ (x − τ)₊, Σ (x − τ)₊², |{x > τ}| and |{x > τ + gap}| (the check of a candidate τ′ = τ + gap).
    void sums(Real tau, Real gap, Real& s1, Real& s2, Real& k, Real& k_gap) const {
        Vec<Real> a[2] = {}, b[2] = {}, c[2] = {}, e[2] = {};
        each(tau, [&](int half, Vec<Real> d) {
            e[half] += d > gap ? Real(1) : Real(0);
            d = d > 0 ? d : 0;
            a[half] += d;
            b[half] += d * d;
            c[half] += d > 0 ? Real(1) : Real(0);
        });
        s1 = total(a), s2 = total(b), k = total(c), k_gap = total(e);
    }

    // max_j s_j over the keys, and in `high` the largest key of each lane (of the two sets of running
    // maxima): 2·kWidth of the query's scores, −∞ in a lane that saw no key. With `drop`, −∞ is also written
    // over the entries the rows' masks leave out and the masks dropped, in the same pass: the later passes
    // then test nothing (one pass of tests, where every pass of the search would repeat them).
    Real largest(bool drop, Vec<Real> (&high)[2]) const {
        const Real inf = std::numeric_limits<Real>::infinity();
        high[0] = high[1] = Vec<Real>{} - inf;
        for (int64_t r = 0; r < count; ++r) {
            by_rule(rows[r], [&](const Row<Real>& row, auto rule) {
                vectors(row.width, [&](int half, int64_t j, int64_t valid) {
                    Vec<Real> x = lanes(row.data + j, valid, Vec<Real>{} - inf);
                    if constexpr (rule != kEvery) {
                        x = row.template excluded<rule>(j, valid) ? -inf : x;
                        if (drop) store<Real>(row.data + j, x, valid);
                    }
                    high[half] = x > high[half] ? x : high[half];
                });
            });
            if (drop) rows[r].rule = kEvery;
        }
        return vectors::largest<Real>(high[0] > high[1] ? high[0] : high[1]);  // a tree of shuffles, not 2·kWidth steps
    }

    // Softmax: Σ_j e^{s_j − m} (0 without keys); with `write`, p_j = e^{s_j − m} / Σ_k e^{s_k − m} over the
    // rows, in place of the scores (0 without keys).
    Real softmax(bool write) const {
        constexpr int64_t n = kWidth<Real>;
        Vec<Real> even = {}, odd = {};  // two running sums, so consecutive additions need not wait on each other
        bool at_odd = false;            // the vectors alternate between them across all of a query's rows
        for (int64_t r = 0; r < count; ++r) {
            by_rule(rows[r], [&](const Row<Real>& row, auto rule) {
                const auto add = [&](int64_t j, int64_t valid) {
                    const Vec<Real> p = exp_lanes(load<rule>(row, j, valid, 0));  // e^{−∞} = 0 in the padding
                    (at_odd ? odd : even) += p;
                    at_odd = !at_odd;
                    if (write) store<Real>(row.data + j, p, valid);
                };
                int64_t j = 0;
                // Whole vectors apart: a load or store of a size known only at run time goes through the stack,
                // which took this pass from about 1 to 2 ns an entry on AVX2.
                for (; j + n <= row.width; j += n) add(j, n);
                if (j < row.width) add(j, row.width - j);
            });
        }
        const Vec<Real> sums[2] = {even, odd};
        const Real total = this->total(sums);
        if (write && total > 0) {
            const Real inverse = 1 / total;
            for (int64_t r = 0; r < count; ++r) {
                vectors(rows[r].width, [&](int, int64_t j, int64_t valid) {
                    Real* at = rows[r].data + j;
                    store<Real>(at, lanes(at, valid, Vec<Real>{}) * inverse, valid);
                });
            }
        }
        return total;
    }

    // A start τ₀ ≤ τ* for the search from the lane maxima T (`high`, of `largest`): for a subset T of the
    // keys F_T(τ) = Σ_{j∈T} (x_j − τ)₊^β ≤ F(τ), so its root τ_T ≤ τ*, and Newton steps from −1 on F_T
    // (on F_T^{1/β} − 1: convex, so from below they never pass τ_T) stay below τ*, up to rounding: where T
    // holds every key (rows of at most 2·kWidth), τ_T = τ* and the steps may end an ulp above it, which the
    // search's next step corrects. The maxima of the lanes are among the largest entries, so τ_T lies near
    // τ*: two steps on these few values leave the search about two passes over all the entries where from
    // −1 it takes four or five (Gaussian scores, rows of 64 to 1024 keys).
    Real start(const Vec<Real> (&high)[2], int beta) const {
        Real tau = -1;
        for (int step = 0; step < kStartSteps; ++step) {
            Vec<Real> a[2], b[2], c[2];
            for (int half = 0; half < 2; ++half) {
                const Vec<Real> d = scale * (high[half] - shift) - tau;
                a[half] = d > 0 ? d : 0, b[half] = a[half] * a[half], c[half] = d > 0 ? Real(1) : Real(0);
            }
            const Real s1 = total(a), s2 = total(b);
            if (s1 == 0) break;  // no key: any τ does
            tau += beta == 1 ? (s1 - 1) / total(c) : (s2 - std::sqrt(s2)) / s1;
        }
        return tau;
    }

    // p = (x − τ)₊^β over the rows, in place of the scores.
    void write_probabilities(Real tau, int beta) const {
        for (int64_t r = 0; r < count; ++r) {
            by_rule(rows[r], [&](const Row<Real>& row, auto rule) {
                vectors(row.width, [&](int, int64_t j, int64_t valid) {
                    Vec<Real> p = load<rule>(row, j, valid, tau);
                    p = p > 0 ? p : 0;
                    if (beta == 2) p *= p;
                    store<Real>(row.data + j, p, valid);
                });
            });
        }
    }

    // f(half, x − τ) over the entries, a vector of them at a time, x = scale·(s − m), alternating between two
    // sets of running sums so that consecutive additions need not wait on each other. A row's last entries
    // (fewer than a vector) come padded with s = −∞, which every f ignores.
    template <typename F>
    void each(Real tau, F&& f) const {
        for (int64_t r = 0; r < count; ++r) {
            by_rule(rows[r], [&](const Row<Real>& row, auto rule) {
                vectors(row.width,
                        [&](int half, int64_t j, int64_t valid) { f(half, load<rule>(row, j, valid, tau)); });
            });
        }
    }

    // step(half, j, valid) over a row of `width` entries, a vector from entry j on (`valid` ≤ kWidth of them),
    // half alternating 0, 1: unrolled by two, so the halves are constants and the running sums of each stay
    // in registers.
    template <typename F>
    static void vectors(int64_t width, F&& step) {
        constexpr int64_t n = kWidth<Real>;
        int64_t j = 0;
        for (; j + 2 * n <= width; j += 2 * n) step(0, j, n), step(1, j + n, n);
        if (j + n <= width) step(0, j, n), j += n;
        if (j < width) step(1, j, width - j);
    }

    // body(row, rule) with the row's rule as a compile-time constant.
    template <typename F>
    static void by_rule(const Row<Real>& row, F&& body) {
        switch (row.rule) {
            case kEvery: return body(row, std::integral_constant<Rule, kEvery>{});
            case kLimit: return body(row, std::integral_constant<Rule, kLimit>{});
            case kRange: return body(row, std::integral_constant<Rule, kRange>{});
            case kTagged: return body(row, std::integral_constant<Rule, kTagged>{});
        }
    }

    // x − τ of the `valid` (≤ kWidth) entries of the row from j on; s = −∞ in the lanes after them and on
    // the entries the row's mask leaves out.
    template <Rule rule>
    Vec<Real> load(const Row<Real>& row, int64_t j, int64_t valid, Real tau) const {
        const Real inf = std::numeric_limits<Real>::infinity();
        Vec<Real> x = lanes<Vec<Real>>(row.data + j, valid, Vec<Real>{} - inf);
        if constexpr (rule != kEvery) x = row.template excluded<rule>(j, valid) ? -inf : x;
        return scale * (x - shift) - tau;
    }

    // Σ of the lanes of two vectors, pairwise (vectors::total).
    static Real total(const Vec<Real>* lanes) { return vectors::total<Real>(lanes[0] + lanes[1]); }
};

// τ of `size` (≤ kGroup) queries together, each from its start `from` ≤ τ* (up to rounding, Query::start).
// Each pass over a query's entries gives the sums at its current τ and checks the candidate τ′ of the
// pass before (whether {x > τ′} kept that pass's |S| elements). The queries' passes interleave: one
// query's have no data dependence on another's, so the processor overlaps them, where a query alone would
// wait on each sum's last additions and on the solve's square roots and divisions.
template <typename Real>
void solve(const Query<Real>* group, int size, int beta, const Real* from, Real* threshold) {
    const Real inf = std::numeric_limits<Real>::infinity();
    Real tau[kGroup], candidate[kGroup], support[kGroup];
    bool searching[kGroup];
    int left = 0;
    for (int i = 0; i < size; ++i) {
        tau[i] = from[i], candidate[i] = inf, support[i] = -1;  // no candidate yet: nothing to check
        searching[i] = group[i].count > 0;                       // a query without rows keeps τ = −1
        left += searching[i];
    }
    for (int step = 0; step < kMaxSteps && left > 0; ++step) {
        for (int i = 0; i < size; ++i) {
            if (!searching[i]) continue;
            Real s1, s2, k, k_candidate;
            group[i].sums(tau[i], candidate[i] - tau[i], s1, s2, k, k_candidate);
            if (k_candidate == support[i]) {
                tau[i] = candidate[i], searching[i] = false, --left;
                continue;
            }
            if (beta == 1) {  // the value on S is also the Newton step from below
                tau[i] = candidate[i] = tau[i] + (s1 - 1) / (k > 1 ? k : 1);
            } else {
                Real disc = s1 * s1 - k * (s2 - 1), root = disc > 0 ? std::sqrt(disc) : 0;
                candidate[i] = tau[i] + (s2 - 1) / (s1 + root == 0 ? 1 : s1 + root);
                tau[i] += (s2 - std::sqrt(s2)) / (s1 == 0 ? 1 : s1);
            }
            support[i] = k;
        }
    }
    std::copy(tau, tau + size, threshold);
}

// Asks for the entries of rows [from, to) (the next group's) to be brought into the cache: a query's rows
// lie anywhere in memory, so without it each row's first read waits on memory, where this overlaps the wait
// with the current group's work.
template <typename Real>
void prefetch(const Row<Real>* from, const Row<Real>* to) {
    for (const Row<Real>* row = from; row < to; ++row)
        for (int64_t j = 0; j < row->width; j += 64 / sizeof(Real)) __builtin_prefetch(row->data + j, 1);
}

}  // namespace row_entmax
