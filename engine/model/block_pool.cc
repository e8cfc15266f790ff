#include "engine/model/block_pool.h"

#include "common/check.h"

namespace edge::engine {

BlockPool::BlockPool(int32_t num_blocks)
    : refs_(static_cast<size_t>(std::max(num_blocks, 1)), 0),
      has_hash_(refs_.size(), false),
      hash_(refs_.size()),
      lru_pos_(refs_.size()) {
    free_.reserve(refs_.size());
    // Handed out lowest index first, so a small load touches few pages.
    for (int32_t b = num_blocks - 1; b >= 0; --b) {
        free_.push_back(b);
    }
}

Result<int32_t> BlockPool::allocate() {
    int32_t b = -1;
    if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
    } else if (!lru_.empty()) {
        b = lru_.front();
        lru_.pop_front();
        index_.erase(hash_[b]);
        has_hash_[b] = false;
        ++evictions_;
    } else {
        return resource_exhausted_error("KV cache: all " + std::to_string(num_blocks()) +
                                        " blocks are in use");
    }
    refs_[b] = 1;
    return b;
}

void BlockPool::retain(int32_t block) {
    EDGE_CHECK(block >= 0 && block < num_blocks());
    if (refs_[block] == 0) {
        // Only a cached block can be revived: it leaves the LRU list.
        EDGE_CHECK(has_hash_[block]);
        lru_.erase(lru_pos_[block]);
    }
    ++refs_[block];
}

void BlockPool::release(int32_t block) {
    EDGE_CHECK(block >= 0 && block < num_blocks() && refs_[block] > 0);
    if (--refs_[block] > 0) {
        return;
    }
    if (has_hash_[block]) {
        lru_pos_[block] = lru_.insert(lru_.end(), block);
    } else {
        free_.push_back(block);
    }
}

int32_t BlockPool::find(const BlockHash& hash) const {
    auto it = index_.find(hash);
    return it == index_.end() ? -1 : it->second;
}

void BlockPool::publish(int32_t block, const BlockHash& hash) {
    EDGE_CHECK(block >= 0 && block < num_blocks() && refs_[block] > 0);
    if (has_hash_[block] || index_.count(hash) > 0) {
        return;
    }
    index_.emplace(hash, block);
    hash_[block] = hash;
    has_hash_[block] = true;
}

void BlockPool::unpublish(int32_t block) {
    if (!has_hash_[block]) {
        return;
    }
    index_.erase(hash_[block]);
    has_hash_[block] = false;
    if (refs_[block] == 0) {
        // Was cached: without its hash it is plain free space.
        lru_.erase(lru_pos_[block]);
        free_.push_back(block);
    }
}

}  // namespace edge::engine
