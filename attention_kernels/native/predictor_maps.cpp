// The per-token maps of a learned bucket predictor, in one pass over the tokens each:
//
//     head MLP           y = W tanh(V x + c) + b       (a head's d → e → r map; y = W x + b when linear)
//     nearest centroids  ids = arg top-k_j (‖c_j‖² − 2 y·c_j)      (the k nearest of B centroids, nearest first)
//
// The references are pipeline/projection/model.py's HeadProjections and pipeline/predictors/kmeans.py's
// nearest_centroids, both a few tensor passes over the whole sequence; here a tile of tokens goes through
// every step while it is in registers or the first-level cache. Tokens are independent, so the results do
// not depend on the thread count; they differ from the references by round-off only.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <vector>

#include "vectors.h"

namespace {

using vectors::allocated, vectors::exp_lanes, vectors::guarded, vectors::kWidth, vectors::lane_index,
    vectors::lane_sums, vectors::load, vectors::shuffle, vectors::store, vectors::Vec;

constexpr int64_t kChunk = 64;  // nearest_centroids: points a thread takes at once, 4 or 8 vectors of lanes

// σ(u) = 1 / (1 + e^{−u}), u clamped to ±87 so that e^{−u} stays finite (σ(87) is 1 in float, as is σ
// above 17; σ(−87) ≈ 1.6e-38 stands for the smaller values below; NaN stays NaN). With AVX-512, e^{−u} =
// 2^k e^r with k = round(−u log₂e) and r = −u − k ln 2 (ln 2 in two parts, so r is exact but for rounding),
// e^r = 1 + r Q(r) with Q of degree 5 fitted for relative error on |r| ≤ ln 2 / 2 (1e-7 in float, as
// Cephes' expf), 2^k put in by vscalefps; the reciprocal is the 14-bit estimate and one Newton step,
// c(2 − a c) (about 1 ulp; a division takes several times longer). 17 instructions a vector.
inline Vec<float> sigmoid(Vec<float> u) {
#ifdef __AVX512F__
    const __m512 x = _mm512_min_ps(_mm512_set1_ps(87.0f), _mm512_max_ps(_mm512_set1_ps(-87.0f), __m512(u)));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(-1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmsub_ps(k, _mm512_set1_ps(0.693359375f), x);  // −u − k ln 2's leading bits
    r = _mm512_fmadd_ps(k, _mm512_set1_ps(2.12194440e-4f), r);         // + k (their excess over ln 2)
    __m512 q = _mm512_set1_ps(1.384365372e-3f);
    for (const float coefficient : {8.374155499e-3f, 4.166800156e-2f, 1.666643173e-1f, 4.999999404e-1f, 1.0f, 1.0f})
        q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(coefficient));
    const __m512 a = _mm512_add_ps(_mm512_scalef_ps(q, k), _mm512_set1_ps(1.0f));
    const __m512 c = _mm512_rcp14_ps(a);
    return Vec<float>(_mm512_mul_ps(c, _mm512_fnmadd_ps(a, c, _mm512_set1_ps(2.0f))));
#else
    const Vec<float> cap = Vec<float>{} + 88.0f;
    return 1.0f / (1.0f + exp_lanes(-u > cap ? cap : -u));
#endif
}

// The `count` (≤ kWidth) floats from[0], from[step], …, from[(count − 1) · step] in a vector, 0 after them.
inline Vec<float> gather(const float* from, int64_t step, int64_t count) {
#ifdef __AVX512F__
    const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(int32_t(step)));
    const __mmask16 valid = static_cast<__mmask16>((1u << count) - 1);
    return static_cast<Vec<float>>(_mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, at, from, 4));
#else
    Vec<float> v = {};
    for (int64_t lane = 0; lane < count; ++lane) v[lane] = from[lane * step];
    return v;
#endif
}

// Whether every lane of v is finite (neither NaN nor ±∞).
inline bool finite(const Vec<float>& v) {
#ifdef __AVX512DQ__
    return _mm512_fpclass_ps_mask(static_cast<__m512>(v), 0x99) == 0;  // quiet and signalling NaN, ±∞
#else
    for (int64_t lane = 0; lane < kWidth<float>; ++lane)
        if (!std::isfinite(v[lane])) return false;
    return true;
#endif
}

// The even (odd = 0) or odd (odd = 1) lanes of a then b: the front or back half of their sequence unzipped.
template <int odd, size_t... lane>
Vec<float> alternate(const Vec<float>& a, const Vec<float>& b, std::index_sequence<lane...>) {
    return shuffle<float, (2 * int(lane) + odd)...>(a, b);
}

// rows[t · stride] = coordinate t of the w = kWidth points from[0 … w · R) (rows of R, a power of two ≤ 16),
// point p in lane p, with no gather: whole vectors, unzipped log₂ R times in registers. An unzip moves the
// sequence's index i (of N) to (i mod 2) · N/2 + ⌊i / 2⌋, a rotation of its bits by one, so log₂ R of them
// take p · R + t to t · w + p. Each unzip makes vector k < R/2 of the even lanes of vectors 2k and 2k + 1, and
// vector R/2 + k of their odd lanes.
template <int R>
void unzip_points(const float* from, Vec<float>* rows, int64_t stride) {
    constexpr auto lanes = std::make_index_sequence<kWidth<float>>{};
    Vec<float> v[R], unzipped[R];
    for (int k = 0; k < R; ++k) std::memcpy(&v[k], from + k * kWidth<float>, sizeof v[k]);
    for (int round = 1; round < R; round *= 2) {
        for (int k = 0; k < R / 2; ++k) {
            unzipped[k] = alternate<0>(v[2 * k], v[2 * k + 1], lanes);
            unzipped[R / 2 + k] = alternate<1>(v[2 * k], v[2 * k + 1], lanes);
        }
        std::copy(unzipped, unzipped + R, v);
    }
    for (int t = 0; t < R; ++t) rows[t * stride] = v[t];
}

// unzip_points for a rank known only at run time; false (nothing done) unless it is 1, 2, 4, 8 or 16.
inline bool unzip_points(const float* from, int64_t rank, Vec<float>* rows, int64_t stride) {
    switch (rank) {
        case 1: return unzip_points<1>(from, rows, stride), true;
        case 2: return unzip_points<2>(from, rows, stride), true;
        case 4: return unzip_points<4>(from, rows, stride), true;
        case 8: return unzip_points<8>(from, rows, stride), true;
        case 16: return unzip_points<16>(from, rows, stride), true;
        default: return false;
    }
}

// A tile's tokens, and the vectors of hidden units it sums at once: 24 running sums of AVX-512's 32 registers,
// 12 of AVX2's 16.
constexpr int kTokens = kWidth<float> == 16 ? 12 : 6;
constexpr int kSlice = 2;
constexpr int64_t kSliceUnits = kSlice * kWidth<float>;
// Tiles between the one a linear map reads and the one it prefetches: once x outgrows the last-level cache
// (q and k of 8 heads × 8k tokens), its tiles are too quick for the processor's own prefetching (4 tiles
// ahead: 0.5-0.56× the time of none for q and k at 8k-16k). An MLP does without: there they cost 2-3 % at
// 2k-4k, where the predictor's share of an attention call is largest, and gained 0-10 % at 8k-16k, from run
// to run (the last-level cache is shared with whatever else runs).
constexpr int64_t kAhead = 4;

// partial[r · rank + j] = (what it held, unless `first`) + Σ_v f[r][v] ⊙ W_j[v] for the kTokens rows' slice f
// of features and the same slice of each map row W_j = maps[j · stride …]: lane-wise shares of the outputs
// y_rj = Σ_e W_je f_re, whose lanes finish_outputs adds up.
template <int V>
void add_partials(const Vec<float> (&f)[kTokens][V], const float* maps, int64_t stride, int64_t rank, bool first,
                  Vec<float>* partial) {
    for (int64_t j = 0; j < rank; ++j) {
        Vec<float> w[V];
        for (int v = 0; v < V; ++v) w[v] = load(maps + j * stride + v * kWidth<float>);
        for (int r = 0; r < kTokens; ++r) {
            Vec<float> sum = first ? Vec<float>{} : partial[r * rank + j];
            for (int v = 0; v < V; ++v) sum += f[r][v] * w[v];
            partial[r * rank + j] = sum;
        }
    }
}

// out[p] = the sum of partial[p]'s lanes + bias[p] for the `outputs` outputs of a tile, (r, j) in order as
// they lie in memory: a vector's lanes at a time in one vector (partial readable and zero up to whole vectors
// of them).
void finish_outputs(const Vec<float>* partial, const float* bias, int64_t outputs, float* out) {
    constexpr int64_t lanes = kWidth<float>;
    for (int64_t p = 0; p < outputs; p += lanes) {
        Vec<float> sums[lanes];
        std::copy_n(partial + p, lanes, sums);
        store<float>(out + p, lane_sums<float>(sums) + load(bias + p), std::min(lanes, outputs - p));
    }
}

// sum[r][v] = Σ_t x_rt M_t,s+wv+lane (w = kWidth) for the kTokens rows x_r = rows[r · d …] and V vectors of M's
// columns from s on (M given as its d rows of `width`): a broadcast product, each sum over x's coordinates in
// order.
// With D > 0 (d known when compiled) a row's coordinate t is an offset from one pointer; for a d known only
// at run time the rows' offsets take registers the sums need.
template <int64_t D, int V>
void broadcast_product(const float* rows, int64_t d_at_run_time, const float* m, int64_t width, int64_t s,
                       Vec<float> (&sum)[kTokens][V]) {
    const int64_t d = D > 0 ? D : d_at_run_time;
    for (int r = 0; r < kTokens; ++r)
        for (int v = 0; v < V; ++v) sum[r][v] = Vec<float>{};
    for (int64_t t = 0; t < d; ++t) {
        Vec<float> column[V];
        for (int v = 0; v < V; ++v) column[v] = load(m + t * width + s + v * kWidth<float>);
        for (int r = 0; r < kTokens; ++r) {
            const float coordinate = rows[r * d + t];
            for (int v = 0; v < V; ++v) sum[r][v] += coordinate * column[v];
        }
    }
}

// The maps of a head, laid out for a tile: `transposed` is Vᵀ (d × units) and `bias` c (units) for an MLP,
// Wᵀ (d × units) and b for a linear map (units: the outputs, whole vectors); `maps` is W (rank rows, of
// the hidden units or of x's coordinates, whole vectors) and `out_bias` b repeated in the outputs' order
// (whole vectors), for the lane sums. Zero in the padding.
struct HeadMaps {
    const float *transposed, *bias, *maps, *out_bias;
};

// A tile's outputs, count · rank of them from `out` on. MLP (hidden > 0): a slice of hidden units at a time
// in registers, σ over them, their shares of the outputs added up (add_partials, finish_outputs). Linear:
// the outputs themselves are the slices (the product of x with Wᵀ, a token's rank outputs in the lanes),
// stored a row at a time.
template <int64_t D>
void tile(const float* rows, int64_t d, const HeadMaps& head, int64_t hidden, int64_t units, int64_t rank,
          int64_t count, Vec<float>* partial, float* out) {
    constexpr int64_t lanes = kWidth<float>;
    if (hidden > 0) {
        for (int64_t s = 0; s < units; s += kSliceUnits) {
            Vec<float> sum[kTokens][kSlice];
            broadcast_product<D, kSlice>(rows, d, head.transposed, units, s, sum);
            for (int v = 0; v < kSlice; ++v) {
                const Vec<float> c = load(head.bias + s + v * lanes);
                for (int r = 0; r < kTokens; ++r) sum[r][v] = sigmoid(sum[r][v] + c);
                const int64_t real = hidden - s - v * lanes;  // units of the layer in this vector, the rest padding
                if (real >= lanes) continue;
                // a padding unit must be 0, not σ(0): where x holds ±∞ its sum is 0 · ∞ = NaN, and a zero
                // weight would carry that NaN into the outputs
                const Vec<int32_t> unit = lane_index<int32_t>() < int32_t(real);
                for (int r = 0; r < kTokens; ++r) sum[r][v] = unit ? sum[r][v] : Vec<float>{};
            }
            add_partials<kSlice>(sum, head.maps + s, units, rank, s == 0, partial);
        }
        finish_outputs(partial, head.out_bias, count * rank, out);
        return;
    }
    for (int64_t s = 0; s < rank; s += lanes) {
        Vec<float> sum[kTokens][1];
        broadcast_product<D, 1>(rows, d, head.transposed, units, s, sum);
        const Vec<float> b = load(head.bias + s);
        for (int64_t r = 0; r < count; ++r) store<float>(out + r * rank + s, sum[r][0] + b, std::min(lanes, rank - s));
    }
}

// A linear map's outputs for `count` rows x_r = rows[r · d …] (rows past count: the last row's sums, not
// written), when the rank R divides a vector's w = kWidth lanes: w / R rows give a vector of outputs (r, j)
// in their order in memory, each the sum of the lanes of x_r ⊙ W_j over d's vectors, w running sums in
// registers (the broadcast product would use R of a vector's w lanes). maps: W (R × stride, zero past d); bias: b
// repeated over a vector.
template <int R>
void linear_rows(const float* rows, int64_t d, const float* maps, int64_t stride, const float* bias, int64_t count,
                 float* out) {
    constexpr int64_t lanes = kWidth<float>, per_vector = lanes / R;
    const Vec<float> b = load(bias);
    for (int64_t r0 = 0; r0 < count; r0 += per_vector) {
        const float* x_r[per_vector];
        for (int64_t q = 0; q < per_vector; ++q) x_r[q] = rows + std::min(r0 + q, count - 1) * d;
        Vec<float> sums[lanes] = {};
        for (int64_t s = 0; s < d; s += lanes) {
            const int64_t valid = std::min(lanes, d - s);
            for (int64_t q = 0; q < per_vector; ++q) {
                const Vec<float> coordinates = load(x_r[q] + s, valid);
                for (int j = 0; j < R; ++j) sums[q * R + j] += coordinates * load(maps + j * stride + s);
            }
        }
        store<float>(out + r0 * R, lane_sums<float>(sums) + b, std::min(lanes, (count - r0) * R));
    }
}

// out[row] = W_h tanh(V_h x[row] + c_h) + b_h for the rows of groups (batch · heads) of n rows, head h =
// group mod heads; with hidden == 0, out[row] = W_h x[row] + b_h. x rows of d; hidden_weight (heads, hidden,
// d) holds V, hidden_bias (heads, hidden) c, weight (heads, rank, f) W (f = hidden, or d when linear),
// out_bias (heads, rank) b; out rows of `rank`.
//
// Tokens run down a tile's rows and features along the lanes: the first layer is the broadcast product of
// x's coordinates (read where x lies: no transposition) with the transposed map, σ runs over its results in
// registers, and a token's few outputs are lane sums of products with W's rows. The maps are laid out once
// per call, tanh folded into σ as they are: W tanh(u) + b = 2W σ(2u) + (b − W 1), the doubling exact.
void head_mlp(const float* x, const float* hidden_weight, const float* hidden_bias, const float* weight,
              const float* out_bias, int64_t groups, int64_t heads, int64_t n, int64_t d, int64_t hidden,
              int64_t rank, float* out, int threads) {
    constexpr int64_t lanes = kWidth<float>;
    // a linear map of a rank dividing a vector's lanes runs as lane sums (linear_rows), any other through its transpose
    const bool lane_sums_only = hidden == 0 && rank > 0 && lanes % rank == 0;
    const int64_t first_out = hidden > 0 ? hidden : rank;  // the first layer's outputs, and their count padded:
    const int64_t units = hidden > 0 ? (hidden + kSliceUnits - 1) / kSliceUnits * kSliceUnits  // whole slices
                                     : (rank + lanes - 1) / lanes * lanes;                     // whole vectors
    const int64_t stride = hidden > 0 ? units : (d + lanes - 1) / lanes * lanes;  // W's rows, padded
    const int64_t outputs = kTokens * rank, whole = (outputs + lanes - 1) / lanes * lanes;
    // per head: the first layer transposed (2Vᵀ and 2c, or Wᵀ and b; d × units and units), W (2W: rank ×
    // stride) and b (b − W 1) repeated in the outputs' order (whole); zero in the padding (whose hidden units
    // tile sets to 0)
    const float* first_map = hidden > 0 ? hidden_weight : weight;
    const float* first_bias = hidden > 0 ? hidden_bias : out_bias;
    const float scale = hidden > 0 ? 2.0f : 1.0f;
    std::vector<float> transposed(heads * d * units), biases(heads * units);
    std::vector<float> maps(heads * rank * stride), out_biases(heads * whole), folded(rank);
    for (int64_t h = 0; h < heads; ++h) {
        for (int64_t e = 0; e < first_out; ++e) {
            for (int64_t t = 0; t < d; ++t)
                transposed[(h * d + t) * units + e] = scale * first_map[(h * first_out + e) * d + t];
            biases[h * units + e] = scale * first_bias[h * first_out + e];
        }
        const int64_t depth = hidden > 0 ? hidden : d;
        for (int64_t j = 0; j < rank; ++j) {
            const float* w = weight + (h * rank + j) * depth;
            std::transform(w, w + depth, maps.begin() + (h * rank + j) * stride, [&](float v) { return scale * v; });
            folded[j] = hidden > 0 ? float(out_bias[h * rank + j] - std::accumulate(w, w + depth, 0.0))
                                   : out_bias[h * rank + j];
        }
        for (int64_t p = 0; p < whole; ++p) out_biases[h * whole + p] = folded[p % rank];
    }
    std::atomic<bool> short_of_memory{false};
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        std::vector<Vec<float>> partial;  // a tile's partial sums, zero past its outputs
        std::vector<float> last;          // the sequence's last, partial tile of x: zero past its rows
        const bool ready = allocated([&] { partial.resize(whole), last.assign(kTokens * d, 0.0f); }, short_of_memory);
#pragma omp for collapse(2) schedule(static)
        for (int64_t group = 0; group < groups; ++group) {
            for (int64_t first = 0; first < n; first += kTokens) {
                if (!ready) continue;
                const int64_t h = group % heads, count = std::min<int64_t>(kTokens, n - first);
                const float* rows = x + (group * n + first) * d;
                if (hidden == 0) {  // the rows kAhead tiles on (this thread's next tasks) on their way
                    const int64_t at = group * n + first + kAhead * kTokens;
                    const int64_t ahead = std::clamp<int64_t>(groups * n - at, 0, kTokens) * d;
                    for (int64_t j = 0; j < ahead; j += lanes) __builtin_prefetch(x + at * d + j);
                }
                if (count < kTokens) {
                    std::copy_n(rows, count * d, last.begin());
                    rows = last.data();
                }
                const HeadMaps head{transposed.data() + h * d * units, biases.data() + h * units,
                                    maps.data() + h * rank * stride, out_biases.data() + h * whole};
                float* to = out + (group * n + first) * rank;
                const float* w = head.maps, *b = head.out_bias;
                switch (lane_sums_only ? rank : 0) {
                    case 1: linear_rows<1>(rows, d, w, stride, b, count, to); continue;
                    case 2: linear_rows<2>(rows, d, w, stride, b, count, to); continue;
                    case 4: linear_rows<4>(rows, d, w, stride, b, count, to); continue;
                    case 8: linear_rows<8>(rows, d, w, stride, b, count, to); continue;
                    case 16:
                        if constexpr (lanes == 16) {
                            linear_rows<16>(rows, d, w, stride, b, count, to);
                            continue;
                        }
                        break;
                    default: break;
                }
                switch (d) {
                    case 64: tile<64>(rows, d, head, hidden, units, rank, count, partial.data(), to); break;
                    case 128: tile<128>(rows, d, head, hidden, units, rank, count, partial.data(), to); break;
                    default: tile<0>(rows, d, head, hidden, units, rank, count, partial.data(), to); break;
                }
            }
        }
    }
    if (short_of_memory) throw std::bad_alloc();
}

// ids[row] = the top_k nearest of a head's B centroids to point[row] (rows of `rank`), nearest first, ties
// to the lower index: with e_j = ‖c_j‖² − 2 point·c_j (NaN read as 0 and ±∞ as the largest floats, as the
// reference reads them: a NaN point ties everywhere and takes 0 … top_k − 1), each pass takes the first j
// at the smallest e_j left and leaves it out of the next (as +∞, above every finite e_j). means (heads, B,
// rank) holds the centroids c_j.
//
// kChunk points at a time, one per lane of kBlock vectors: every e_j of them first, then each pass one sweep
// over j keeping the least e_j so far and its j (a strict < keeps the first). The sweep is a chain of
// dependent steps, one per centroid; the kBlock vectors' chains interleave, so their latencies overlap.
// Only a chunk with a non-finite e_j needs the reference's reading of NaN and ±∞; for the others it
// changes nothing, so they skip it.
void nearest_centroids(const float* points, const float* means, int64_t groups, int64_t heads, int64_t n,
                       int64_t rank, int64_t centroids, int64_t top_k, int32_t* ids, int threads) {
    constexpr int64_t lanes = kWidth<float>, kBlock = kChunk / lanes;
    // per head: −2 c laid out (rank, B), so that a coordinate's factors lie in a row, and ‖c_j‖² (B)
    std::vector<float> scaled(heads * rank * centroids), norms(heads * centroids);
    for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < centroids; ++j) {
            const float* c = means + (h * centroids + j) * rank;
            for (int64_t t = 0; t < rank; ++t) scaled[(h * rank + t) * centroids + j] = -2.0f * c[t];
            norms[h * centroids + j] = float(std::inner_product(c, c + rank, c, 0.0));
        }
    }
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    const Vec<float> inf = Vec<float>{} + std::numeric_limits<float>::infinity();
    const Vec<float> largest = Vec<float>{} + std::numeric_limits<float>::max();
    std::atomic<bool> short_of_memory{false};
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        // coordinate t of the chunk's points, e_j and the nearest of each pass: kBlock vectors each
        std::vector<Vec<float>> coordinates, energy;
        std::vector<Vec<int32_t>> nearest;
        const bool ready = allocated(
            [&] {
                coordinates.resize(rank * kBlock), energy.resize(centroids * kBlock);
                nearest.resize(top_k * kBlock);
            },
            short_of_memory);
#pragma omp for schedule(static)
        for (int64_t task = 0; task < groups * chunks; ++task) {
            if (!ready) continue;
            const int64_t group = task / chunks, head = group % heads, first = task % chunks * kChunk;
            const int64_t count = std::min(kChunk, n - first);
            const float* from = points + (group * n + first) * rank;
            for (int64_t v = 0; v < kBlock; ++v) {
                const int64_t valid = std::clamp<int64_t>(count - v * lanes, 0, lanes);
                if (valid < lanes || !unzip_points(from + v * lanes * rank, rank, &coordinates[v], kBlock)) {
                    for (int64_t t = 0; t < rank; ++t)  // a gather per coordinate (slower)
                        coordinates[t * kBlock + v] = gather(from + v * lanes * rank + t, rank, valid);
                }
            }
            const float* head_scaled = scaled.data() + head * rank * centroids;
            const float* head_norms = norms.data() + head * centroids;
            Vec<float> total[kBlock] = {};  // Σ_j e_j: finite only when every e_j is (or an overflow)
            for (int64_t j = 0; j < centroids; ++j) {
                Vec<float> e[kBlock];
                for (int64_t v = 0; v < kBlock; ++v) e[v] = Vec<float>{} + head_norms[j];
                for (int64_t t = 0; t < rank; ++t) {
                    const float c = head_scaled[t * centroids + j];
                    for (int64_t v = 0; v < kBlock; ++v) e[v] += coordinates[t * kBlock + v] * c;
                }
                for (int64_t v = 0; v < kBlock; ++v) total[v] += e[v], energy[j * kBlock + v] = e[v];
            }
            for (int64_t v = 1; v < kBlock; ++v) total[0] += total[v];
            if (!finite(total[0])) {
                for (Vec<float>& e : energy) {
                    e = e == e ? e : Vec<float>{};  // NaN: 0
                    e = e > largest ? largest : e < -largest ? -largest : e;
                }
            }
            for (int64_t s = 0; s < top_k; ++s) {
                Vec<float> least[kBlock];
                Vec<int32_t> which[kBlock] = {};
                for (int64_t v = 0; v < kBlock; ++v) least[v] = energy[v];
                for (int64_t j = 1; j < centroids; ++j) {
                    for (int64_t v = 0; v < kBlock; ++v) {
                        const Vec<int32_t> below = energy[j * kBlock + v] < least[v];
                        least[v] = below ? energy[j * kBlock + v] : least[v];
                        which[v] = below ? int32_t(j) : which[v];
                    }
                }
                for (int64_t v = 0; v < kBlock; ++v) nearest[s * kBlock + v] = which[v];
                if (s + 1 == top_k) break;
                for (int64_t j = 0; j < centroids; ++j)
                    for (int64_t v = 0; v < kBlock; ++v)
                        energy[j * kBlock + v] = which[v] == int32_t(j) ? inf : energy[j * kBlock + v];
            }
            int32_t* to = ids + (group * n + first) * top_k;
            for (int64_t v = 0; v < kBlock && v * lanes < count; ++v) {
                const int64_t valid = std::min(lanes, count - v * lanes);
                if (top_k == 1) {
                    store<int32_t>(to + v * lanes, nearest[v], valid);
                    continue;
                }
                for (int64_t lane = 0; lane < valid; ++lane)
                    for (int64_t s = 0; s < top_k; ++s)
                        to[(v * lanes + lane) * top_k + s] = nearest[s * kBlock + v][lane];
            }
        }
    }
    if (short_of_memory) throw std::bad_alloc();
}

}  // namespace

extern "C" int head_mlp_float(const float* x, const float* hidden_weight, const float* hidden_bias,
                              const float* weight, const float* out_bias, int64_t groups, int64_t heads,
                              int64_t n, int64_t d, int64_t hidden, int64_t rank, float* out, int threads) {
    return guarded([&] {
        head_mlp(x, hidden_weight, hidden_bias, weight, out_bias, groups, heads, n, d, hidden, rank, out,
                 threads);
    });
}

extern "C" int nearest_centroids_float(const float* points, const float* means, int64_t groups, int64_t heads,
                                       int64_t n, int64_t rank, int64_t centroids, int64_t top_k, int32_t* ids,
                                       int threads) {
    return guarded(
        [&] { nearest_centroids(points, means, groups, heads, n, rank, centroids, top_k, ids, threads); });
}
