#pragma once

// CausalLM is a loaded decoder-only model with its KV cache, seen by the scheduler: sequences live
// in slots, and one forward() call advances any mix of slots by any number of tokens (prefill
// chunks and single decode tokens in one batch). Architectures (qwen3_moe, later glm4_moe and
// deepseek_v3) implement it.
//
// Threading: not thread-safe; one scheduler thread drives it. forward() uses the backend's thread
// pool internally. Lifetime: the weights it maps must outlive it (it owns the mapping).

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"
#include "engine/model/block_pool.h"
#include "engine/model/kv_cache.h"
#include "engine/shard/shard_stats.h"

namespace edge::engine {

struct ModelSpec {
    std::string architecture;         // e.g. "Qwen3MoeForCausalLM".
    int32_t vocab_size = 0;           // Rows of the logits.
    int32_t max_context = 0;          // Positions the model (and its cache) supports.
    std::vector<TokenId> eos_token_ids;
    TokenId bos_token_id = -1;        // -1 when the model has none.
    std::string version;              // Digest of config and tensor index (hex).
    int64_t weight_bytes = 0;         // Bytes of weights as held in memory.
    int64_t kv_bytes_per_token = 0;   // KV-cache bytes one token takes over all layers.
};

// Tokens to append to one slot at positions [start_pos, start_pos + tokens.size()).
struct SequenceChunk {
    int32_t slot = 0;
    int32_t start_pos = 0;  // Must equal the slot's current length.
    std::span<const TokenId> tokens;
    bool all_logits = false;  // Logits for every token of the chunk, not only the last.
};

class CausalLM {
public:
    virtual ~CausalLM() = default;

    virtual const ModelSpec& spec() const = 0;

    // A free slot with length 0, or kResourceExhausted when all are taken.
    virtual Result<int32_t> acquire_slot() = 0;
    virtual void release_slot(int32_t slot) = 0;
    // Drops the slot's cached tokens from position `length` on (for preemption and retries).
    virtual void truncate_slot(int32_t slot, int32_t length) = 0;
    virtual int32_t slot_length(int32_t slot) const = 0;
    // Fraction of the KV-cache budget holding tokens now, 0..1.
    virtual double kv_use() const = 0;

    // The prefix cache of a paged KV cache. Positions per block, the unit of sharing; 0 when
    // the model has no prefix cache (then the two calls below do nothing).
    virtual int32_t kv_block_tokens() const { return 0; }
    // Attaches the cached blocks named by `chain` to `slot` after the whole blocks it holds
    // (chain[i] names its block i: an empty slot, or one holding a prefix of the same prompt),
    // stopping at the first miss, and returns the slot's length then (positions, all computed).
    // A slot holding part of a block is left as it is.
    virtual int32_t attach_prefix(int32_t slot, std::span<const BlockHash> chain) {
        (void)slot;
        (void)chain;
        return 0;
    }
    // Offers the slot's first chain.size() blocks (full and computed) to the prefix cache under
    // these hashes.
    virtual void publish_prefix(int32_t slot, std::span<const BlockHash> chain) {
        (void)slot;
        (void)chain;
    }
    // Preemption by swapping: a copy of the slot's cached positions in host memory (of at most
    // `max_bytes`, else kResourceExhausted before any copying; leading prefix blocks other slots
    // share are not copied, SavedSlot::shared), and putting one back into a slot that holds
    // exactly that shared prefix, attached again, or nothing (kResourceExhausted, nothing
    // changed, when the cache cannot hold it).
    // kUnimplemented where the cache does not live in host memory; the scheduler then
    // recomputes a preempted sequence from its tokens.
    virtual Result<SavedSlot> save_slot(int32_t slot, int64_t max_bytes) const {
        (void)slot;
        (void)max_bytes;
        return unimplemented_error("this model's KV cache is not saved to host memory");
    }
    virtual Status restore_slot(int32_t slot, const SavedSlot& saved) {
        (void)slot;
        (void)saved;
        return unimplemented_error("this model's KV cache is not restored from host memory");
    }
    // Blocks and bytes of the KV cache now.
    virtual KvCacheStats kv_stats() const { return {}; }

    // Runs the chunks as one batch. `logits` receives, chunk by chunk in order, vocab_size floats
    // for the last token (or for each token when all_logits). kResourceExhausted when the KV cache
    // cannot hold the new tokens (nothing is changed then); kInvalidArgument for bad positions,
    // token ids out of range or a context overflow.
    virtual Status forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) = 0;

    // Runs body(i) for every i in [0, n) on the host threads forward() uses, each i once, and
    // returns when all are done; called between forward() calls (the scheduler samples the
    // sequences of a step this way). The default runs them in turn on the calling thread.
    virtual void for_each_host_task(int64_t n, const std::function<void(int64_t)>& body) {
        for (int64_t i = 0; i < n; ++i) {
            body(i);
        }
    }

    // Expert-parallel sharding figures of the MoE layers (docs/sharding.md), between forward()
    // calls; nullopt for a model without a sharded MoE block.
    virtual std::optional<shard::ShardStats> shard_stats() const { return std::nullopt; }

    // Decoder layers forward() has finished since load, counted as each one ends: read from
    // any thread while a step runs, it shows that a long step (a large prefill chunk on the CPU)
    // is moving (the watchdog's liveness check). A model that runs a step as one unit (a device
    // graph) leaves it at 0: its steps alone show progress.
    int64_t layers_run() const { return layers_run_.load(std::memory_order_relaxed); }

  protected:
    void layer_done() { layers_run_.fetch_add(1, std::memory_order_relaxed); }

  private:
    std::atomic<int64_t> layers_run_{0};
};

}  // namespace edge::engine
