#include "engine/model/kv_cache.h"

#include <sys/mman.h>

#include "common/check.h"

namespace edge::engine {

Result<std::unique_ptr<KvCache>> KvCache::create(const KvCacheShape& shape) {
    if (shape.layers <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 || shape.slots <= 0 ||
        shape.max_context <= 0 || shape.max_tokens <= 0) {
        return invalid_argument_error("KV cache: every dimension must be positive");
    }
    auto cache = std::unique_ptr<KvCache>(new KvCache(shape));
    int64_t per_slot = 0;
    int64_t total = 0;
    if (__builtin_mul_overflow(cache->bytes_per_token(), static_cast<int64_t>(shape.max_context),
                               &per_slot) ||
        __builtin_mul_overflow(per_slot, static_cast<int64_t>(shape.slots), &total)) {
        return invalid_argument_error("KV cache: size overflows");
    }
    // Reserved, not committed: pages become resident as positions are written.
    void* p = mmap(nullptr, static_cast<size_t>(total), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        return resource_exhausted_error("KV cache: cannot reserve " + std::to_string(total) +
                                        " bytes of address space");
    }
    cache->data_ = static_cast<float*>(p);
    cache->bytes_ = static_cast<size_t>(total);
    cache->lengths_.assign(shape.slots, 0);
    cache->in_use_.assign(shape.slots, false);
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
            return s;
        }
    }
    return resource_exhausted_error("KV cache: all " + std::to_string(shape_.slots) +
                                    " slots are in use");
}

void KvCache::release(int32_t slot) {
    if (slot < 0 || slot >= shape_.slots || !in_use_[slot]) {
        return;
    }
    set_length(slot, 0);
    in_use_[slot] = false;
}

bool KvCache::in_use(int32_t slot) const {
    return slot >= 0 && slot < shape_.slots && in_use_[slot];
}

int32_t KvCache::length(int32_t slot) const {
    return slot >= 0 && slot < shape_.slots ? lengths_[slot] : 0;
}

void KvCache::set_length(int32_t slot, int32_t length) {
    EDGE_CHECK(slot >= 0 && slot < shape_.slots && length >= 0 && length <= shape_.max_context);
    used_tokens_ += length - lengths_[slot];
    lengths_[slot] = length;
}

float* KvCache::head_base(int32_t slot, int32_t layer, int32_t which, int32_t kv_head) {
    int64_t index = ((static_cast<int64_t>(slot) * shape_.layers + layer) * 2 + which) *
                        shape_.kv_heads +
                    kv_head;
    return data_ + index * shape_.max_context * shape_.head_dim;
}

float* KvCache::keys(int32_t slot, int32_t layer, int32_t kv_head) {
    return head_base(slot, layer, 0, kv_head);
}

float* KvCache::values(int32_t slot, int32_t layer, int32_t kv_head) {
    return head_base(slot, layer, 1, kv_head);
}

}  // namespace edge::engine
