// What the C++ kernels share on vectors of the registers' width: masked loads and stores, e^x lane by lane,
// and products C = A·B with A's, B's and C's rows given by pointers (register tiles). Each sum of a product
// runs over the inner dimension in order, so a row of C depends on its row of A alone, whatever the tiling or
// the thread count.

#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace vectors {

// The registers' width: 64 bytes with AVX-512, else 32 (AVX2). Wider vectors than the registers hold would be
// split by the compiler, and their comparisons and selections lowered lane by lane (several times slower).
#ifdef __AVX512F__
constexpr int kBytes = 64;
#else
constexpr int kBytes = 32;
#endif

// Vectors of kBytes of float, double or integers (GCC's and Clang's vector extensions: the compiler picks the
// instructions).
template <typename Real>
using Vec __attribute__((vector_size(kBytes))) = Real;
template <typename Real>
constexpr int64_t kWidth = kBytes / sizeof(Real);

// 0, 1, 2, … in the lanes of a vector of integers.
template <typename Int>
Vec<Int> lane_index() {
    Vec<Int> v;
    for (int64_t lane = 0; lane < kWidth<Int>; ++lane) v[lane] = Int(lane);
    return v;
}

// All bits set in the first `valid` lanes of a vector of integers as wide as Real's lanes, none in the others.
template <typename Real>
auto first_lanes(int64_t valid) {
    using Int = std::conditional_t<sizeof(Real) == 4, int32_t, int64_t>;
    return lane_index<Int>() < Int(valid);
}

// The first `valid` (≤ kWidth) lanes of v, written from `to` on: one store, masked where the vector is not
// whole (a copy of a size known only at run time would be a call).
template <typename Real>
void store(Real* to, const Vec<Real>& v, int64_t valid) {
    static_assert(sizeof(Real) == 4 || sizeof(Real) == 8, "lanes of 4 or 8 bytes");
    if (valid == kWidth<Real>) {
        std::memcpy(to, &v, sizeof v);
        return;
    }
#ifdef __AVX512F__
    const unsigned lanes = (1u << valid) - 1;
    if constexpr (sizeof(Real) == 4) {
        _mm512_mask_storeu_epi32(to, static_cast<__mmask16>(lanes), reinterpret_cast<const __m512i&>(v));
    } else {
        _mm512_mask_storeu_epi64(to, static_cast<__mmask8>(lanes), reinterpret_cast<const __m512i&>(v));
    }
#elif defined(__AVX2__)
    const auto mask = first_lanes<Real>(valid);
    const __m256i lanes = reinterpret_cast<const __m256i&>(mask);
    if constexpr (sizeof(Real) == 4) {
        _mm256_maskstore_epi32(reinterpret_cast<int*>(to), lanes, reinterpret_cast<const __m256i&>(v));
    } else {
        _mm256_maskstore_epi64(reinterpret_cast<long long*>(to), lanes, reinterpret_cast<const __m256i&>(v));
    }
#else
    std::memcpy(to, &v, valid * sizeof(Real));
#endif
}

// The `valid` (≤ kWidth) values from `from` on in the first lanes, 0 in the others: one load, masked where
// the vector is not whole (nothing after them is read).
template <typename Real>
Vec<Real> load(const Real* from, int64_t valid = kWidth<Real>) {
    static_assert(sizeof(Real) == 4 || sizeof(Real) == 8, "lanes of 4 or 8 bytes");
    Vec<Real> v = {};
    if (valid == kWidth<Real>) {
        std::memcpy(&v, from, sizeof v);
        return v;
    }
#ifdef __AVX512F__
    const unsigned lanes = (1u << valid) - 1;
    if constexpr (sizeof(Real) == 4) {
        const __m512i loaded = _mm512_maskz_loadu_epi32(static_cast<__mmask16>(lanes), from);
        std::memcpy(&v, &loaded, sizeof v);
    } else {
        const __m512i loaded = _mm512_maskz_loadu_epi64(static_cast<__mmask8>(lanes), from);
        std::memcpy(&v, &loaded, sizeof v);
    }
#elif defined(__AVX2__)
    const auto mask = first_lanes<Real>(valid);
    const __m256i lanes = reinterpret_cast<const __m256i&>(mask);
    __m256i loaded;
    if constexpr (sizeof(Real) == 4) {
        loaded = _mm256_maskload_epi32(reinterpret_cast<const int*>(from), lanes);
    } else {
        loaded = _mm256_maskload_epi64(reinterpret_cast<const long long*>(from), lanes);
    }
    std::memcpy(&v, &loaded, sizeof v);
#else
    std::memcpy(&v, from, valid * sizeof(Real));
#endif
    return v;
}

// Σ of a vector's lanes, pairwise (lane i + lane i + half, halving): a serial sum would wait on each addition
// in turn, and a loop over the lanes goes through the stack where AVX-512 has the shuffles of its reduction.
template <typename Real>
Real total(const Vec<Real>& v) {
#ifdef __AVX512F__
    if constexpr (sizeof(Real) == 4) {
        return _mm512_reduce_add_ps(reinterpret_cast<const __m512&>(v));
    } else {
        return _mm512_reduce_add_pd(reinterpret_cast<const __m512d&>(v));
    }
#else
    Real lanes[kWidth<Real>];
    std::memcpy(lanes, &v, sizeof lanes);
    for (int half = kWidth<Real> / 2; half > 0; half /= 2)
        for (int lane = 0; lane < half; ++lane) lanes[lane] += lanes[lane + half];
    return lanes[0];
#endif
}

// The largest of a vector's lanes.
template <typename Real>
Real largest(const Vec<Real>& v) {
#ifdef __AVX512F__
    if constexpr (sizeof(Real) == 4) {
        return _mm512_reduce_max_ps(reinterpret_cast<const __m512&>(v));
    } else {
        return _mm512_reduce_max_pd(reinterpret_cast<const __m512d&>(v));
    }
#else
    Real m = v[0];
    for (int lane = 1; lane < kWidth<Real>; ++lane) m = std::max(m, v[lane]);
    return m;
#endif
}

// Σ_t a[t]·b[t] over `depth` values: per lane a running sum over t ≡ lane (mod kWidth), then the lanes pairwise
// (total). A fixed order, though not the products' (which sum over t in order): a sum in order is a chain of
// `depth` dependent additions, several times slower where one dot product is all there is to compute.
template <typename Real>
Real dot(const Real* a, const Real* b, int64_t depth) {
    constexpr int64_t w = kWidth<Real>;
    Vec<Real> sum = {};
    for (int64_t t = 0; t < depth; t += w) {
        const int64_t valid = std::min(w, depth - t);
        sum += load<Real>(a + t, valid) * load<Real>(b + t, valid);
    }
    return total<Real>(sum);
}

// e^x lane by lane for x ≤ 88 (−∞ included), on a vector V of floats of any width: 0 below −87.3, where e^x
// leaves float's normal range. Cephes' expf: x = k·ln 2 + r with k = round(x·log₂e) and ln 2 in two parts
// (so r is exact), e^r by a polynomial on |r| ≤ ln 2 / 2 (relative error about 1e-7), 2^k put in the
// exponent bits. In float64 (tests and gradient checks, not speed): the library's exp, lane by lane.
template <typename V>
V exp_lanes(V x) {
    using Lane = std::remove_reference_t<decltype(x[0])>;
    if constexpr (std::is_same_v<Lane, double>) {
        for (size_t lane = 0; lane < sizeof x / sizeof(Lane); ++lane) x[lane] = std::exp(x[lane]);
        return x;
    } else {
        using Ints = decltype(x < x);  // int32 lanes, as many
        const V low = V{} - 87.33654f;
        const Ints underflow = x < low;
        x = x < low ? low : x;
        const V round = V{} + 12582912.0f;  // 1.5 · 2^23: adding it rounds to a whole number
        const V k = (x * 1.44269504088896341f + round) - round;
        const V r = x - k * 0.693359375f + k * 2.12194440e-4f;
        V y = V{} + 1.9875691500e-4f;
        y = y * r + 1.3981999507e-3f;
        y = y * r + 8.3334519073e-3f;
        y = y * r + 4.1665795894e-2f;
        y = y * r + 1.6666665459e-1f;
        y = y * r + 5.0000001201e-1f;
        y = y * (r * r) + r + 1.0f;
        const Ints bits = (__builtin_convertvector(k, Ints) + 127) << 23;
        V two_k;
        std::memcpy(&two_k, &bits, sizeof two_k);
        return underflow ? 0.0f : y * two_k;
    }
}

// Lane i of the result = lane index_i of a then b, side by side (an index below the width picks a's lane,
// width + j b's lane j): the compiler's two-vector shuffle, one or two instructions.
template <typename Real, int... index>
[[gnu::always_inline]] inline Vec<Real> shuffle(const Vec<Real>& a, const Vec<Real>& b) {
#ifdef __clang__
    return __builtin_shufflevector(a, b, index...);
#else  // GCC's own shuffle, in every version (its __builtin_shufflevector came with GCC 12)
    using Index = std::conditional_t<sizeof(Real) == 4, int32_t, int64_t>;
    typedef Index Indices __attribute__((vector_size(kBytes)));
    return __builtin_shuffle(a, b, Indices{Index(index)...});
#endif
}

// The lane of a (below kWidth) or of b (kWidth on) that lane `lane` of a fold adds: its item's low half, or
// its high. Item i of a fold's result (width / 2 lanes from lane i · width / 2) is item i of a and b side by
// side, which starts at lane i · width of the pair.
constexpr int fold_source(int lane, int width, bool high) {
    const int half = width / 2;
    return lane / half * width + lane % half + (high ? half : 0);
}

// The sums of the lanes of a and b, halved: a and b each hold kWidth / width items of `width` lanes; the
// result holds their items in order, a's then b's, each the sum of its two halves (width / 2 lanes).
template <typename Real, int width, size_t... lane>
[[gnu::always_inline]] inline Vec<Real> fold(const Vec<Real>& a, const Vec<Real>& b, std::index_sequence<lane...>) {
    return shuffle<Real, fold_source(lane, width, false)...>(a, b) +
           shuffle<Real, fold_source(lane, width, true)...>(a, b);
}

// v[0 … width) each hold kWidth / width items of `width` lanes; afterwards v[0] holds every item's sum, in
// order: folds of pairs, then of pairs of their results, down to items of one lane.
template <typename Real, int width>
[[gnu::always_inline]] inline void fold_down(Vec<Real>* v) {
    constexpr auto lanes = std::make_index_sequence<kWidth<Real>>{};
    for (int k = 0; k < width / 2; ++k) v[k] = fold<Real, width>(v[2 * k], v[2 * k + 1], lanes);
    if constexpr (width > 2) fold_down<Real, width / 2>(v);
}

// Lane k = the sum of v[k]'s lanes, for kWidth vectors v (overwritten): a tree of kWidth − 1 folds, two
// shuffles and an addition each, where kWidth reductions one by one would take log₂ kWidth shuffles and
// additions apiece. Each lane's sum pairs its lanes as `total` does (i with i + kWidth/2, then with
// i + kWidth/4, …), so lane k equals total(v[k]) exactly.
template <typename Real>
[[gnu::always_inline]] inline Vec<Real> lane_sums(Vec<Real> (&v)[kWidth<Real>]) {
    fold_down<Real, kWidth<Real>>(v);
    return v[0];
}

// out[e] = scale · Σ_t a[t]·b_e[t] for the `count` rows b_e = rows + index[e]·depth: a vector's width of rows
// at a time, each row's per-lane sums as `dot` keeps them, then all their lane sums in one fold tree
// (lane_sums pairs lanes as `dot`'s total does, so each sum is `dot`'s to the bit), where a reduction per
// row would cost more than its few multiply-adds.
template <typename Real, typename Index>
void scaled_dots(const Real* a, const Real* rows, const Index* index, int64_t count, int64_t depth, Real scale,
                 Real* out) {
    constexpr int64_t w = kWidth<Real>;
    for (int64_t e0 = 0; e0 < count; e0 += w) {
        const int64_t batch = std::min(w, count - e0);
        Vec<Real> sums[w] = {};
        for (int64_t e = 0; e < batch; ++e) {
            const Real* b = rows + static_cast<int64_t>(index[e0 + e]) * depth;
            for (int64_t t = 0; t < depth; t += w) {
                const int64_t valid = std::min(w, depth - t);
                sums[e] += load<Real>(a + t, valid) * load<Real>(b + t, valid);
            }
        }
        store<Real>(out + e0, scale * lane_sums<Real>(sums), batch);
    }
}

// One stage of a transpose of a square of vectors (rows a, b = a + bit of it): the lanes of a with `bit`
// set trade places with the lanes of b without it, a[i + bit] ↔ b[i]; over bit = 1, 2, 4, ... lane i of row
// r ends where lane r of row i was.
template <int bit, typename Real, size_t... lane>
void exchange(Vec<Real>& a, Vec<Real>& b, std::index_sequence<lane...>) {
    constexpr int n = sizeof...(lane);
    const Vec<Real> low = shuffle<Real, (lane & bit ? int(lane) - bit + n : int(lane))...>(a, b);
    const Vec<Real> high = shuffle<Real, (lane & bit ? int(lane) + n : int(lane) + bit)...>(a, b);
    a = low, b = high;
}

template <int bit, typename Real, int n>
void stage(Vec<Real> (&rows)[n]) {
    for (int r = 0; r < n; ++r)
        if (!(r & bit)) exchange<bit, Real>(rows[r], rows[r + bit], std::make_index_sequence<n>{});
}

// panel[t][c] = x[rows[c]][t] for c < count, t < depth (panel rows of `stride`): squares of a vector's width
// of lanes at a time, read as whole rows and transposed in registers, so that every write is a whole vector
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
            stage<1, Real, n>(square), stage<2, Real, n>(square);
            if constexpr (n > 4) stage<4, Real, n>(square);
            if constexpr (n > 8) stage<8, Real, n>(square);
            for (int j = 0; j < n; ++j) store<Real>(panel + (t + j) * stride + c, square[j], valid);
        }
        for (; t < depth; ++t) {
            Vec<Real> column;
            for (int j = 0; j < n; ++j) column[j] = from[j][t];
            store<Real>(panel + t * stride + c, column, valid);
        }
    }
}

// A tile of C: kRows rows × kVectors vectors of columns, its running sums in registers with the kVectors of B
// and one broadcast of A beside them. Each step of the inner dimension loads kVectors vectors and 6 scalars for
// 6 · kVectors fused multiply-adds: 24 sums of AVX-512's 32 registers, 12 of AVX2's 16.
constexpr int kRows = 6;
constexpr int kVectors = kBytes == 64 ? 4 : 2;

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
    // column strips outside, so a strip of B (depth × kVectors vectors: 16 KiB at depth 64 with AVX-512)
    // stays in the first-level cache while every tile of rows passes over it
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

// Runs `allocate`, a thread's allocation of its buffers inside a parallel region: false when memory ran out
// (bad_alloc, or length_error past what a vector may hold), which it records in `short_of_memory`. An
// exception may not leave a parallel region, so the thread goes through its loop without work, and the
// caller throws bad_alloc after the region (which `guarded` turns into a status).
template <typename F>
bool allocated(F&& allocate, std::atomic<bool>& short_of_memory) {
    try {
        allocate();
        return true;
    } catch (const std::exception&) {
        short_of_memory = true;
        return false;
    }
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

}  // namespace vectors

// The vectors' width in bytes where multiply-adds are fused and the register tiles fit the registers (64 with
// AVX-512, 32 with AVX2 and FMA), else 0: there the tiles would spill, and the tensor references are as fast.
// Each kernel's Python side says which widths it runs on. (Each kernel is a library of its own, so each
// exports this once.)
extern "C" int vector_bytes() {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    return vectors::kBytes;
#else
    return 0;
#endif
}
