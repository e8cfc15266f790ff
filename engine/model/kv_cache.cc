#include "engine/model/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"

namespace edge::engine {

Result<std::unique_ptr<KvCache>> KvCache::create(const KvCacheShape& shape) {
    if (shape.layers <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 || shape.slots <= 0 ||
        shape.max_context <= 0 || shape.block_tokens <= 0 || shape.budget_bytes <= 0) {
        return invalid_argument_error("KV cache: every dimension and the budget must be positive");
    }
    int64_t per_token = 0;
    int64_t per_block = 0;
    if (__builtin_mul_overflow(int64_t{shape.layers} * 2 * shape.kv_heads,
                               int64_t{shape.head_dim} * int64_t{sizeof(float)}, &per_token) ||
        __builtin_mul_overflow(per_token, int64_t{shape.block_tokens}, &per_block)) {
        return invalid_argument_error("KV cache: block size overflows");
    }
    const int64_t blocks = shape.budget_bytes / per_block;
    if (blocks < 1) {
        return invalid_argument_error("KV cache: a budget of " +
                                      std::to_string(shape.budget_bytes) +
                                      " bytes holds no block of " +
                                      std::to_string(shape.block_tokens) + " tokens (one takes " +
                                      std::to_string(per_block) + " bytes)");
    }
    if (blocks > (int64_t{1} << 30)) {
        return invalid_argument_error("KV cache: " + std::to_string(blocks) +
                                      " blocks are too many; raise kv_block_tokens");
    }
    auto cache = std::unique_ptr<KvCache>(new KvCache(shape, static_cast<int32_t>(blocks)));
    const int64_t total = blocks * per_block;  // <= budget_bytes: no overflow.
    // Reserved, not committed: pages become resident as blocks are written.
    void* p = mmap(nullptr, static_cast<size_t>(total), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        return resource_exhausted_error("KV cache: cannot reserve " + std::to_string(total) +
                                        " bytes of address space");
    }
    cache->data_ = static_cast<float*>(p);
    cache->bytes_ = static_cast<size_t>(total);
    cache->tables_.resize(static_cast<size_t>(shape.slots));
    cache->lengths_.assign(static_cast<size_t>(shape.slots), 0);
    cache->in_use_.assign(static_cast<size_t>(shape.slots), false);
    return cache;
}

KvCache::~KvCache() {
    if (data_ != nullptr) {
        munmap(data_, bytes_);
    }
}

int64_t KvCache::bytes_per_token() const {
    return static_cast<int64_t>(shape_.layers) * 2 * shape_.kv_heads * shape_.head_dim *
           static_cast<int64_t>(sizeof(float));
}

Result<int32_t> KvCache::acquire() {
    for (int32_t s = 0; s < shape_.slots; ++s) {
        if (!in_use_[s]) {
            in_use_[s] = true;
            lengths_[s] = 0;
            tables_[s].clear();
            return s;
        }
    }
    return resource_exhausted_error("KV cache: all " + std::to_string(shape_.slots) +
                                    " slots are in use");
}

void KvCache::release(int32_t slot) {
    if (!in_use(slot)) {
        return;
    }
    truncate(slot, 0);
    in_use_[slot] = false;
}

bool KvCache::in_use(int32_t slot) const {
    return slot >= 0 && slot < shape_.slots && in_use_[slot];
}

int32_t KvCache::length(int32_t slot) const {
    return slot >= 0 && slot < shape_.slots ? lengths_[slot] : 0;
}

Status KvCache::reserve(std::span<const SlotGrowth> batch) {
    const int32_t bt = shape_.block_tokens;
    int64_t needed = 0;
    for (const SlotGrowth& g : batch) {
        EDGE_CHECK(in_use(g.slot) && g.length <= shape_.max_context);
        const int32_t len = lengths_[g.slot];
        if (g.length <= len) {
            continue;
        }
        const auto& table = tables_[g.slot];
        needed += std::max<int64_t>(0, (g.length + bt - 1) / bt -
                                           static_cast<int64_t>(table.size()));
        // Writing into a partly filled block that others share needs a private copy.
        if (len % bt != 0 && pool_.refs(table[len / bt]) > 1) {
            ++needed;
        }
    }
    if (needed > pool_.available()) {
        return resource_exhausted_error(
            "KV cache: the batch needs " + std::to_string(needed) + " more blocks of " +
            std::to_string(bt) + " tokens; " + std::to_string(pool_.available()) + " of " +
            std::to_string(pool_.num_blocks()) + " are available");
    }
    for (const SlotGrowth& g : batch) {
        const int32_t len = lengths_[g.slot];
        if (g.length <= len) {
            continue;
        }
        auto& table = tables_[g.slot];
        if (len % bt != 0) {
            const int32_t old = table[len / bt];
            if (pool_.refs(old) > 1) {
                Result<int32_t> copy = pool_.allocate();
                EDGE_CHECK(copy.ok());
                std::memcpy(head_base(*copy, 0, 0, 0), head_base(old, 0, 0, 0),
                            static_cast<size_t>(block_bytes()));
                pool_.release(old);
                table[len / bt] = *copy;
            } else {
                pool_.unpublish(old);  // Its contents are about to change.
            }
        }
        while (static_cast<int64_t>(table.size()) * bt < g.length) {
            Result<int32_t> b = pool_.allocate();
            EDGE_CHECK(b.ok());
            table.push_back(*b);
        }
    }
    return ok_status();
}

void KvCache::set_length(int32_t slot, int32_t length) {
    EDGE_CHECK(in_use(slot) && length >= 0 &&
               static_cast<int64_t>(length) <=
                   static_cast<int64_t>(tables_[slot].size()) * shape_.block_tokens);
    used_tokens_ += length - lengths_[slot];
    lengths_[slot] = length;
}

void KvCache::truncate(int32_t slot, int32_t length) {
    if (!in_use(slot)) {
        return;
    }
    length = std::clamp(length, 0, lengths_[slot]);
    // Also drops blocks reserved past the length by a forward that then failed.
    auto& table = tables_[slot];
    const size_t keep =
        static_cast<size_t>((length + shape_.block_tokens - 1) / shape_.block_tokens);
    // Last block first: the pool evicts the least recently released, so a cached chain loses
    // its leaves before its root (a chain without its root can never be attached again).
    for (size_t i = table.size(); i > keep; --i) {
        pool_.release(table[i - 1]);
    }
    if (table.size() > keep) {
        table.resize(keep);
    }
    used_tokens_ -= lengths_[slot] - length;
    lengths_[slot] = length;
}

Result<SavedSlot> KvCache::save(int32_t slot, int64_t max_bytes) const {
    EDGE_CHECK(in_use(slot));
    const int32_t bt = shape_.block_tokens;
    const auto& table = tables_[slot];
    SavedSlot out;
    out.length = lengths_[slot];
    const size_t blocks = static_cast<size_t>((out.length + bt - 1) / bt);
    // Hashed blocks are full prompt blocks, found again under the same chain hashes.
    size_t shared = 0;
    while (shared < blocks && pool_.hashed(table[shared]) && pool_.refs(table[shared]) > 1) {
        ++shared;
    }
    out.shared = static_cast<int32_t>(shared) * bt;
    const size_t copied = blocks - shared;
    if (static_cast<int64_t>(copied) * block_bytes() > max_bytes) {
        return resource_exhausted_error("KV cache: saving " + std::to_string(copied) +
                                        " blocks takes more than " + std::to_string(max_bytes) +
                                        " bytes");
    }
    const size_t floats = static_cast<size_t>(block_bytes()) / sizeof(float);
    out.data.resize(copied * floats);
    for (size_t i = 0; i < copied; ++i) {
        std::memcpy(out.data.data() + i * floats, head_base(table[shared + i], 0, 0, 0),
                    static_cast<size_t>(block_bytes()));
    }
    return out;
}

Status KvCache::restore(int32_t slot, const SavedSlot& saved) {
    const int32_t bt = shape_.block_tokens;
    EDGE_CHECK(in_use(slot) && saved.shared % bt == 0 && lengths_[slot] == saved.shared &&
               static_cast<int64_t>(tables_[slot].size()) * bt == saved.shared);
    const size_t floats = static_cast<size_t>(block_bytes()) / sizeof(float);
    const auto first = static_cast<size_t>(saved.shared / bt);
    const size_t blocks = static_cast<size_t>((saved.length + bt - 1) / bt);
    EDGE_CHECK(saved.length <= shape_.max_context && saved.shared <= saved.length &&
               saved.data.size() == (blocks - first) * floats);
    const SlotGrowth growth{slot, saved.length};
    EDGE_RETURN_IF_ERROR(reserve(std::span<const SlotGrowth>(&growth, 1)));
    for (size_t i = first; i < blocks; ++i) {
        std::memcpy(head_base(tables_[slot][i], 0, 0, 0), saved.data.data() + (i - first) * floats,
                    static_cast<size_t>(block_bytes()));
    }
    set_length(slot, saved.length);
    return ok_status();
}

int32_t KvCache::attach_prefix(int32_t slot, std::span<const BlockHash> chain) {
    if (!in_use(slot)) {
        return 0;
    }
    auto& table = tables_[slot];
    const int32_t held = static_cast<int32_t>(table.size()) * shape_.block_tokens;
    if (lengths_[slot] != held) {
        return lengths_[slot];  // Part of a block (or one reserved past the length).
    }
    const size_t limit = static_cast<size_t>(shape_.max_context / shape_.block_tokens);
    for (size_t i = table.size(); i < chain.size() && i < limit; ++i) {
        const int32_t b = pool_.find(chain[i]);
        if (b < 0) {
            break;
        }
        pool_.retain(b);
        table.push_back(b);
    }
    const int32_t length = static_cast<int32_t>(table.size()) * shape_.block_tokens;
    used_tokens_ += length - held;
    lengths_[slot] = length;
    return length;
}

void KvCache::publish_prefix(int32_t slot, std::span<const BlockHash> chain) {
    if (!in_use(slot)) {
        return;
    }
    const auto& table = tables_[slot];
    const size_t full = static_cast<size_t>(lengths_[slot] / shape_.block_tokens);
    for (size_t i = 0; i < chain.size() && i < full && i < table.size(); ++i) {
        pool_.publish(table[i], chain[i]);
    }
}

float* KvCache::head_base(int32_t block, int32_t layer, int32_t which, int32_t kv_head) const {
    const int64_t index =
        ((static_cast<int64_t>(block) * shape_.layers + layer) * 2 + which) * shape_.kv_heads +
        kv_head;
    return data_ + index * shape_.block_tokens * shape_.head_dim;
}

float* KvCache::key(int32_t slot, int32_t layer, int32_t kv_head, int32_t pos) {
    const int32_t bt = shape_.block_tokens;
    return head_base(tables_[slot][pos / bt], layer, 0, kv_head) +
           static_cast<int64_t>(pos % bt) * shape_.head_dim;
}

float* KvCache::value(int32_t slot, int32_t layer, int32_t kv_head, int32_t pos) {
    const int32_t bt = shape_.block_tokens;
    return head_base(tables_[slot][pos / bt], layer, 1, kv_head) +
           static_cast<int64_t>(pos % bt) * shape_.head_dim;
}

const float* KvCache::block_keys(int32_t block, int32_t layer, int32_t kv_head) const {
    return head_base(block, layer, 0, kv_head);
}

const float* KvCache::block_values(int32_t block, int32_t layer, int32_t kv_head) const {
    return head_base(block, layer, 1, kv_head);
}

double KvCache::use() const {
    return static_cast<double>(pool_.referenced()) / static_cast<double>(pool_.num_blocks());
}

KvCacheStats KvCache::stats() const {
    KvCacheStats s;
    s.block_tokens = shape_.block_tokens;
    s.blocks_total = pool_.num_blocks();
    s.blocks_used = pool_.referenced();
    s.blocks_cached = pool_.cached();
    s.evictions = pool_.evictions();
    s.budget_bytes = shape_.budget_bytes;
    s.allocated_bytes = static_cast<int64_t>(bytes_);
    return s;
}

}  // namespace edge::engine
