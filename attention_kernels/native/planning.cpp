// The passes of attention_kernels/bucketed/planning.py over token copies and block entries, each one loop
// where the tensor reference beside it there (`_bucket_runs`, `_padded_runs`, `_block_tags`) is a dozen small
// tensor operations, which cost more in dispatch than in arithmetic at the blocks' sizes. Results equal the
// reference's exactly (integer work, and whole-number positions below 2²⁴ converted to float). One thread:
// the passes are short and bound by memory.
//
// - distinct_ids: each token's bucket ids without repeats.
// - bucket_chunks: the copies of the tokens, one per bucket id a token holds, in (group, id, position) order,
//   where each bucket becomes a contiguous run of its tokens, positions ascending, and the bucket blocks'
//   runs over them (each bucket's queries in chunks, against its keys). The keys g · nid + id are small
//   integers, so a counting sort orders them in two passes over the ids (count each key, then place each
//   copy after the earlier ones of its key: stable), and its counts give each bucket's run.
// - block_classes: the blocks' shapes, rounded so that they fall into few classes, and the blocks ordered by
//   class.
// - padded_runs: blocks of runs of a sorted sequence, padded to one width: each entry's flat token index and
//   a float of its position (a causal limit, a window's bound, a key's position).
// - block_tags: each entry's bucket ids as the blocks' masks compare them, all of them or those below the
//   block's own bucket.
// - band_keys: each query's window-band keys that share no id with it (attention_kernels/bucketed/band_keys.py).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <new>
#include <stdexcept>
#include <vector>

// ids (tokens, slots): out the same with an id already held in an earlier slot of its token as −1, single
// each token's largest id (its one id, or −1), *several 1 when a token holds two ids (else single says all).
extern "C" int distinct_ids(const int64_t* ids, int64_t tokens, int64_t slots, int64_t* out, int64_t* single,
                            int64_t* several, int) {
    bool any_several = false;
    for (int64_t i = 0; i < tokens; ++i) {
        const int64_t* token = ids + i * slots;
        int64_t held = 0, largest = -1;
        for (int64_t s = 0; s < slots; ++s) {
            const int64_t id = token[s];
            const bool repeated = std::find(token, token + s, id) != token + s;
            out[i * slots + s] = repeated ? -1 : id;
            if (!repeated && id >= 0) ++held, largest = std::max(largest, id);
        }
        single[i] = largest;
        any_several = any_several || held > 1;
    }
    *several = any_several;
    return 0;
}

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

namespace {

// x ≥ 1 rounded up to a whole multiple of 2^max(⌊log₂ x⌋ − 2, 0): four sizes per octave (planning.py's
// `ladder`).
int64_t ladder(int64_t x) {
    const int64_t step = int64_t(1) << std::max(63 - __builtin_clzll(uint64_t(x)) - 2, 0);
    return (x + step - 1) / step * step;
}

int64_t round_up(int64_t x, int64_t step) { return (x + step - 1) / step * step; }

constexpr int64_t kBucket = 0;  // a block's kind: a bucket's chunk (planning.py's _BUCKET)

}  // namespace

// Blocks given as runs (6, blocks): first query copy, rows, first key copy, keys, kind and bucket id. Drops
// those without rows or keys, gives each the shape of its class, L rows on the ladder and M keys (a bucket
// block's on the ladder, then up to a whole key_step; a pattern block's up to a whole pattern_step; when
// causal, a bucket block facing at most 2 · rows keys and followed by another chunk of its bucket, its
// queries running on, has L = rows), and orders them by (kind, L, M, group), stable, the group being
// q_flat[first query copy] / n. Writes the ordered blocks' first query copy, rows, first key copy, keys and
// bucket id to ordered (5, room for every block), each class's kind, L, M and number of blocks to classes
// (4, room for every block), and (blocks kept, classes) to counts. Returns 0; −1 when memory ran out.
extern "C" int block_classes(const int64_t* runs, int64_t blocks, const int64_t* q_flat, int64_t n, int64_t groups,
                             int64_t causal, int64_t rows, int64_t key_step, int64_t pattern_step, int64_t* ordered,
                             int64_t* classes, int64_t* counts, int) {
    const int64_t *q_start = runs, *q_rows = runs + blocks, *k_start = runs + 2 * blocks;
    const int64_t *k_count = runs + 3 * blocks, *kind = runs + 4 * blocks, *bucket = runs + 5 * blocks;
    std::vector<int64_t> kept, height, width, key, order;
    try {
        for (int64_t b = 0; b < blocks; ++b)
            if (q_rows[b] > 0 && k_count[b] > 0) kept.push_back(b);
        height.resize(kept.size()), width.resize(kept.size()), key.resize(kept.size()), order.resize(kept.size());
    } catch (const std::exception&) {  // bad_alloc, or length_error past what a vector may hold
        return -1;
    }
    const int64_t count = kept.size();
    const auto chunk_follows = [&](int64_t b) {  // the next block is the next chunk of b's bucket
        const int64_t a = b + 1;
        return a < blocks && kind[a] == kBucket && bucket[a] == bucket[b] &&
               q_start[a] == q_start[b] + q_rows[b] && q_flat[q_start[a]] / n == q_flat[q_start[b]] / n;
    };
    int64_t tallest = 0, widest = 0;
    for (int64_t i = 0; i < count; ++i) {
        const int64_t b = kept[i];
        const bool bucket_block = kind[b] == kBucket;
        width[i] = bucket_block ? round_up(ladder(k_count[b]), key_step) : round_up(k_count[b], pattern_step);
        const bool short_first = causal && bucket_block && 2 * rows >= width[i] && chunk_follows(b);
        height[i] = short_first ? rows : ladder(q_rows[b]);
        tallest = std::max(tallest, height[i]), widest = std::max(widest, width[i]);
    }
    for (int64_t i = 0; i < count; ++i) {
        const int64_t b = kept[i], group = q_flat[q_start[b]] / n;
        key[i] = ((kind[b] * (tallest + 1) + height[i]) * (widest + 1) + width[i]) * groups + group;
        order[i] = i;
    }
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key[a] < key[b]; });
    int64_t classes_found = 0;
    for (int64_t i = 0; i < count; ++i) {
        const int64_t at = order[i], b = kept[at];
        const int64_t fields[5] = {q_start[b], q_rows[b], k_start[b], k_count[b], bucket[b]};
        for (int f = 0; f < 5; ++f) ordered[f * blocks + i] = fields[f];
        if (i == 0 || key[at] / groups != key[order[i - 1]] / groups) {
            const int64_t shape[4] = {kind[b], height[at], width[at], 0};
            for (int f = 0; f < 4; ++f) classes[f * blocks + classes_found] = shape[f];
            ++classes_found;
        }
        ++classes[3 * blocks + classes_found - 1];
    }
    counts[0] = count, counts[1] = classes_found;
    return 0;
}

// For blocks b of `width` entries, entry c a run's element start[b] + c of a sequence (flat, pos) when
// c < count[b], else padding: index[b][c] = flat[start[b] + c] (0 for padding) unless index is null, and
// positions[b][c] = pos[start[b] + c] · scale + shift as a float (`fill` for padding).
extern "C" int padded_runs(const int64_t* start, const int64_t* count, int64_t blocks, int64_t width,
                           const int64_t* flat, const int64_t* pos, int64_t scale, int64_t shift, double fill,
                           int64_t* index, float* positions, int) {
    for (int64_t b = 0; b < blocks; ++b) {
        // the run (a copy and a conversion, which vectorise), then the padding
        const int64_t inside = std::min(count[b], width);
        const int64_t* run_pos = pos + start[b];
        float* to = positions + b * width;
        for (int64_t c = 0; c < inside; ++c) to[c] = float(run_pos[c] * scale + shift);
        std::fill(to + inside, to + width, float(fill));
        if (index) {
            std::copy(flat + start[b], flat + start[b] + inside, index + b * width);
            std::fill(index + b * width + inside, index + (b + 1) * width, int64_t(0));
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

// band (groups · n, E): the pattern keys of each query beyond its block row (attention_kernels/bucketed/
// band_keys.py). Window slot e < W of query g · n + i holds g · m + j for key j = i − radius + e, global slot
// W + s holds g · m + s where |i − s| > radius (no window: radius −1) and s ≤ i when causal; either only when
// the key exists and holds no id equal to the query's (q_ids (groups · n) one id each or −1 for none, which
// shares none; k_ids (groups · m, slots), −1 for none), else −1.
extern "C" int band_keys(const int64_t* q_ids, const int64_t* k_ids, int64_t groups, int64_t n, int64_t m,
                         int64_t slots, int64_t radius, int64_t W, int64_t E, int64_t causal, int64_t* band, int) {
    for (int64_t g = 0; g < groups; ++g) {
        for (int64_t i = 0; i < n; ++i) {
            const int64_t own = q_ids[g * n + i];
            auto outside_row = [&](int64_t j) {
                for (int64_t s = 0; own >= 0 && s < slots; ++s)
                    if (k_ids[(g * m + j) * slots + s] == own) return false;
                return true;
            };
            int64_t* slot = band + (g * n + i) * E;
            for (int64_t e = 0; e < W; ++e) {
                const int64_t j = i - radius + e;
                slot[e] = j >= 0 && j < m && outside_row(j) ? g * m + j : -1;
            }
            for (int64_t s = 0; s < E - W; ++s) {
                const bool in_window = radius >= 0 && (i - s <= radius && s - i <= radius);
                const bool kept = !in_window && (!causal || s <= i) && outside_row(s);
                slot[W + s] = kept ? g * m + s : -1;
            }
        }
    }
    return 0;
}
