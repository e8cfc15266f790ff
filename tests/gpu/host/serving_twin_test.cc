// The whole serving path of the device forward on the CPU (no GPU): the CausalLM of
// host/serving_model.h driven like the scheduler drives it, with the CPU twin of the device's
// steps (host/twin_step_runner.h: the same staging buffers, paged pool, scratch block and padded
// rows, every op a kernel's CPU twin), against the CPU model. What it leaves to the gpu suite:
// the CUDA kernels themselves (each compared with its twin there) and the graphs.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/backend.h"
#include "engine/cuda/host/serving_model.h"
#include "engine/cuda/host/twin_step_runner.h"
#include "tests/gpu/host/serving_script.h"
#include "tests/testing/test_certs.h"

namespace edge::engine::cuda {
namespace {

TEST_CASE(
    "serving path on the CPU twin: prefill steps, buckets, decode and prefix copy-on-write "
    "equal the CPU model") {
    auto cpu = load_model(testing::kMicroQwen3, testing::serving_script_options("cpu"));
    REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
    auto twin = load_serving_causal_lm(
        testing::kMicroQwen3, testing::serving_script_options("cuda"), create_twin_step_runner);
    REQUIRE_MESSAGE(twin.ok(), twin.status().to_string());
    // Same weights and f32 activations; the twins accumulate matmuls in double.
    testing::run_serving_script(**cpu, **twin, 1e-3);
}

TEST_CASE(
    "serving path on the CPU twin: GLM-4.5 (dense first layer, shared expert, sigmoid grouped "
    "routing with correction bias, q/k/v bias, q/k norm, partial RoPE) equals the CPU model") {
    auto cpu = load_model(testing::kMicroGlm4, testing::serving_script_options("cpu"));
    REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
    auto twin = load_serving_causal_lm(testing::kMicroGlm4, testing::serving_script_options("cuda"),
                                       create_twin_step_runner);
    REQUIRE_MESSAGE(twin.ok(), twin.status().to_string());
    CHECK(twin->get()->spec().architecture == cpu->get()->spec().architecture);
    CHECK(twin->get()->spec().eos_token_ids == cpu->get()->spec().eos_token_ids);
    CHECK(twin->get()->spec().bos_token_id == cpu->get()->spec().bos_token_id);
    CHECK(twin->get()->spec().weight_bytes == cpu->get()->spec().weight_bytes);
    CHECK(twin->get()->spec().kv_bytes_per_token == cpu->get()->spec().kv_bytes_per_token);
    // As Qwen3's: the same BF16 weights and f32 activations, the twins' matmuls accumulating in
    // double against the CPU's f32 sums; routed_scaling_factor 2.5 scales the routed part.
    testing::run_serving_script(**cpu, **twin, 1e-3);
}

TEST_CASE(
    "serving path on the CPU twin: GLM-4.5 variants (no shared expert, no q/k norm, one expert "
    "group, no attention bias) equal the CPU model") {
    std::ifstream in(testing::kMicroGlm4 + "/config.json");
    std::ostringstream text;
    text << in.rdbuf();
    const std::vector<std::pair<std::string, std::string>> variants = {
        {"\"n_shared_experts\": 1", "\"n_shared_experts\": 0"},
        {"\"use_qk_norm\": true", "\"use_qk_norm\": false"},
        {"\"n_group\": 2", "\"n_group\": 1"},
        {"\"attention_bias\": true", "\"attention_bias\": false"},
    };
    for (const auto& v : variants) {
        CAPTURE(v.second);
        edge::testing::TempDir dir;
        const std::string config = text.str();
        const size_t at = config.find(v.first);
        REQUIRE(at != std::string::npos);
        dir.write("config.json", std::string(config).replace(at, v.first.size(), v.second));
        std::filesystem::create_symlink(testing::kMicroGlm4 + "/model.safetensors",
                                        dir.file("model.safetensors"));
        auto cpu = load_model(dir.path(), testing::serving_script_options("cpu"));
        REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
        auto twin = load_serving_causal_lm(dir.path(), testing::serving_script_options("cuda"),
                                           create_twin_step_runner);
        REQUIRE_MESSAGE(twin.ok(), twin.status().to_string());
        testing::run_serving_script(**cpu, **twin, 1e-3);
    }
}

TEST_CASE("serving path: a sticky device fault fails every forward and changes no length") {
    clear_reported_device_fault_for_testing();
    auto twin = load_serving_causal_lm(
        testing::kMicroQwen3, testing::serving_script_options("cuda"), create_twin_step_runner);
    REQUIRE(twin.ok());
    CausalLM& m = **twin;
    const int32_t slot = *m.acquire_slot();
    const std::vector<TokenId> prompt = {1, 2, 3};
    const std::vector<SequenceChunk> batch = {{slot, 0, prompt, false}};
    std::vector<float> logits;
    REQUIRE(m.forward(batch, &logits).ok());
    report_device_fault(unavailable_error("CUDA device lost: injected by the test"));
    const std::vector<SequenceChunk> next = {{slot, 3, prompt, false}};
    const Status s = m.forward(next, &logits);
    clear_reported_device_fault_for_testing();  // Before any check can leave it set.
    CHECK(s.code() == StatusCode::kUnavailable);
    CHECK(s.message().find("injected") != std::string::npos);
    CHECK(m.slot_length(slot) == 3);
    CHECK(m.forward(next, &logits).ok());  // Only the fault stopped it.
}

TEST_CASE("serving path: configurations the whole-step forward does not run are kUnimplemented") {
    LoadOptions sharded = testing::serving_script_options("cuda");
    sharded.sharding.ranks = 2;
    LoadOptions blocks = testing::serving_script_options("cuda");
    blocks.kv_block_tokens = 32;
    LoadOptions cpu = testing::serving_script_options("cpu");
    for (const LoadOptions& o : {sharded, blocks, cpu}) {
        auto m = load_serving_causal_lm(testing::kMicroQwen3, o, create_twin_step_runner);
        REQUIRE_FALSE(m.ok());
        CHECK(serving_path_after(m.status()) == ServingPath::kFallback);
    }
    LoadOptions too_long = testing::serving_script_options("cuda");
    too_long.max_context = 1 << 20;
    auto bad = load_serving_causal_lm(testing::kMicroQwen3, too_long, create_twin_step_runner);
    REQUIRE_FALSE(bad.ok());
    CHECK(serving_path_after(bad.status()) == ServingPath::kFail);
}

}  // namespace
}  // namespace edge::engine::cuda
