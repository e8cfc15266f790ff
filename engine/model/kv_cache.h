#pragma once

// KvCache holds the keys and values of every sequence slot in f32: per slot, per layer, per KV
// head, `max_context` positions of `head_dim` values, so one head's keys are contiguous for
// attention. The memory is reserved up front but only touched pages become resident, so a mostly
// empty cache costs little. A token budget (from LoadOptions::kv_cache_bytes) caps the tokens held
// over all slots. A later issue replaces this with a paged cache behind the same uses.
//
// Threading: not synchronized; the model's forward owns it. Distinct (slot, layer, head, position)
// entries may be written from different threads.

#include <cstdint>
#include <memory>
#include <vector>

#include "common/result.h"

namespace edge::engine {

struct KvCacheShape {
    int32_t layers = 0;       // Decoder layers.
    int32_t kv_heads = 0;     // Key/value heads per layer.
    int32_t head_dim = 0;     // Values per head.
    int32_t slots = 0;        // Sequences held at once.
    int32_t max_context = 0;  // Positions per sequence.
    int64_t max_tokens = 0;   // Tokens over all slots at most (the memory budget).
};

class KvCache {
public:
    static Result<std::unique_ptr<KvCache>> create(const KvCacheShape& shape);
    ~KvCache();
    KvCache(const KvCache&) = delete;
    KvCache& operator=(const KvCache&) = delete;

    const KvCacheShape& shape() const { return shape_; }
    // Bytes of K and V that one token takes over all layers.
    int64_t bytes_per_token() const;

    Result<int32_t> acquire();
    void release(int32_t slot);
    bool in_use(int32_t slot) const;
    int32_t length(int32_t slot) const;
    // Sets the slot's length (growing after a forward wrote the entries, or truncating).
    void set_length(int32_t slot, int32_t length);
    // Tokens held over all slots.
    int64_t used_tokens() const { return used_tokens_; }

    // [max_context][head_dim] keys (or values) of one slot, layer and KV head.
    float* keys(int32_t slot, int32_t layer, int32_t kv_head);
    float* values(int32_t slot, int32_t layer, int32_t kv_head);

private:
    explicit KvCache(const KvCacheShape& shape) : shape_(shape) {}
    float* head_base(int32_t slot, int32_t layer, int32_t which, int32_t kv_head);

    KvCacheShape shape_;
    float* data_ = nullptr;
    size_t bytes_ = 0;
    std::vector<int32_t> lengths_;
    std::vector<bool> in_use_;
    int64_t used_tokens_ = 0;
};

}  // namespace edge::engine
