// Host-side planning of the CUDA backend, no GPU needed: arena sizing and sub-allocation, launch
// shapes and the shapes the kernels refuse.

#include <doctest/doctest.h>

#include "engine/cuda/host/device_memory_plan.h"
#include "engine/cuda/host/launch_plan.h"

namespace edge::engine::cuda {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST_CASE("plan_arena_bytes: fraction of free memory minus the reserve, aligned") {
    DeviceMemoryConfig c;
    c.free_fraction = 0.5;
    c.reserve_bytes = kGiB;
    auto bytes = plan_arena_bytes(c, 80 * kGiB, 96 * kGiB);
    REQUIRE(bytes.ok());
    CHECK(*bytes == 39 * kGiB);
    CHECK(*bytes % c.alignment == 0);
}

TEST_CASE("plan_arena_bytes: an explicit arena must fit next to the reserve") {
    DeviceMemoryConfig c;
    c.arena_bytes = 10 * kGiB + 100;
    c.reserve_bytes = kGiB;
    auto ok = plan_arena_bytes(c, 12 * kGiB, 16 * kGiB);
    REQUIRE(ok.ok());
    CHECK(*ok == 10 * kGiB);  // Rounded down to the alignment.
    auto too_big = plan_arena_bytes(c, 11 * kGiB, 16 * kGiB);
    REQUIRE_FALSE(too_big.ok());
    CHECK(too_big.status().code() == StatusCode::kResourceExhausted);
    CHECK(too_big.status().message().find("does not fit") != std::string::npos);
}

TEST_CASE("plan_arena_bytes rejects bad configs and inconsistent device reports") {
    DeviceMemoryConfig c;
    c.alignment = 100;
    CHECK(plan_arena_bytes(c, kGiB, kGiB).status().code() == StatusCode::kInvalidArgument);
    c = DeviceMemoryConfig{};
    c.free_fraction = 1.5;
    CHECK(plan_arena_bytes(c, kGiB, kGiB).status().code() == StatusCode::kInvalidArgument);
    c = DeviceMemoryConfig{};
    CHECK(plan_arena_bytes(c, 2 * kGiB, kGiB).status().code() == StatusCode::kInvalidArgument);
    // The default 1 GiB reserve leaves nothing of 1 GiB free.
    CHECK(plan_arena_bytes(c, kGiB, 2 * kGiB).status().code() ==
          StatusCode::kResourceExhausted);
}

TEST_CASE("ArenaPlanner: aligned first fit, coalescing frees, exhaustion names the request") {
    ArenaPlanner a(4096, 256);
    auto x = a.allocate(100, "x");
    auto y = a.allocate(300, "y");
    auto z = a.allocate(256, "z");
    REQUIRE(x.ok());
    REQUIRE(y.ok());
    REQUIRE(z.ok());
    CHECK(*x == 0);
    CHECK(*y == 256);
    CHECK(*z == 768);
    CHECK(a.used() == 1024);
    REQUIRE(a.release(*y).ok());
    REQUIRE(a.release(*x).ok());  // Coalesces with y's range: 768 bytes at 0.
    auto w = a.allocate(700, "w");
    REQUIRE(w.ok());
    CHECK(*w == 0);
    auto big = a.allocate(4000, "kv pool");
    REQUIRE_FALSE(big.ok());
    CHECK(big.status().code() == StatusCode::kResourceExhausted);
    CHECK(big.status().message().find("kv pool") != std::string::npos);
    CHECK(a.release(12345).code() == StatusCode::kInvalidArgument);
    CHECK(a.allocate(0, "empty").status().code() == StatusCode::kInvalidArgument);
    REQUIRE(a.release(*w).ok());
    REQUIRE(a.release(*z).ok());
    CHECK(a.used() == 0);
    CHECK(a.largest_free() == 4096);
    CHECK(a.high_water() == 1024);
}

TEST_CASE("plan_grouped_matmul: grid, vector path, and refused shapes") {
    auto p = plan_grouped_matmul(WeightFormat::kInt4G32, 1000, 1024, 64);
    REQUIRE(p.ok());
    CHECK(p->shape.grid_x == (1000 + kMatmulWarps - 1) / kMatmulWarps);
    CHECK(p->shape.grid_y == 64);
    CHECK(p->shape.block == kMatmulWarps * 32);
    CHECK(p->vectorized);
    CHECK_FALSE(p->by_row);
    // A token's 8 experts of 64: a block row per row of x; 64 rows or more: one per group.
    auto few = plan_grouped_matmul(WeightFormat::kBF16, 512, 1024, 64, 8);
    REQUIRE(few.ok());
    CHECK(few->by_row);
    CHECK(few->shape.grid_y == 8);
    auto many = plan_grouped_matmul(WeightFormat::kBF16, 512, 1024, 64, 64);
    REQUIRE(many.ok());
    CHECK_FALSE(many->by_row);
    CHECK(many->shape.grid_y == 64);
    CHECK_FALSE(plan_grouped_matmul(WeightFormat::kBF16, 512, 1024, 64, -1).ok());
    auto odd = plan_grouped_matmul(WeightFormat::kBF16, 7, 44, 1);
    REQUIRE(odd.ok());
    CHECK_FALSE(odd->vectorized);
    CHECK(odd->shape.grid_x == (7 + kMatmulWarps - 1) / kMatmulWarps);
    CHECK_FALSE(plan_grouped_matmul(WeightFormat::kInt4G32, 8, 48, 1).ok());  // 48 % 32 != 0.
    CHECK_FALSE(plan_grouped_matmul(WeightFormat::kInt4G128, 8, 192, 1).ok());
    CHECK_FALSE(plan_grouped_matmul(WeightFormat::kBF16, 0, 64, 1).ok());
    CHECK_FALSE(plan_grouped_matmul(WeightFormat::kBF16, 8, 64, 70000).ok());
    for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kF16,
                           WeightFormat::kFP8E4M3Block128, WeightFormat::kInt8Row,
                           WeightFormat::kInt4G32, WeightFormat::kInt4G128}) {
        CHECK(cuda_matmul_supports(f));
    }
}

TEST_CASE("plan_attention: one block per (token, head), head_dim limits") {
    auto s = plan_attention(65, 16, 4, 128);
    REQUIRE(s.ok());
    CHECK(s->grid_x == 65);
    CHECK(s->grid_y == 16);
    CHECK(s->block == kAttentionThreads);
    CHECK(s->shared_bytes == attention_shared_floats(128) * 4);
    CHECK(attention_shared_floats(128) == 128 + 4 + 8 + 128 + 512);
    CHECK_FALSE(plan_attention(1, 16, 4, 40).ok());   // Not a multiple of 32.
    CHECK_FALSE(plan_attention(1, 16, 4, 512).ok());  // Above kMaxAttentionHeadDim.
    CHECK_FALSE(plan_attention(1, 15, 4, 64).ok());   // GQA group must divide.
    CHECK_FALSE(plan_attention(0, 16, 4, 64).ok());
}

TEST_CASE("plan_rows and plan_elementwise clamp their thread and block counts") {
    CHECK(plan_rows(10, 1).block == 32);
    CHECK(plan_rows(10, 100).block == 128);
    CHECK(plan_rows(10, 100000).block == 256);
    CHECK(plan_rows(10, 100000, 1024).block == 1024);
    CHECK(plan_rows(0, 5).grid_x == 1);
    CHECK(plan_elementwise(1).grid_x == 1);
    CHECK(plan_elementwise(257).grid_x == 2);
    CHECK(plan_elementwise(int64_t{1} << 40).grid_x == 4096);
}

}  // namespace
}  // namespace edge::engine::cuda
