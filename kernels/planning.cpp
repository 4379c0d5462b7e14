// The passes of kernels/bucket_blocks.py's planning over token copies and block entries, each one loop where
// the tensor reference beside it there (`_sorted_tokens`, `_padded_runs`, `_block_tags`) is a dozen small
// tensor operations, which cost more in dispatch than in arithmetic at the blocks' sizes. Results equal the
// reference's exactly (integer work, and whole-number positions below 2²⁴ converted to float). One thread:
// the passes are short and bound by memory.
//
// - sorted_tokens: the copies of the tokens, one per bucket id a token holds, in (group, id, position) order,
//   where each bucket becomes a contiguous run of its tokens, positions ascending. The keys g · nid + id are
//   small integers, so a counting sort orders them in two passes over the ids (count each key, then place
//   each copy after the earlier ones of its key: stable).
// - padded_runs: blocks of runs of a sorted sequence, padded to one width: each entry's flat token index and
//   a float of its position (a causal limit, a window's bound, a key's position).
// - block_tags: each entry's bucket ids as the blocks' masks compare them, all of them or those below the
//   block's own bucket.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <new>
#include <stdexcept>
#include <vector>

// ids (groups, length, slots), −1 for none, every other id in [0, nid). Writes the copies' keys g · nid + id,
// flat token indices g · length + position and positions to keys, flat and positions (room for every
// entry of ids), their number to *copies. Returns 0; −1 when memory ran out, −2 when an id is nid or more.
extern "C" int sorted_tokens(const int64_t* ids, int64_t groups, int64_t length, int64_t slots, int64_t nid,
                             int64_t* keys, int64_t* flat, int64_t* positions, int64_t* copies, int) {
    std::vector<int64_t> next;  // per key: where its next copy goes
    try {
        next.assign(groups * nid + 1, 0);
    } catch (const std::exception&) {  // bad_alloc, or length_error past what a vector may hold
        return -1;
    }
    const int64_t per_group = length * slots;
    for (int64_t g = 0; g < groups; ++g) {
        for (int64_t e = 0; e < per_group; ++e) {
            const int64_t id = ids[g * per_group + e];
            if (id >= nid) return -2;
            if (id >= 0) ++next[g * nid + id + 1];
        }
    }
    for (int64_t key = 1; key <= groups * nid; ++key) next[key] += next[key - 1];
    *copies = next[groups * nid];
    for (int64_t g = 0; g < groups; ++g) {
        for (int64_t i = 0; i < length; ++i) {
            for (int64_t s = 0; s < slots; ++s) {
                const int64_t id = ids[(g * length + i) * slots + s];
                if (id < 0) continue;
                const int64_t key = g * nid + id, at = next[key]++;
                keys[at] = key, flat[at] = g * length + i, positions[at] = i;
            }
        }
    }
    return 0;
}

// For blocks b of `width` entries, entry c a run's element start[b] + c of a sequence (flat, pos) when
// c < count[b], else padding: index[b][c] = flat[start[b] + c] (0 for padding) unless index is null, and
// positions[b][c] = pos[start[b] + c] · scale + shift as a float (`fill` for padding).
extern "C" int padded_runs(const int64_t* start, const int64_t* count, int64_t blocks, int64_t width,
                           const int64_t* flat, const int64_t* pos, int64_t scale, int64_t shift, double fill,
                           int64_t* index, float* positions, int) {
    for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t c = 0; c < width; ++c) {
            const bool inside = c < count[b];
            const int64_t at = start[b] + c;
            if (index) index[b * width + c] = inside ? flat[at] : 0;
            positions[b * width + c] = inside ? float(pos[at] * scale + shift) : float(fill);
        }
    }
    return 0;
}

// tags[s][e] for the entries e < entries of blocks of `width` (entry e in block e / width), each the token
// index[e] of ids (tokens, slots): with bucket null, its ids in slot order (s < slots); else the slots − 1
// largest of its ids below its block's bucket[e / width], largest first, `none` for the others (an id at
// or above the block's bucket is `none` before the ranking).
extern "C" int block_tags(const int32_t* ids, int64_t slots, const int64_t* index, int64_t entries,
                          int64_t width, const int64_t* bucket, int64_t none, int32_t* tags, int) {
    if (!bucket) {
        for (int64_t e = 0; e < entries; ++e)
            for (int64_t s = 0; s < slots; ++s) tags[s * entries + e] = ids[index[e] * slots + s];
        return 0;
    }
    std::vector<int32_t> held;
    try {
        held.resize(slots);
    } catch (const std::exception&) {  // bad_alloc, or length_error past what a vector may hold
        return -1;
    }
    for (int64_t block = 0, e = 0; block < entries / width; ++block) {
        const int64_t below = bucket[block];
        for (int64_t c = 0; c < width; ++c, ++e) {
            const int32_t* token = ids + index[e] * slots;
            if (slots == 2) {  // the larger of two: no sort
                const int32_t first = token[0] < below ? token[0] : int32_t(none);
                const int32_t second = token[1] < below ? token[1] : int32_t(none);
                tags[e] = std::max(first, second);
                continue;
            }
            for (int64_t s = 0; s < slots; ++s) held[s] = token[s] < below ? token[s] : int32_t(none);
            std::sort(held.begin(), held.end(), std::greater<int32_t>());
            for (int64_t s = 0; s + 1 < slots; ++s) tags[s * entries + e] = held[s];
        }
    }
    return 0;
}
