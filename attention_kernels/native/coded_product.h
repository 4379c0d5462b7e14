// Scores from 7-bit codes: the approximate mode's low-rank products in integers, where AVX2's u8 × s8
// multiply-add (vpmaddubsw) does 32 products per instruction against a float FMA's 8, and AVX-512 VNNI's
// (vpdpbusd) 64, summed into 32-bit lanes in the same instruction.
//
// A vector x of floats is coded as x ≈ step·Q with step = max|x|/63 (1 where x is all zero) and
// Q = round(x/step) in [−63, 63] (round half to even), each query's and each key's row on its own grid: the
// grid of attention_kernels/index_grid.py, which puts the indexer's rows there first, so coding them
// here again finds the same Q exactly (x/step lies within a few float roundings of an integer of at most 63).
//
// A query's codes are stored as u = Q + 64 in [1, 127] (vpmaddubsw takes one side unsigned), a key's as Q
// itself, four channels to a 32-bit "quad"; then Σ_c Q_c K_c = Σ_c u_c K_c − 64·Σ_c K_c, the second term
// a correction per key. Each 16-bit lane of vpmaddubsw sums two products, |·| ≤ 2·127·63 = 16,002, so the
// lanes of two quads add in 16 bits without saturating (≤ 32,004 < 32,767) before vpmaddwd widens them:
// every sum is an exact integer, the same whatever the order, and a score is two roundings from it,
// (Σ − correction)·(scale·step_q)·step_k: the VNNI and AVX2 tiles give the same scores, bit for bit.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace coded {

constexpr int kLevels = 63;  // codes in [−kLevels, kLevels]
constexpr int kOffset = 64;  // a query's code u = Q + kOffset, unsigned

// The step of a row of `count` values: max|x|/kLevels, 1 where all are zero.
inline float step_of(const float* x, int64_t count) {
    float top = 0;
    for (int64_t i = 0; i < count; ++i) top = std::max(top, std::abs(x[i]));
    return top > 0 ? top / float(kLevels) : 1.0f;
}

// Q = round(x/step), clamped to the grid (values coded with another row's step stay in range).
inline int code_of(float x, float step) {
    const float q = std::nearbyint(x / step);
    return int(std::min(std::max(q, -float(kLevels)), float(kLevels)));
}

// Quads per row of `rank` channels: whole pairs of quads (the product adds two quads in 16 bits).
inline int64_t quads(int64_t rank) { return (rank + 7) / 8 * 2; }

// Scores c[r][col + j] = (Σ_c u_rc·K_jc − correction_j)·factor_r·step_j for R rows (a[r]: the row's quads,
// u bytes) against the keys col … col + 15 of a panel (panel[(t·width + j)·4 + i]: channel 4t + i of key j,
// `width` keys per quad); `pairs` pairs of quads.
template <int R>
void tile(const uint8_t* const* a, const int8_t* panel, int64_t width, int64_t pairs, const int32_t* correction,
          const float* step, const float* factor, int64_t col, float* const* c) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    // vpdpbusd: a 32-bit lane adds the four products of its u bytes and K bytes to its sum, in 32 bits (exact,
    // as the 16-bit path below), so a quad of 16 keys is one instruction per row
    __m512i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm512_setzero_si512();
    for (int64_t t = 0; t < 2 * pairs; ++t) {
        const __m512i keys = _mm512_loadu_si512(panel + (t * width + col) * 4);  // keys col … col + 15 of quad t
        for (int r = 0; r < R; ++r) {
            int32_t word;
            std::memcpy(&word, a[r] + 4 * t, sizeof word);
            sum[r] = _mm512_dpbusd_epi32(sum[r], _mm512_set1_epi32(word), keys);
        }
    }
    const __m512i fix = _mm512_loadu_si512(correction + col);
    const __m512 key_step = _mm512_loadu_ps(step + col);
    for (int r = 0; r < R; ++r) {
        const __m512 s = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum[r], fix));
        _mm512_storeu_ps(c[r] + col, _mm512_mul_ps(_mm512_mul_ps(s, _mm512_set1_ps(factor[r])), key_step));
    }
#elif defined(__AVX2__)
    __m256i sum[R][2];
    for (int r = 0; r < R; ++r) sum[r][0] = sum[r][1] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t t = 0; t < pairs; ++t) {
        const int8_t* first = panel + ((2 * t) * width + col) * 4;  // keys col … col + 15 of quad 2t
        const int8_t* second = first + width * 4;                   // and of quad 2t + 1
        const __m256i k00 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first));
        const __m256i k01 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + 32));
        const __m256i k10 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second));
        const __m256i k11 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second + 32));
        for (int r = 0; r < R; ++r) {
            int32_t word[2];
            std::memcpy(word, a[r] + 8 * t, sizeof word);
            const __m256i u0 = _mm256_set1_epi32(word[0]), u1 = _mm256_set1_epi32(word[1]);
            const __m256i low = _mm256_add_epi16(_mm256_maddubs_epi16(u0, k00), _mm256_maddubs_epi16(u1, k10));
            const __m256i high = _mm256_add_epi16(_mm256_maddubs_epi16(u0, k01), _mm256_maddubs_epi16(u1, k11));
            sum[r][0] = _mm256_add_epi32(sum[r][0], _mm256_madd_epi16(low, ones));
            sum[r][1] = _mm256_add_epi32(sum[r][1], _mm256_madd_epi16(high, ones));
        }
    }
    for (int v = 0; v < 2; ++v) {
        const __m256i fix = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(correction + col + 8 * v));
        const __m256 key_step = _mm256_loadu_ps(step + col + 8 * v);
        for (int r = 0; r < R; ++r) {
            const __m256 s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sum[r][v], fix));
            _mm256_storeu_ps(c[r] + col + 8 * v, _mm256_mul_ps(_mm256_mul_ps(s, _mm256_set1_ps(factor[r])), key_step));
        }
    }
#else
    for (int r = 0; r < R; ++r)
        for (int64_t j = col; j < col + 16; ++j) {
            int32_t sum = 0;
            for (int64_t t = 0; t < 2 * pairs; ++t)
                for (int i = 0; i < 4; ++i)
                    sum += int32_t(a[r][4 * t + i]) * int32_t(panel[(t * width + j) * 4 + i]);
            c[r][j] = float(sum - correction[j]) * factor[r] * step[j];
        }
#endif
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr int kRows = 8;  // rows per register tile: 8 sums, a key vector and the broadcasts, of 32 registers
#else
constexpr int kRows = 4;  // rows per register tile: 8 sums, 4 key vectors and the broadcasts fit 16 registers
#endif

// tile<R> for the R = `rows` < kRows rows left at the end of a tile's rows.
template <int R = kRows - 1>
void last_rows(int64_t rows, const uint8_t* const* a, const int8_t* panel, int64_t width, int64_t pairs,
               const int32_t* correction, const float* step, const float* factor, int64_t col, float* const* c) {
    if constexpr (R > 0) {
        if (rows == R) return tile<R>(a, panel, width, pairs, correction, step, factor, col, c);
        last_rows<R - 1>(rows, a, panel, width, pairs, correction, step, factor, col, c);
    }
}

// The scores of `rows` rows (a, factor, c per row) against the keys [0, cols) of a panel (`width` keys per
// quad; codes, corrections and steps readable up to cols rounded up to 16): c[r][0 … cols rounded up to 16)
// written.
inline void product(const uint8_t* const* a, const float* factor, int64_t rows, const int8_t* panel, int64_t width,
                    int64_t pairs, const int32_t* correction, const float* step, int64_t cols, float* const* c) {
    for (int64_t col = 0; col < cols; col += 16) {
        int64_t r = 0;
        for (; r + kRows <= rows; r += kRows)
            tile<kRows>(a + r, panel, width, pairs, correction, step, factor + r, col, c + r);
        last_rows(rows - r, a + r, panel, width, pairs, correction, step, factor + r, col, c + r);
    }
}

}  // namespace coded
