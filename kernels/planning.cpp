// The passes of kernels/bucket_blocks.py's planning over token copies and block entries, each one loop where
// the tensor reference beside it there (`_bucket_runs`, `_padded_runs`, `_block_tags`) is a dozen small
// tensor operations, which cost more in dispatch than in arithmetic at the blocks' sizes. Results equal the
// reference's exactly (integer work, and whole-number positions below 2²⁴ converted to float). One thread:
// the passes are short and bound by memory.
//
// - bucket_chunks: the copies of the tokens, one per bucket id a token holds, in (group, id, position) order,
//   where each bucket becomes a contiguous run of its tokens, positions ascending, and the bucket blocks'
//   runs over them (each bucket's queries in chunks, against its keys). The keys g · nid + id are small
//   integers, so a counting sort orders them in two passes over the ids (count each key, then place each
//   copy after the earlier ones of its key: stable), and its counts give each bucket's run.
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

namespace {

// The copies of the tokens of ids (groups, length, slots), −1 for none, every other id below nid, sorted by
// key g · nid + id, then position: their flat indices g · length + position and positions, and first[key]
// the first copy of each key (first[groups · nid] their number). False when an id is nid or more.
bool sort_copies(const int64_t* ids, int64_t groups, int64_t length, int64_t slots, int64_t nid, int64_t* flat,
                 int64_t* positions, std::vector<int64_t>& first) {
    const int64_t keys = groups * nid, per_group = length * slots;
    first.assign(keys + 1, 0);
    for (int64_t g = 0; g < groups; ++g) {
        for (int64_t e = 0; e < per_group; ++e) {
            const int64_t id = ids[g * per_group + e];
            if (id >= nid) return false;
            if (id >= 0) ++first[g * nid + id + 1];
        }
    }
    for (int64_t key = 1; key <= keys; ++key) first[key] += first[key - 1];
    std::vector<int64_t> next(first.begin(), first.end() - 1);  // per key: where its next copy goes
    for (int64_t g = 0; g < groups; ++g) {
        for (int64_t i = 0; i < length; ++i) {
            for (int64_t s = 0; s < slots; ++s) {
                const int64_t id = ids[(g * length + i) * slots + s];
                if (id < 0) continue;
                const int64_t at = next[g * nid + id]++;
                flat[at] = g * length + i, positions[at] = i;
            }
        }
    }
    return true;
}

}  // namespace

// q_ids (groups, n, q_slots) and k_ids (groups, m, k_slots), −1 for none, every other id below nid. Sorts
// the copies of the queries and of the keys (flat indices and positions into q_flat, q_pos, k_flat, k_pos,
// room for every entry of the ids), then cuts each bucket's queries into chunks of at most `rows`, each
// facing the bucket's keys (when causal, those at positions up to the chunk's last query, and the short
// chunk first): the chunks' first query copy, rows, first key copy, keys and bucket id go to
// chunks[0 … 5)[c] (room for `capacity` each), in (bucket key, position) order; a bucket without keys has
// none. counts = (query copies, key copies, chunks). Returns 0; −1 when memory ran out, −2 when an id is
// nid or more, −3 when the chunks pass `capacity`.
extern "C" int bucket_chunks(const int64_t* q_ids, int64_t n, int64_t q_slots, const int64_t* k_ids, int64_t m,
                             int64_t k_slots, int64_t groups, int64_t nid, int64_t causal, int64_t rows,
                             int64_t* q_flat, int64_t* q_pos, int64_t* k_flat, int64_t* k_pos, int64_t* chunks,
                             int64_t capacity, int64_t* counts, int) {
    std::vector<int64_t> q_first, k_first;
    try {
        if (!sort_copies(q_ids, groups, n, q_slots, nid, q_flat, q_pos, q_first)) return -2;
        if (!sort_copies(k_ids, groups, m, k_slots, nid, k_flat, k_pos, k_first)) return -2;
    } catch (const std::exception&) {  // bad_alloc, or length_error past what a vector may hold
        return -1;
    }
    int64_t* fields[5];
    for (int f = 0; f < 5; ++f) fields[f] = chunks + f * capacity;
    int64_t c = 0;
    for (int64_t key = 0; key < groups * nid; ++key) {
        const int64_t q_start = q_first[key], queries = q_first[key + 1] - q_start;
        const int64_t k_start = k_first[key], keys = k_first[key + 1] - k_start;
        if (queries == 0 || keys == 0) continue;
        const int64_t pieces = (queries + rows - 1) / rows;
        for (int64_t i = 0; i < pieces; ++i, ++c) {
            if (c == capacity) return -3;
            // short chunk first when causal: chunk i ends (pieces − 1 − i) full chunks before the bucket's end
            const int64_t end = causal ? queries - (pieces - 1 - i) * rows : std::min(queries, (i + 1) * rows);
            const int64_t begin = causal ? std::max<int64_t>(end - rows, 0) : i * rows;
            int64_t facing = keys;
            if (causal) {  // the prefix of the bucket's keys (positions ascending) up to the last query's
                const int64_t last = q_pos[q_start + end - 1];
                facing = std::upper_bound(k_pos + k_start, k_pos + k_start + keys, last) - (k_pos + k_start);
            }
            fields[0][c] = q_start + begin, fields[1][c] = end - begin, fields[2][c] = k_start;
            fields[3][c] = facing, fields[4][c] = key % nid;
        }
    }
    counts[0] = q_first[groups * nid], counts[1] = k_first[groups * nid], counts[2] = c;
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
