#pragma once

// A paged KV cache (one layer, two KV heads) whose slot holds `tokens` random rows for KV head 1,
// its blocks interleaved with a filler slot's so they are not contiguous, and the same rows
// contiguous for a reference attention: what the paged attention tests compare against
// cpu::attention_gqa.

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "engine/model/kv_cache.h"

namespace edge::engine {

struct RandomKvSlot {
    std::unique_ptr<KvCache> cache;
    int32_t slot = -1;
    std::vector<float> keys;    // tokens x head_dim, as written to KV head 1.
    std::vector<float> values;  // Likewise.
};

inline RandomKvSlot random_kv_slot(int32_t head_dim, int32_t block_tokens, int32_t tokens,
                                   int64_t budget_bytes, std::mt19937& rng) {
    KvCacheShape s;
    s.layers = 1;
    s.kv_heads = 2;
    s.head_dim = head_dim;
    s.slots = 2;
    s.max_context = 64;
    s.block_tokens = block_tokens;
    s.budget_bytes = budget_bytes;
    auto kv = KvCache::create(s);
    REQUIRE(kv.ok());
    RandomKvSlot out;
    out.cache = std::move(kv).value();
    KvCache& c = *out.cache;
    const int32_t filler = *c.acquire();
    out.slot = *c.acquire();
    std::normal_distribution<float> dist;
    const auto size = static_cast<size_t>(tokens) * static_cast<size_t>(head_dim);
    out.keys.resize(size);
    out.values.resize(size);
    for (int32_t p = 0; p < tokens; ++p) {
        const SlotGrowth g[] = {{filler, p + 1}, {out.slot, p + 1}};
        REQUIRE(c.reserve(g).ok());
        c.set_length(filler, p + 1);
        c.set_length(out.slot, p + 1);
        for (int32_t d = 0; d < head_dim; ++d) {
            const auto i =
                static_cast<size_t>(p) * static_cast<size_t>(head_dim) + static_cast<size_t>(d);
            out.keys[i] = dist(rng);
            out.values[i] = dist(rng);
            c.key(out.slot, 0, 1, p)[d] = out.keys[i];
            c.value(out.slot, 0, 1, p)[d] = out.values[i];
        }
    }
    return out;
}

}  // namespace edge::engine
