// A block's rows in the cache: the layout of a panel (a block's kᵀ, copied so that a strip of it stays in the
// first-level cache while the rows of A pass over it, vectors::product), and the prefetch of the rows a block
// reads through its index lists. Shared by the block products and the fused block attention.

#pragma once

#include <algorithm>
#include <cstdint>

#include "vectors.h"

namespace panels {

// The Reals between a panel's rows for M columns: whole vectors, and an odd number of cache lines, so that
// the rows of a strip fall in distinct sets of the first-level cache (at an even number, e.g. 512 bytes, 64
// rows share 8 sets and evict one another while the strip is read over and over).
template <typename Real>
int64_t padded_stride(int64_t M) {
    constexpr int64_t line = 64 / sizeof(Real);
    const int64_t lines = (M + line - 1) / line;
    return std::max(vectors::whole_vectors<Real>(M), (lines | 1) * line);
}

// Asks for the rows x[rows[0..count)] (of `width` Reals) to be brought into the cache: the next block's, whose
// rows lie anywhere in memory, while this block's product runs.
template <typename Real>
void prefetch_rows(const Real* x, const int64_t* rows, int64_t count, int64_t width) {
    for (int64_t i = 0; i < count; ++i)
        for (int64_t j = 0; j < width; j += 64 / sizeof(Real)) __builtin_prefetch(x + rows[i] * width + j);
}

}  // namespace panels
