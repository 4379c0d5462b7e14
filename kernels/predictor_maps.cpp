// The per-token maps of a learned bucket predictor, in one pass over the tokens each:
//
//     head MLP           y = W σ(V x + c) + b          (a head's d → e → r map; y = W x + b when linear)
//     nearest centroids  ids = arg top-k_j (‖c_j‖² − 2 y·c_j)      (the k nearest of B centroids, nearest first)
//
// The references are pipeline/projection/model.py's HeadProjections (tanh folded into σ: W tanh(u) + b =
// 2W σ(2u) + b − W 1, the caller's to fold) and pipeline/predictors/kmeans.py's nearest_centroids, both a
// few tensor passes over the whole sequence; here a chunk of tokens goes through every step while it is in
// the first-level cache, and the products run on the register tiles of vectors.h. Tokens are independent,
// so the results do not depend on the thread count; they differ from the references by round-off only.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "vectors.h"

namespace {

using vectors::allocated, vectors::exp_lanes, vectors::guarded, vectors::kWidth, vectors::pack_transposed, vectors::product,
    vectors::store, vectors::Vec;

constexpr int64_t kChunk = 64;  // tokens a thread takes at once: a tile's 4 vectors of lanes

// σ(u) = 1 / (1 + e^{−u}); e^{−u} capped at e^88 (finite), where σ is below 1e-38. With AVX-512 the
// reciprocal is the 14-bit estimate and one Newton step, r(2 − a r) (about 1 ulp; a division takes several
// times longer).
inline Vec<float> sigmoid(Vec<float> u) {
    const Vec<float> cap = Vec<float>{} + 88.0f;
    const Vec<float> a = 1.0f + exp_lanes(-u > cap ? cap : -u);
#ifdef __AVX512F__
    const Vec<float> r = static_cast<Vec<float>>(_mm512_rcp14_ps(static_cast<__m512>(a)));
    return r * (2.0f - a * r);
#else
    return 1.0f / a;
#endif
}

// The `count` (≤ 16) floats from[0], from[step], …, from[(count − 1) · step] in a vector, 0 after them.
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
#ifdef __clang__
    return __builtin_shufflevector(a, b, (2 * int(lane) + odd)...);
#else
    typedef int32_t Indices __attribute__((vector_size(64)));
    return __builtin_shuffle(a, b, Indices{(2 * int32_t(lane) + odd)...});
#endif
}

// rows[t · stride] = coordinate t of the 16 points from[0 … 16 · R) (rows of R, a power of two ≤ 16), point
// p in lane p, with no gather: whole vectors, unzipped log₂ R times in registers. An unzip moves the sequence's
// index i (of N) to (i mod 2) · N/2 + ⌊i / 2⌋, a rotation of its bits by one, so log₂ R of them take
// p · R + t to t · 16 + p. Each unzip makes vector k < R/2 of the even lanes of vectors 2k and 2k + 1, and
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

// out[row] = W_h σ(V_h x[row] + c_h) + b_h for the rows of groups (batch · heads) of n rows, head h = group
// mod heads; with hidden == 0, out[row] = W_h x[row] + b_h. x rows of d; hidden_weight (heads, hidden, d)
// holds V, hidden_bias (heads, hidden) c, weight (heads, rank, f) W (f = hidden, or d when linear), out_bias
// (heads, rank) b; out rows of `rank`.
//
// A chunk of kChunk tokens is transposed first, so that tokens run along the lanes: the hidden units are the
// product V · xᵀ (hidden × kChunk), σ runs over whole vectors of them, and the outputs are the product
// W · σ (rank × kChunk), whose rows fill a tile's lanes (a token's few outputs would fill a sixteenth).
void head_mlp(const float* x, const float* hidden_weight, const float* hidden_bias, const float* weight,
              const float* out_bias, int64_t groups, int64_t heads, int64_t n, int64_t d, int64_t hidden,
              int64_t rank, float* out, int threads) {
    const int64_t depth = hidden > 0 ? hidden : d, chunks = (n + kChunk - 1) / kChunk;
    std::atomic<bool> short_of_memory{false};
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        // the chunk's xᵀ (d × kChunk), hidden units (hidden × kChunk) and outputs (rank × kChunk); row
        // pointers into them and into the weights
        std::vector<float> inputs, units, outputs;
        std::vector<int64_t> tokens;
        std::vector<const float*> input_rows, feature_rows, maps;
        std::vector<float*> unit_rows, output_rows;
        const bool ready = allocated(
            [&] {
                inputs.assign(d * kChunk, 0.0f), units.assign(hidden * kChunk, 0.0f);
                outputs.assign(rank * kChunk, 0.0f), tokens.resize(kChunk);
                input_rows.resize(d), feature_rows.resize(depth), maps.resize(std::max(hidden, rank));
                unit_rows.resize(hidden), output_rows.resize(rank);
            },
            short_of_memory);
        for (int64_t t = 0; ready && t < d; ++t) input_rows[t] = inputs.data() + t * kChunk;
        for (int64_t e = 0; ready && e < hidden; ++e) unit_rows[e] = units.data() + e * kChunk;
        for (int64_t j = 0; ready && j < rank; ++j) output_rows[j] = outputs.data() + j * kChunk;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < groups * chunks; ++task) {
            if (!ready) continue;
            const int64_t group = task / chunks, head = group % heads, first = task % chunks * kChunk;
            const int64_t count = std::min(kChunk, n - first);
            for (int64_t i = 0; i < count; ++i) tokens[i] = group * n + first + i;
            // the rows after this chunk's (its thread's next task) on their way from memory while it runs
            const int64_t following = group * n + first + count;
            const int64_t ahead = std::min(kChunk, groups * n - following) * d;
            for (int64_t j = 0; j < ahead; j += kWidth<float>) __builtin_prefetch(x + following * d + j);
            pack_transposed(x, tokens.data(), count, d, inputs.data(), kChunk);  // lanes past count: stale
            if (hidden > 0) {
                for (int64_t e = 0; e < hidden; ++e) maps[e] = hidden_weight + (head * hidden + e) * d;
                product(maps.data(), 1, hidden, input_rows.data(), d, kChunk, unit_rows.data());
                for (int64_t e = 0; e < hidden; ++e) {  // σ over a row of units: whole vectors
                    for (int64_t i = 0; i < kChunk; i += kWidth<float>) {
                        Vec<float> u;
                        std::memcpy(&u, unit_rows[e] + i, sizeof u);
                        u = sigmoid(u + hidden_bias[head * hidden + e]);
                        std::memcpy(unit_rows[e] + i, &u, sizeof u);
                    }
                }
                std::copy(unit_rows.begin(), unit_rows.end(), feature_rows.begin());
            } else {
                std::copy(input_rows.begin(), input_rows.end(), feature_rows.begin());
            }
            for (int64_t j = 0; j < rank; ++j) maps[j] = weight + (head * rank + j) * depth;
            product(maps.data(), 1, rank, feature_rows.data(), depth, kChunk, output_rows.data());
            for (int64_t i = 0; i < count; ++i)
                for (int64_t j = 0; j < rank; ++j)
                    out[tokens[i] * rank + j] = output_rows[j][i] + out_bias[head * rank + j];
        }
    }
    if (short_of_memory) throw std::bad_alloc();
}

// ids[row] = the top_k nearest of a head's B centroids to point[row] (rows of `rank`), nearest first, ties
// to the lower index: with e_j = ‖c_j‖² − 2 point·c_j (NaN read as 0 and ±∞ as the largest floats, as the
// reference reads them: a NaN point ties everywhere and takes 0 … top_k − 1), each pass takes the first j
// at the smallest e_j left and leaves it out of the next (as +∞, above every finite e_j). scaled (heads,
// rank, B) holds −2 c, norms (heads, B) ‖c‖².
//
// kChunk points at a time, one per lane of kBlock vectors: every e_j of them first, then each pass one sweep
// over j keeping the least e_j so far and its j (a strict < keeps the first). The sweep is a chain of
// dependent steps, one per centroid; the kBlock vectors' chains interleave, so their latencies overlap.
// Only a chunk with a non-finite e_j needs the reference's reading of NaN and ±∞; for the others it
// changes nothing, so they skip it.
void nearest_centroids(const float* points, const float* scaled, const float* norms, int64_t groups,
                       int64_t heads, int64_t n, int64_t rank, int64_t centroids, int64_t top_k, int32_t* ids,
                       int threads) {
    constexpr int64_t lanes = kWidth<float>, kBlock = kChunk / lanes;
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
            const float* head_scaled = scaled + head * rank * centroids;
            const float* head_norms = norms + head * centroids;
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

extern "C" int nearest_centroids_float(const float* points, const float* scaled, const float* norms,
                                       int64_t groups, int64_t heads, int64_t n, int64_t rank, int64_t centroids,
                                       int64_t top_k, int32_t* ids, int threads) {
    return guarded([&] {
        nearest_centroids(points, scaled, norms, groups, heads, n, rank, centroids, top_k, ids, threads);
    });
}
