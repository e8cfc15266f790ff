// The backend factory without a GPU: asking for "cuda" is a clear Status (kNotFound in a CPU-only
// build, kUnavailable in a CUDA build on a machine without a device), never a crash, and device
// health stays OK. On a GPU machine the backend is created instead.

#include <doctest/doctest.h>

#include <algorithm>

#include "engine/backend.h"
#include "engine/cpu/matmul.h"
#include "engine/model/loader.h"
#include "engine/shard/communicator.h"

namespace edge::engine {
namespace {

bool has_cuda_device() {
    const auto names = available_backends();
    return std::find(names.begin(), names.end(), "cuda") != names.end();
}

TEST_CASE("create_backend(\"cuda\") without a device is a Status naming the backend") {
    const auto names = available_backends();
    CHECK(names.front() == "cpu");
    BackendOptions o;
    o.threads = 1;
    auto b = create_backend("cuda", o);
    if (has_cuda_device()) {
        REQUIRE(b.ok());
        CHECK((*b)->name() == "cuda");
        CHECK((*b)->health().ok());
        return;
    }
    REQUIRE_FALSE(b.ok());
    const StatusCode code = b.status().code();
    CHECK((code == StatusCode::kNotFound || code == StatusCode::kUnavailable));
    CHECK(b.status().message().find("cuda") != std::string::npos);
    CHECK(device_health().ok());
    auto cpu = create_backend("cpu", o);
    REQUIRE(cpu.ok());
    CHECK((*cpu)->health().ok());
    // engine.cpu_kernels: the best this CPU runs, or a lower one by name; an unknown name or
    // one above this CPU's best is an error naming the key.
    CHECK((*cpu)->cpu_kernels() == cpu::isa_name(cpu::detect_isa()));
    o.cpu_kernels = "scalar";
    auto scalar = create_backend("cpu", o);
    REQUIRE(scalar.ok());
    CHECK((*scalar)->cpu_kernels() == "scalar");
    o.cpu_kernels = "avx1024";
    auto unknown = create_backend("cpu", o);
    REQUIRE_FALSE(unknown.ok());
    CHECK(unknown.status().message().find("engine.cpu_kernels: 'avx1024' is not auto or one of") !=
          std::string::npos);
    if (cpu::detect_isa() != cpu::Isa::kAmxBf16) {
        o.cpu_kernels = "amx_bf16";
        auto above = create_backend("cpu", o);
        REQUIRE_FALSE(above.ok());
        CHECK(above.status().message().find("is not available on this CPU") != std::string::npos);
    }
}

TEST_CASE("loading a model on the cuda backend without a device fails cleanly") {
    if (has_cuda_device()) {
        return;  // Covered by the gpu-labelled end-to-end test.
    }
    LoadOptions lo;
    lo.threads = 1;
    lo.max_slots = 1;
    lo.max_context = 64;
    lo.backend = "cuda";
    auto m = load_model(EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe", lo);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().message().find("cuda") != std::string::npos);
    lo.backend = "tpu";
    auto bad = load_model(EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe", lo);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kNotFound);
}

TEST_CASE("the nccl communicator: listed in CUDA builds, a clear error without enough GPUs") {
    const auto kinds = shard::available_communicators();
    CHECK(kinds.front() == "in_process");
    const bool nccl = std::find(kinds.begin(), kinds.end(), "nccl") != kinds.end();
    if (!nccl) {
        auto g = shard::create_communicators("nccl", 2);
        REQUIRE_FALSE(g.ok());
        CHECK(g.status().code() == StatusCode::kNotFound);
        return;
    }
    // 65 ranks: more GPUs than any machine here has, so the count check answers before NCCL
    // is touched.
    auto g = shard::create_communicators("nccl", 65);
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(g.status().message().find("65 ranks need one GPU each") != std::string::npos,
                  g.status().message());
    if (!has_cuda_device()) {
        // Sharding onto CUDA ranks without GPUs fails at load, naming the shortage.
        LoadOptions lo;
        lo.threads = 1;
        lo.max_slots = 1;
        lo.max_context = 64;
        lo.sharding.ranks = 2;
        lo.sharding.communicator = "nccl";
        auto m = load_model(EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe", lo);
        REQUIRE_FALSE(m.ok());
        CHECK(m.status().message().find("GPU") != std::string::npos);
    }
}

}  // namespace
}  // namespace edge::engine
