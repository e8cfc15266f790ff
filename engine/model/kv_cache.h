#pragma once

// KvCache is a paged KV cache in f32: a pool of fixed-size blocks (block_tokens positions each)
// and, per sequence slot, a block table mapping positions to blocks, so a sequence holds memory in
// proportion to its length and full prompt blocks can be shared between sequences (the prefix
// cache). A block stores, per layer, the keys then the values of every KV head, each
// [block_tokens][head_dim] contiguous. The number of blocks is fixed at creation from a byte
// budget and the storage is reserved once (pages become resident as they are written): the cache
// never allocates past its budget; growth beyond it is kResourceExhausted.
//
// Blocks are refcounted by BlockPool. Full prompt blocks published under their chain hash stay
// cached after their sequences end and are attached to later sequences with the same hash; a
// block that is shared or hashed is never written: reserve() gives the writer a private copy.
//
// Threading: not synchronized; the model's forward (one scheduler thread) owns it. Distinct
// (slot, layer, head, position) entries may be written from different threads once reserved.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/result.h"
#include "engine/model/block_pool.h"

namespace edge::engine {

struct KvCacheShape {
    int32_t layers = 0;         // Decoder layers.
    int32_t kv_heads = 0;       // Key/value heads per layer.
    int32_t head_dim = 0;       // Values per head.
    int32_t slots = 0;          // Sequences held at once.
    int32_t max_context = 0;    // Positions per sequence.
    int32_t block_tokens = 16;  // Positions per block.
    int64_t budget_bytes = 0;   // Memory for blocks, bytes; the block count is what fits.
};

// What the cache holds now (for load reports and metrics).
struct KvCacheStats {
    int32_t block_tokens = 0;      // Positions per block.
    int32_t blocks_total = 0;      // Blocks the budget holds.
    int32_t blocks_used = 0;       // Blocks referenced by running sequences.
    int32_t blocks_cached = 0;     // Unreferenced blocks kept for the prefix cache.
    int64_t evictions = 0;         // Cached blocks reused for new data since creation.
    int64_t budget_bytes = 0;      // The configured budget, bytes.
    int64_t allocated_bytes = 0;   // Bytes reserved for blocks (<= budget_bytes).
};

// A copy of one slot's cached positions in host memory (KvCache::save), for preemption by
// swapping: put back with KvCache::restore, the sequence continues from the same numbers.
// Leading blocks that other sequences share through the prefix cache are not copied: they stay
// in the cache while those run, and are attached again (attach_prefix) before the restore.
struct SavedSlot {
    int32_t length = 0;       // Positions saved, the shared prefix included.
    int32_t shared = 0;       // Leading positions not copied (whole shared prefix blocks).
    std::vector<float> data;  // The blocks from `shared` on, whole, in position order.
    int64_t bytes() const { return static_cast<int64_t>(data.size() * sizeof(float)); }
};

// Growth of one slot in a batch: it will hold `length` positions after the forward.
struct SlotGrowth {
    int32_t slot = 0;
    int32_t length = 0;
};

class KvCache {
public:
    // kInvalidArgument for a non-positive dimension, a size overflow, or a budget that holds no
    // block.
    static Result<std::unique_ptr<KvCache>> create(const KvCacheShape& shape);
    ~KvCache();
    KvCache(const KvCache&) = delete;
    KvCache& operator=(const KvCache&) = delete;

    const KvCacheShape& shape() const { return shape_; }
    int32_t block_tokens() const { return shape_.block_tokens; }
    // Bytes of K and V that one token takes over all layers.
    int64_t bytes_per_token() const;
    // Bytes of one block.
    int64_t block_bytes() const { return bytes_per_token() * shape_.block_tokens; }
    int32_t num_blocks() const { return pool_.num_blocks(); }

    // A free slot with length 0, or kResourceExhausted when all are taken.
    Result<int32_t> acquire();
    // Drops the slot's blocks (cached ones stay in the prefix cache) and frees it.
    void release(int32_t slot);
    bool in_use(int32_t slot) const;
    int32_t length(int32_t slot) const;

    // Makes room for every growth in `batch` (lengths beyond the slots' current ones): allocates
    // blocks and gives a slot a private copy of a shared or hashed block it must write into. All
    // or nothing: kResourceExhausted (nothing changed) when the blocks are not there.
    Status reserve(std::span<const SlotGrowth> batch);
    // Sets the slot's length after a forward wrote the positions (within what reserve() gave).
    void set_length(int32_t slot, int32_t length);
    // Drops positions from `length` on, releasing whole blocks past it.
    void truncate(int32_t slot, int32_t length);

    // A copy of the slot's positions (whole blocks) past its leading run of prefix-cache blocks
    // that another slot also holds (SavedSlot::shared), or kResourceExhausted (nothing copied)
    // when it would take more than `max_bytes`. Copying the shared blocks would make the restore
    // need private copies of blocks the cache still holds, more than the preemption freed.
    Result<SavedSlot> save(int32_t slot, int64_t max_bytes) const;
    // Fills the slot, which must hold exactly saved.shared positions (empty, or the shared
    // prefix attached again with the same chain), with what save() copied, in private blocks:
    // kResourceExhausted (nothing changed) when the blocks are not there.
    Status restore(int32_t slot, const SavedSlot& saved);

    // Attaches the cached blocks that `chain` names after the slot's own (the slot holds whole
    // blocks, chain[0 .. its blocks) being theirs: an empty slot, or one that attached or
    // computed a prefix of the same prompt), stopping at the first miss; returns the slot's
    // length then (blocks x block_tokens). A slot holding part of a block attaches nothing.
    int32_t attach_prefix(int32_t slot, std::span<const BlockHash> chain);
    // Indexes the slot's first chain.size() blocks (which must be full and computed) under
    // these hashes, so later sequences can attach them.
    void publish_prefix(int32_t slot, std::span<const BlockHash> chain);

    // Row of `head_dim` keys (values) of a position the slot holds (or was reserved).
    float* key(int32_t slot, int32_t layer, int32_t kv_head, int32_t pos);
    float* value(int32_t slot, int32_t layer, int32_t kv_head, int32_t pos);
    // The slot's block table (block ids in position order).
    std::span<const int32_t> blocks(int32_t slot) const { return tables_[slot]; }
    // [block_tokens][head_dim] keys (values) of one block, layer and head.
    const float* block_keys(int32_t block, int32_t layer, int32_t kv_head) const;
    const float* block_values(int32_t block, int32_t layer, int32_t kv_head) const;

    // Tokens held over all slots.
    int64_t used_tokens() const { return used_tokens_; }
    // Referenced blocks over all blocks, 0..1.
    double use() const;
    KvCacheStats stats() const;

private:
    explicit KvCache(const KvCacheShape& shape, int32_t num_blocks)
        : shape_(shape), pool_(num_blocks) {}
    float* head_base(int32_t block, int32_t layer, int32_t which, int32_t kv_head) const;

    KvCacheShape shape_;
    BlockPool pool_;
    float* data_ = nullptr;
    size_t bytes_ = 0;
    std::vector<std::vector<int32_t>> tables_;
    std::vector<int32_t> lengths_;
    std::vector<bool> in_use_;
    int64_t used_tokens_ = 0;
};

}  // namespace edge::engine
