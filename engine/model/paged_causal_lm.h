#pragma once

// PagedCausalLM is the part of a CausalLM that every architecture shares over a paged KvCache:
// slots, lengths, the prefix cache, and the checks and block reservation a batch needs before a
// forward writes anything. An architecture derives from it, ends its load with finish_load()
// (the context limit, the KV cache through create_kv_cache(), the spec), calls prepare_batch() at
// the top of forward() and commit_batch() at its end, and reads and writes keys and values through
// kv_ (engine/model/paged_attention.h). The ends of every forward are shared too: embed_batch()
// (token embeddings, slots and positions) and batch_logits() (final norm and lm_head on the rows
// whose logits are wanted).
//
// Threading: like CausalLM, driven by one thread.

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/cpu/weight.h"
#include "engine/model/causal_lm.h"
#include "engine/model/kv_cache.h"

namespace edge::engine {

class Backend;
struct LoadOptions;

// What finish_load needs to know of an architecture's checkpoint besides the load options.
struct PagedModelShape {
    std::string architecture;
    int64_t layers = 0;
    int64_t kv_heads = 0;  // Cached heads per layer and their width (MLA: 1 latent row).
    int64_t head_dim = 0;
    int64_t max_position_embeddings = 0;
    int64_t vocab_size = 0;
    std::vector<int64_t> eos_token_ids;
    int64_t bos_token_id = -1;       // Out of the vocabulary: none.
    int64_t kv_bytes_per_token = 0;  // What the spec reports.
    std::string version;             // version_digest of config and checkpoint.
    int64_t weight_bytes = 0;        // Weights as held in memory.
};

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
    Result<SavedSlot> save_slot(int32_t slot, int64_t max_bytes) const override {
        return kv_->save(slot, max_bytes);
    }
    Status restore_slot(int32_t slot, const SavedSlot& saved) override {
        return kv_->restore(slot, saved);
    }
    // On host_backend()'s threads when it has several, else in turn.
    void for_each_host_task(int64_t n, const std::function<void(int64_t)>& body) override;

  protected:
    // The backend whose host threads for_each_host_task uses; nullptr: none.
    virtual Backend* host_backend() { return nullptr; }
    // `kv_heads` x `head_dim` per layer; the budget is `kv_cache_bytes` (0: `slots` full contexts).
    Status create_kv_cache(int32_t layers, int32_t kv_heads, int32_t head_dim, int32_t slots,
                           int32_t max_context, int32_t block_tokens, int64_t kv_cache_bytes);
    // The end of every architecture's load: checks options.max_context against the model's
    // positions (an error naming `dir` when larger), creates the KV cache (shape.kv_heads x
    // shape.head_dim per layer, the options' slots, block size and budget) and fills `spec`.
    Status finish_load(const std::string& dir, const LoadOptions& options,
                       const PagedModelShape& shape, ModelSpec* spec);
    // Checks the batch against the CausalLM contract (slots acquired and distinct, start_pos at
    // the slot's length, tokens in the vocabulary, within the context) and reserves its blocks;
    // `total` receives the batch's tokens. kResourceExhausted when the blocks are not there
    // (nothing changed).
    Status prepare_batch(std::span<const SequenceChunk> batch, int64_t* total);
    // Records the new lengths after the forward wrote the batch.
    void commit_batch(std::span<const SequenceChunk> batch);
    // Fills tok_slot_ and tok_pos_ with each token's slot and position and `x` (one row of
    // embed.cols floats per token, in batch order) with its embedding row. Returns how many rows
    // want logits: every token of an all_logits chunk, the last token of any other.
    int64_t embed_batch(std::span<const SequenceChunk> batch, const Weight& embed, float* x);
    // RMS-normalizes (weights `final_norm`, epsilon `eps`) the rows of `x` that want logits, in
    // batch order, into `h`, then writes their `out_rows` x lm_head.rows logits.
    void batch_logits(std::span<const SequenceChunk> batch, const float* x,
                      std::span<const float> final_norm, float eps, const Weight& lm_head,
                      int64_t out_rows, Backend& backend, std::vector<float>& h,
                      std::vector<float>* logits);
    // Positions the longest sequence of this forward attends over: max(tok_pos_) + 1. Sizes the
    // attention score scratch by what the batch needs, not the model's maximum context (which
    // would commit threads x heads x max_context floats on the first forward).
    int64_t longest_context() const {
        int32_t longest = 0;
        for (int32_t p : tok_pos_) {
            longest = p + 1 > longest ? p + 1 : longest;
        }
        return longest;
    }

    // v.data() after growing v to at least n elements (scratch kept between forwards).
    static float* grow(std::vector<float>& v, size_t n) {
        if (v.size() < n) {
            v.resize(n);
        }
        return v.data();
    }

    std::unique_ptr<KvCache> kv_;
    std::vector<int32_t> tok_slot_, tok_pos_;  // This forward's tokens: slot and position.
};

}  // namespace edge::engine
