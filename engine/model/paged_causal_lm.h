#pragma once

// PagedCausalLM is the part of a CausalLM that every architecture shares over a paged KvCache:
// slots, lengths, the prefix cache, and the checks and block reservation a batch needs before a
// forward writes anything. An architecture derives from it, creates kv_ on load with
// create_kv_cache(), calls prepare_batch() at the top of forward() and commit_batch() at its end,
// and reads and writes keys and values through kv_ (engine/model/paged_attention.h).
//
// Threading: like CausalLM, driven by one thread.

#include <memory>
#include <span>

#include "engine/model/causal_lm.h"
#include "engine/model/kv_cache.h"

namespace edge::engine {

class PagedCausalLM : public CausalLM {
public:
    Result<int32_t> acquire_slot() override { return kv_->acquire(); }
    void release_slot(int32_t slot) override { kv_->release(slot); }
    void truncate_slot(int32_t slot, int32_t length) override { kv_->truncate(slot, length); }
    int32_t slot_length(int32_t slot) const override { return kv_->length(slot); }
    double kv_use() const override { return kv_->use(); }
    int32_t kv_block_tokens() const override { return kv_->block_tokens(); }
    int32_t attach_prefix(int32_t slot, std::span<const BlockHash> chain) override {
        return kv_->attach_prefix(slot, chain);
    }
    void publish_prefix(int32_t slot, std::span<const BlockHash> chain) override {
        kv_->publish_prefix(slot, chain);
    }
    KvCacheStats kv_stats() const override { return kv_->stats(); }

protected:
    // `kv_heads` x `head_dim` per layer; the budget is `kv_cache_bytes` (0: `slots` full contexts).
    Status create_kv_cache(int32_t layers, int32_t kv_heads, int32_t head_dim, int32_t slots,
                           int32_t max_context, int32_t block_tokens, int64_t kv_cache_bytes);
    // Checks the batch against the CausalLM contract (slots acquired and distinct, start_pos at
    // the slot's length, tokens in the vocabulary, within the context) and reserves its blocks;
    // `total` receives the batch's tokens. kResourceExhausted when the blocks are not there
    // (nothing changed).
    Status prepare_batch(std::span<const SequenceChunk> batch, int64_t* total);
    // Records the new lengths after the forward wrote the batch.
    void commit_batch(std::span<const SequenceChunk> batch);

    std::unique_ptr<KvCache> kv_;
};

}  // namespace edge::engine
