// α-entmax over rows of scores, exactly, for α = 2 (β = 1) and α = 1.5 (β = 2), and softmax, in place: each
// query's threshold over its keys, then its probabilities written over its scores. A query's keys may be
// spread over any number of rows, in any number of parts (each part rows × width, contiguous; each row one
// query's). The per-query search and its math are in row_entmax.h.
//
// This is the search of attention_kernels/bucketed/torch_path.py (`_support_threshold`, the reference beside
// it) done one query at a time: a query's entries come from memory once, for its maximum, and every later
// pass over them, the probabilities' included, runs in the first-level cache, where the tensor version reads
// all the scores from memory at each step. Each query's arithmetic is the same whatever the number of
// threads. Softmax takes the same way through the rows: one pass for the exponentials (written over the
// scores) and their sum, one for the division.
//
// Which entries of a part are keys may be given by a rule (`PartMask`) instead of masked scores: the rule is
// applied where the entries are loaded, so no mask is written or read.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <vector>

#include "row_entmax.h"
#include "vectors.h"

namespace {

using namespace row_entmax;

template <typename Real>
void exact_entmax(int num_parts, Real* const* parts, const int64_t* part_rows, const int64_t* part_width,
                  const int64_t* const* owners, const PartMask* masks, int64_t num_queries, int beta, bool write,
                  Real* shift, Real* threshold, int threads) {
    // The rows of each query, in their order, by a counting sort of the owners.
    std::vector<int64_t> start(num_queries + 1, 0);
    for (int c = 0; c < num_parts; ++c)
        for (int64_t r = 0; r < part_rows[c]; ++r) ++start[owners[c][r] + 1];
    for (int64_t i = 0; i < num_queries; ++i) start[i + 1] += start[i];
    std::vector<Row<Real>> rows(start[num_queries]);
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int c = 0; c < num_parts; ++c) {
        for (int64_t r = 0; r < part_rows[c]; ++r) {
            const PartMask* mask = masks[c].key_pos != nullptr ? masks + c : nullptr;
            rows[next[owners[c][r]]++] = Row<Real>{parts[c] + r * part_width[c], part_width[c], mask, r};
        }
    }
    const Real scale = beta == 2 ? 0.5 : 1;  // α − 1, and 1 for softmax
#pragma omp parallel for schedule(dynamic, 8) num_threads(threads) if (threads > 1)
    for (int64_t first = 0; first < num_queries; first += kGroup) {
        Query<Real> group[kGroup];
        Real from[kGroup];  // where each query's search starts
        int size = static_cast<int>(std::min<int64_t>(kGroup, num_queries - first));
        prefetch(rows.data() + start[std::min(first + kGroup, num_queries)],
                 rows.data() + start[std::min(first + 2 * kGroup, num_queries)]);
        for (int g = 0; g < size; ++g) {
            int64_t i = first + g;
            group[g] = {rows.data() + start[i], start[i + 1] - start[i], 0, scale};
            Vec<Real> high[2];
            Real m = group[g].largest(write, high);  // with `write` the scores are overwritten anyway
            shift[i] = group[g].shift = m > kNoKey ? m : 0;  // a query without keys: any finite shift does
            if (beta != 0) from[g] = group[g].start(high, beta);
        }
        if (beta == 0) {
            for (int g = 0; g < size; ++g) threshold[first + g] = std::log(group[g].softmax(write));
            continue;
        }
        solve(group, size, beta, from, threshold + first);
        if (write)
            for (int g = 0; g < size; ++g) group[g].write_probabilities(threshold[first + g], beta);
    }
}

// Runs `exact_entmax`: 0 once done, −1 when memory ran out (no exception may cross into C).
template <typename Real>
int guarded(int num_parts, Real* const* parts, const int64_t* part_rows, const int64_t* part_width,
            const int64_t* const* owners, const PartMask* masks, int64_t num_queries, int beta, int write,
            Real* shift, Real* threshold, int threads) {
    try {
        exact_entmax(num_parts, parts, part_rows, part_width, owners, masks, num_queries, beta, write != 0,
                     shift, threshold, threads);
        return 0;
    } catch (const std::bad_alloc&) {
        return -1;
    }
}

}  // namespace

// Part c is part_rows[c] × part_width[c] contiguous scores, row r owned by query owners[c][r] in
// [0, num_queries); entries off the mask −∞ or below −max float / 2. Where masks[c].key_pos is not null,
// masks[c] says which of the part's entries are keys (`PartMask`). beta: 1 (α = 2), 2 (α = 1.5) or 0
// (softmax). shift and threshold (num_queries,) receive m and τ (a query without rows: m = 0, τ = −1; one
// without keys: m = 0), for softmax τ = log Σ_j e^{s_j − m} (−∞ without keys); with `write`, the
// probabilities replace the scores (0 off the keys). Returns 0, or −1 when memory ran out.
#define EXPORT(NAME, REAL)                                                                                    \
    extern "C" int NAME(int num_parts, REAL* const* parts, const int64_t* part_rows, const int64_t* part_width, \
                        const int64_t* const* owners, const PartMask* masks, int64_t num_queries, int beta,    \
                        int write, REAL* shift, REAL* threshold, int threads) {                                \
        return guarded(num_parts, parts, part_rows, part_width, owners, masks, num_queries, beta, write, shift,  \
                       threshold, threads);                                                                    \
    }

EXPORT(exact_entmax_float, float)
EXPORT(exact_entmax_double, double)
