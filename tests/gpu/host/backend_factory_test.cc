// The backend factory without a GPU: asking for "cuda" is a clear Status (kNotFound in a CPU-only
// build, kUnavailable in a CUDA build on a machine without a device), never a crash, and device
// health stays OK. On a GPU machine the backend is created instead.

#include <doctest/doctest.h>

#include <algorithm>

#include "engine/backend.h"
#include "engine/model/loader.h"

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

}  // namespace
}  // namespace edge::engine
