// The copies of the tokens, one per bucket id a token holds, in (group, id, position) order: the order of
// kernels/bucket_blocks.py's planning, where each bucket becomes a contiguous run of its tokens, positions
// ascending. The keys g · nid + id are small integers, so a counting sort orders them in two passes over the
// ids (count each key, then place each copy after the earlier ones of its key: stable), where the reference
// there, a comparison or radix sort of the keys and a few gathers, passes over them about a dozen times.
// One thread: the passes are short and bound by memory.

#include <cstdint>
#include <new>
#include <vector>

// ids (groups, length, slots), −1 for none, every other id in [0, nid). Writes the copies' keys g · nid + id,
// flat token indices g · length + position and positions to keys, flat and positions (room for every
// entry of ids), their number to *copies. Returns 0; −1 when memory ran out, −2 when an id is nid or more.
extern "C" int sorted_tokens(const int64_t* ids, int64_t groups, int64_t length, int64_t slots, int64_t nid,
                             int64_t* keys, int64_t* flat, int64_t* positions, int64_t* copies, int) {
    std::vector<int64_t> next;  // per key: where its next copy goes
    try {
        next.assign(groups * nid + 1, 0);
    } catch (const std::bad_alloc&) {
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
