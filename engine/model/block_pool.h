#pragma once

// BlockPool does the bookkeeping of a paged KV cache's blocks, without their storage: reference
// counts, the free list, and the prefix index. A block is free (on the free list), referenced (by
// one or more sequences' block tables), or cached: unreferenced but still holding the keys and
// values of a full prompt block whose chain hash is in the index, kept for later requests and
// evicted least-recently-released first when a block is needed and the free list is empty. A
// block with a hash is never written again: a sequence that must write into one gets a copy
// (KvCache does that).
//
// Not thread-safe: the KvCache that owns it is driven by one scheduler thread.

#include <array>
#include <cstdint>
#include <cstring>
#include <list>
#include <unordered_map>
#include <vector>

#include "common/result.h"

namespace edge::engine {

// SHA-256 of (parent hash, the block's tokens, the tenant's salt): names a full prompt block.
using BlockHash = std::array<uint8_t, 32>;

struct BlockHashHasher {
    size_t operator()(const BlockHash& h) const {
        size_t v = 0;
        std::memcpy(&v, h.data(), sizeof(v));
        return v;
    }
};

class BlockPool {
public:
    // `num_blocks` >= 1.
    explicit BlockPool(int32_t num_blocks);

    int32_t num_blocks() const { return static_cast<int32_t>(refs_.size()); }
    // Blocks allocate() can hand out now: free plus cached (evictable) ones.
    int32_t available() const { return static_cast<int32_t>(free_.size() + lru_.size()); }
    // Blocks referenced by at least one sequence.
    int32_t referenced() const { return num_blocks() - available(); }
    // Unreferenced blocks kept for their prefix hash.
    int32_t cached() const { return static_cast<int32_t>(lru_.size()); }
    // Cached blocks dropped to make room, since creation.
    int64_t evictions() const { return evictions_; }

    // A block with one reference and no hash: a free one, else the least recently released
    // cached one (its hash leaves the index). kResourceExhausted when every block is referenced.
    Result<int32_t> allocate();
    void retain(int32_t block);
    // Drops one reference; at zero the block becomes cached (if hashed) or free.
    void release(int32_t block);
    int32_t refs(int32_t block) const { return refs_[block]; }
    bool hashed(int32_t block) const { return has_hash_[block]; }

    // The block indexed under `hash`, or -1. Does not retain it.
    int32_t find(const BlockHash& hash) const;
    // Indexes a referenced, full block under `hash`. No-op when the hash is already indexed
    // (another block holds the same tokens) or the block already has a hash.
    void publish(int32_t block, const BlockHash& hash);
    // Removes the block's hash from the index (before its contents change).
    void unpublish(int32_t block);

private:
    std::vector<int32_t> refs_;
    std::vector<bool> has_hash_;
    std::vector<BlockHash> hash_;
    std::vector<std::list<int32_t>::iterator> lru_pos_;
    std::vector<int32_t> free_;
    std::list<int32_t> lru_;  // Cached blocks, least recently released first.
    std::unordered_map<BlockHash, int32_t, BlockHashHasher> index_;
    int64_t evictions_ = 0;
};

}  // namespace edge::engine
