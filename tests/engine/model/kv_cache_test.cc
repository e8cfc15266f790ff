#include "engine/model/kv_cache.h"

#include <doctest/doctest.h>

#include <random>

#include "engine/cpu/ops.h"
#include "engine/model/block_pool.h"
#include "engine/model/paged_attention.h"
#include "tests/engine/model/random_kv_slot.h"

namespace edge::engine {
namespace {

BlockHash hash_of(uint8_t v) {
    BlockHash h{};
    h[0] = v;
    h[31] = static_cast<uint8_t>(v * 7 + 1);
    return h;
}

KvCacheShape small_shape(int32_t blocks, int32_t block_tokens = 4) {
    KvCacheShape s;
    s.layers = 2;
    s.kv_heads = 2;
    s.head_dim = 3;
    s.slots = 4;
    s.max_context = 64;
    s.block_tokens = block_tokens;
    s.budget_bytes = int64_t{blocks} * block_tokens * 2 * 2 * 2 * 3 * 4;
    return s;
}

TEST_CASE("block pool: free blocks first, then the least recently released cached one") {
    BlockPool pool(3);
    CHECK(pool.available() == 3);
    auto a = pool.allocate();
    auto b = pool.allocate();
    auto c = pool.allocate();
    REQUIRE((a.ok() && b.ok() && c.ok()));
    CHECK(pool.available() == 0);
    CHECK(pool.allocate().status().code() == StatusCode::kResourceExhausted);
    pool.publish(*a, hash_of(1));
    pool.publish(*b, hash_of(2));
    pool.release(*b);  // Cached, released first.
    pool.release(*a);  // Cached, released second.
    pool.release(*c);  // No hash: free.
    CHECK(pool.cached() == 2);
    CHECK(pool.available() == 3);
    // The free one goes first, then b (least recently released), keeping a's hash.
    CHECK(*pool.allocate() == *c);
    CHECK(*pool.allocate() == *b);
    CHECK(pool.find(hash_of(2)) == -1);
    CHECK(pool.find(hash_of(1)) == *a);
    CHECK(pool.evictions() == 1);
    // Reviving a cached block takes it off the LRU list.
    pool.retain(*a);
    CHECK(pool.cached() == 0);
    CHECK(pool.allocate().status().code() == StatusCode::kResourceExhausted);
    // A hash already indexed is not indexed twice.
    pool.publish(*c, hash_of(1));
    CHECK(pool.find(hash_of(1)) == *a);
    CHECK_FALSE(pool.hashed(*c));
}

TEST_CASE("kv cache: the block count is what the budget holds and growth past it fails") {
    auto kv = KvCache::create(small_shape(5));
    REQUIRE(kv.ok());
    KvCache& c = **kv;
    CHECK(c.num_blocks() == 5);
    CHECK(c.stats().allocated_bytes <= c.shape().budget_bytes);
    auto s0 = c.acquire();
    auto s1 = c.acquire();
    REQUIRE((s0.ok() && s1.ok()));
    const SlotGrowth g1[] = {{*s0, 10}, {*s1, 8}};  // 3 + 2 blocks.
    REQUIRE(c.reserve(g1).ok());
    c.set_length(*s0, 10);
    c.set_length(*s1, 8);
    CHECK(c.use() == doctest::Approx(1.0));
    const SlotGrowth g2[] = {{*s0, 11}, {*s1, 9}};  // s0 fits in its block, s1 needs one more.
    CHECK(c.reserve(g2).code() == StatusCode::kResourceExhausted);
    CHECK(c.blocks(*s1).size() == 2);  // Nothing changed.
    c.truncate(*s0, 4);
    CHECK(c.blocks(*s0).size() == 1);
    CHECK(c.used_tokens() == 12);
    CHECK(c.reserve(g2).code() == StatusCode::kResourceExhausted);  // Needs 3, 2 are free.
    const SlotGrowth g3[] = {{*s1, 9}};
    CHECK(c.reserve(g3).ok());
    c.release(*s0);
    c.release(*s1);
    CHECK(c.use() == 0.0);
    CHECK(c.used_tokens() == 0);

    KvCacheShape tiny = small_shape(1);
    tiny.budget_bytes -= 1;
    auto none = KvCache::create(tiny);
    REQUIRE_FALSE(none.ok());
    CHECK(none.status().message().find("holds no block") != std::string::npos);
}

TEST_CASE("kv cache: published blocks are attached to a later slot and copied before a write") {
    auto kv = KvCache::create(small_shape(8));
    REQUIRE(kv.ok());
    KvCache& c = **kv;
    auto a = *c.acquire();
    const SlotGrowth ga[] = {{a, 10}};
    REQUIRE(c.reserve(ga).ok());
    for (int32_t p = 0; p < 10; ++p) {
        *c.key(a, 1, 1, p) = static_cast<float>(p);
        *c.value(a, 0, 0, p) = static_cast<float>(100 + p);
    }
    c.set_length(a, 10);
    const BlockHash chain[] = {hash_of(1), hash_of(2), hash_of(3)};
    c.publish_prefix(a, chain);  // Only the two full blocks are indexed.
    c.release(a);
    CHECK(c.stats().blocks_cached == 2);

    auto b = *c.acquire();
    CHECK(c.attach_prefix(b, chain) == 8);
    CHECK(c.length(b) == 8);
    CHECK(*c.key(b, 1, 1, 7) == 7.0f);
    CHECK(*c.value(b, 0, 0, 5) == 105.0f);
    // A second sequence shares the same blocks.
    auto d = *c.acquire();
    CHECK(c.attach_prefix(d, std::span<const BlockHash>(chain, 1)) == 4);
    CHECK(c.blocks(d)[0] == c.blocks(b)[0]);
    // d truncates into the shared block and writes: it gets a copy; b's data stays.
    c.truncate(d, 2);
    const SlotGrowth gd[] = {{d, 3}};
    REQUIRE(c.reserve(gd).ok());
    CHECK(c.blocks(d)[0] != c.blocks(b)[0]);
    *c.key(d, 1, 1, 2) = -1.0f;
    c.set_length(d, 3);
    CHECK(*c.key(d, 1, 1, 1) == 1.0f);  // Copied.
    CHECK(*c.key(b, 1, 1, 2) == 2.0f);  // Untouched.
    // A miss stops the chain.
    auto e = *c.acquire();
    const BlockHash other[] = {hash_of(9), hash_of(1)};
    CHECK(c.attach_prefix(e, other) == 0);
    // A slot holding whole blocks of the chain attaches the rest after them: one that attached
    // the first block, and d, whose first block is its own copy once it is full.
    c.release(e);
    auto g = *c.acquire();
    CHECK(c.attach_prefix(g, std::span<const BlockHash>(chain, 1)) == 4);
    CHECK(c.attach_prefix(g, chain) == 8);
    CHECK(c.blocks(g)[1] == c.blocks(b)[1]);
    CHECK(c.attach_prefix(g, chain) == 8);  // Nothing more is cached.
    const SlotGrowth gd4[] = {{d, 4}};
    REQUIRE(c.reserve(gd4).ok());
    c.set_length(d, 4);
    CHECK(c.attach_prefix(d, chain) == 8);
    CHECK(c.blocks(d)[1] == c.blocks(b)[1]);
    CHECK(*c.key(d, 1, 1, 6) == 6.0f);
    // A slot holding part of a block attaches nothing.
    c.release(g);
    auto f = *c.acquire();
    const SlotGrowth gf[] = {{f, 3}};
    REQUIRE(c.reserve(gf).ok());
    c.set_length(f, 3);
    CHECK(c.attach_prefix(f, chain) == 3);
    CHECK(c.blocks(f).size() == 1);
}

TEST_CASE("kv cache: a saved slot is restored bit for bit into private blocks, or not at all") {
    auto kv = KvCache::create(small_shape(6));
    REQUIRE(kv.ok());
    KvCache& c = **kv;
    auto a = *c.acquire();
    const SlotGrowth ga[] = {{a, 10}};  // 3 blocks, the last one half full.
    REQUIRE(c.reserve(ga).ok());
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    for (int32_t p = 0; p < 10; ++p) {
        for (int32_t l = 0; l < 2; ++l) {
            for (int32_t h = 0; h < 2; ++h) {
                for (int32_t d = 0; d < 3; ++d) {
                    c.key(a, l, h, p)[d] = dist(rng);
                    c.value(a, l, h, p)[d] = dist(rng);
                }
            }
        }
    }
    c.set_length(a, 10);
    const BlockHash chain[] = {hash_of(1)};
    c.publish_prefix(a, chain);  // A shared, cached first block is saved like the others.
    // A budget one block short copies nothing.
    CHECK(c.save(a, 3 * c.block_bytes() - 1).status().code() == StatusCode::kResourceExhausted);
    const SavedSlot saved = *c.save(a, 3 * c.block_bytes());
    CHECK(saved.length == 10);
    CHECK(saved.bytes() == 3 * c.block_bytes());
    c.release(a);

    // Four of six blocks taken: the three it needs are not there, and nothing changes.
    auto other = *c.acquire();
    const SlotGrowth go[] = {{other, 16}};
    REQUIRE(c.reserve(go).ok());
    c.set_length(other, 16);
    auto b = *c.acquire();
    CHECK(c.restore(b, saved).code() == StatusCode::kResourceExhausted);
    CHECK(c.length(b) == 0);
    CHECK(c.blocks(b).empty());
    c.release(other);

    REQUIRE(c.restore(b, saved).ok());
    CHECK(c.length(b) == 10);
    REQUIRE(c.blocks(b).size() == 3);
    const SavedSlot again = *c.save(b, INT64_MAX);
    CHECK(again.data == saved.data);  // Every key and value, bit for bit.
    // The restored blocks are private: writing them leaves the cached prefix block alone.
    CHECK(c.stats().blocks_cached + c.stats().blocks_used <= c.num_blocks());
    c.key(b, 0, 0, 0)[0] = 99.0f;
    auto d = *c.acquire();
    if (c.attach_prefix(d, chain) == 4) {
        CHECK(c.key(d, 0, 0, 0)[0] == saved.data[0]);
    }
}

TEST_CASE("kv cache: prefix blocks another slot shares are not saved, but attached again") {
    auto kv = KvCache::create(small_shape(12));
    REQUIRE(kv.ok());
    KvCache& c = **kv;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    const auto fill = [&](int32_t slot, int32_t from, int32_t to) {
        for (int32_t p = from; p < to; ++p) {
            for (int32_t l = 0; l < 2; ++l) {
                for (int32_t h = 0; h < 2; ++h) {
                    for (int32_t d = 0; d < 3; ++d) {
                        c.key(slot, l, h, p)[d] = dist(rng);
                        c.value(slot, l, h, p)[d] = dist(rng);
                    }
                }
            }
        }
    };
    // Slot a computes and publishes a prompt of two blocks; slot s attaches them and goes on.
    auto a = *c.acquire();
    const SlotGrowth ga[] = {{a, 8}};
    REQUIRE(c.reserve(ga).ok());
    fill(a, 0, 8);
    c.set_length(a, 8);
    const BlockHash chain[] = {hash_of(1), hash_of(2)};
    c.publish_prefix(a, chain);
    auto s = *c.acquire();
    REQUIRE(c.attach_prefix(s, chain) == 8);
    const SlotGrowth gs[] = {{s, 14}};
    REQUIRE(c.reserve(gs).ok());
    fill(s, 8, 14);
    c.set_length(s, 14);
    std::vector<float> want;
    for (int32_t p = 0; p < 14; ++p) {
        want.insert(want.end(), c.key(s, 1, 1, p), c.key(s, 1, 1, p) + 3);
        want.insert(want.end(), c.value(s, 1, 1, p), c.value(s, 1, 1, p) + 3);
    }

    // Only its own two blocks are copied: the shared ones stay in the cache while a holds them.
    Result<SavedSlot> save = c.save(s, 2 * c.block_bytes());
    REQUIRE(save.ok());
    const SavedSlot saved = *std::move(save);
    CHECK(saved.length == 14);
    CHECK(saved.shared == 8);
    CHECK(saved.bytes() == 2 * c.block_bytes());
    c.release(s);

    // With the prefix attached again, the restore needs those two blocks only.
    auto t = *c.acquire();
    REQUIRE(c.attach_prefix(t, chain) == 8);
    auto other = *c.acquire();
    const SlotGrowth go[] = {{other, 4 * (c.num_blocks() - 4)}};  // All but 2 blocks taken.
    REQUIRE(c.reserve(go).ok());
    REQUIRE(c.restore(t, saved).ok());
    CHECK(c.length(t) == 14);
    REQUIRE(c.blocks(t).size() == 4);
    CHECK(c.blocks(t)[0] == c.blocks(a)[0]);
    CHECK(c.blocks(t)[1] == c.blocks(a)[1]);
    std::vector<float> got;
    for (int32_t p = 0; p < 14; ++p) {
        got.insert(got.end(), c.key(t, 1, 1, p), c.key(t, 1, 1, p) + 3);
        got.insert(got.end(), c.value(t, 1, 1, p), c.value(t, 1, 1, p) + 3);
    }
    CHECK(got == want);

    // Held by this slot alone, published blocks are copied like the rest.
    c.release(a);
    const SavedSlot alone = *c.save(t, INT64_MAX);
    CHECK(alone.shared == 0);
    CHECK(alone.bytes() == 4 * c.block_bytes());
}

TEST_CASE("kv cache: eviction takes a cached chain's last block first, its root last") {
    auto kv = KvCache::create(small_shape(6));
    REQUIRE(kv.ok());
    KvCache& c = **kv;
    auto a = *c.acquire();
    const SlotGrowth ga[] = {{a, 16}};
    REQUIRE(c.reserve(ga).ok());
    c.set_length(a, 16);
    const BlockHash chain[] = {hash_of(1), hash_of(2), hash_of(3), hash_of(4)};
    c.publish_prefix(a, chain);
    c.release(a);
    CHECK(c.stats().blocks_cached == 4);
    // Another sequence needs 3 blocks: the 2 free ones and 1 cached, the chain's leaf.
    auto b = *c.acquire();
    const SlotGrowth gb[] = {{b, 12}};
    REQUIRE(c.reserve(gb).ok());
    c.release(b);
    auto d = *c.acquire();
    CHECK(c.attach_prefix(d, chain) == 12);
}

TEST_CASE("paged attention equals contiguous attention bit for bit") {
    // A head size no SIMD form takes (those need multiples of 8 or 16 and sum in another order,
    // swiglu_batch_test.cc), so both sides run the same scalar loops.
    constexpr int32_t hd = 12;
    for (int32_t bt : {1, 4, 16}) {
        std::mt19937 rng(5);
        std::normal_distribution<float> dist;
        const int32_t n = 37;
        RandomKvSlot kv = random_kv_slot(hd, bt, n, int64_t{1} << 20, rng);
        KvCache& c = *kv.cache;
        const int32_t slot = kv.slot;
        const std::vector<float>& keys = kv.keys;
        const std::vector<float>& values = kv.values;
        std::vector<float> q(3 * hd);
        for (float& x : q) {
            x = dist(rng);
        }
        std::vector<float> want(3 * hd), got(3 * hd), scores(3 * n);
        cpu::attention_gqa(q.data(), 3, hd, keys.data(), values.data(), hd, n, 0.3f, scores.data(),
                           want.data());
        paged_attention_gqa(c, slot, 0, 1, q.data(), 3, n, 0.3f, scores.data(), got.data());
        CHECK(got == want);
        std::vector<float> gathered(n * hd);
        gather_values(c, slot, 0, 1, n, gathered.data());
        CHECK(gathered == values);
    }
}

}  // namespace
}  // namespace edge::engine
