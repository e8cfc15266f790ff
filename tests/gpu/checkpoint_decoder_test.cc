// The device decoder on a real checkpoint and the sharded engine on several GPUs: greedy tokens
// of the fixture model with every op of the decode step on the device (one CUDA graph per step)
// against the CPU backend (stored BF16 experts) and against the engine's forward on the CUDA
// backend (INT4 experts quantized on load); and
// the model sharded expert-parallel over all GPUs (one rank per GPU, NCCL) against one GPU; the
// GLM-4.5 fixture's greedy tokens on the device decoder against the CPU.

#include <algorithm>
#include <cstdio>

#include "engine/backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/device_decoder.h"
#include "engine/model/loader.h"
#include "tests/gpu/testing_gpu.h"

namespace edge::engine::cuda {
namespace {

const std::string kMicro = EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe";
const std::string kGlm = EDGE_SOURCE_DIR "/tests/fixtures/micro-glm4-moe";
const std::string kDeepseek = EDGE_SOURCE_DIR "/tests/fixtures/micro-deepseek-v3";
const std::vector<TokenId> kPrompt = {510, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114};

// Greedy decode of `steps` tokens after kPrompt through the engine's own forward.
std::vector<TokenId> engine_greedy(LoadOptions lo, int steps, std::vector<float>* first,
                                   const std::string& dir = kMicro) {
    lo.threads = 2;
    lo.max_slots = 2;
    lo.max_context = 256;
    auto model = load_model(dir, lo);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    CausalLM& m = **model;
    auto slot = m.acquire_slot();
    REQUIRE(slot.ok());
    std::vector<TokenId> out;
    std::vector<float> logits;
    int32_t pos = 0;
    std::vector<TokenId> chunk = kPrompt;
    for (int i = 0; i < steps; ++i) {
        SequenceChunk c{*slot, pos, chunk, false};
        Status s = m.forward(std::span<const SequenceChunk>(&c, 1), &logits);
        REQUIRE_MESSAGE(s.ok(), s.to_string());
        if (i == 0 && first != nullptr) {
            *first = logits;
        }
        pos += static_cast<int32_t>(chunk.size());
        const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
        out.push_back(static_cast<TokenId>(best));
        chunk = {static_cast<TokenId>(best)};
    }
    return out;
}

DeviceMemoryConfig small_arena() {
    DeviceMemoryConfig m;
    m.arena_bytes = int64_t{256} << 20;
    m.reserve_bytes = 0;
    return m;
}

TEST_CASE("end to end on the fixture model: the device decoder's greedy tokens equal the CPU's") {
    const int steps = 24;
    // BF16 as stored: against the CPU backend. INT4 experts: against the engine's own forward on
    // the CUDA backend (same quantized weights, same f32-activation matmul kernels), because the
    // CPU's INT4 kernels quantize activations to int8 and may flip a near-tie of the random
    // fixture's argmax.
    for (const char* policy : {"none", "experts-int4"}) {
        CAPTURE(policy);
        LoadOptions lo;
        lo.backend = std::string(policy) == "none" ? "cpu" : "cuda";
        lo.quantization = policy;
        const std::vector<TokenId> want = engine_greedy(lo, steps, nullptr);

        CheckpointDecoderOptions o;
        o.batch = 2;  // Two identical sequences: the batched kernels must keep them apart.
        o.max_context = 256;
        o.quantization = policy;
        auto dec = DeviceDecoder::create_from_checkpoint(kMicro, o, small_arena());
        REQUIRE_MESSAGE(dec.ok(), dec.status().to_string());
        DeviceDecoder& d = **dec;
        CHECK(d.shape().hidden == 128);
        std::vector<TokenId> gpu;
        // The prompt, one token per eager step; the last step's argmax is the first new token.
        for (TokenId t : kPrompt) {
            REQUIRE(d.set_tokens(std::vector<int32_t>{t, t}).ok());
            REQUIRE(d.step().ok());
        }
        auto first = d.last_tokens();
        REQUIRE(first.ok());
        CHECK((*first)[0] == (*first)[1]);
        gpu.push_back((*first)[0]);
        // The rest replayed as the captured graph, which feeds its own argmax back.
        for (int i = 1; i < steps; ++i) {
            REQUIRE(d.run_graph(1).ok());
            auto t = d.last_tokens();
            REQUIRE(t.ok());
            CHECK((*t)[0] == (*t)[1]);
            gpu.push_back((*t)[0]);
        }
        CHECK(gpu == want);
    }
    CHECK(cuda_device_health().ok());
}

// The device decoder's greedy tokens (eager prompt steps, then graph steps) on the fixture in
// `dir` equal the CPU engine's.
void check_device_greedy(const std::string& dir) {
    const int steps = 24;
    LoadOptions lo;
    lo.backend = "cpu";
    const std::vector<TokenId> want = engine_greedy(lo, steps, nullptr, dir);
    CheckpointDecoderOptions o;
    o.batch = 2;
    o.max_context = 256;
    auto dec = DeviceDecoder::create_from_checkpoint(dir, o, small_arena());
    REQUIRE_MESSAGE(dec.ok(), dec.status().to_string());
    DeviceDecoder& d = **dec;
    std::vector<TokenId> gpu;
    for (TokenId t : kPrompt) {
        REQUIRE(d.set_tokens(std::vector<int32_t>{t, t}).ok());
        REQUIRE(d.step().ok());
    }
    auto first = d.last_tokens();
    REQUIRE(first.ok());
    gpu.push_back((*first)[0]);
    for (int i = 1; i < steps; ++i) {
        auto stats = d.run_graph(1);
        REQUIRE_MESSAGE(stats.ok(), stats.status().to_string());
        CHECK(stats->bytes_per_step > 0);
        auto t = d.last_tokens();
        REQUIRE(t.ok());
        CHECK((*t)[0] == (*t)[1]);
        gpu.push_back((*t)[0]);
    }
    CHECK(gpu == want);
    CHECK(cuda_device_health().ok());
}

TEST_CASE("GLM-4.5 fixture: the device decoder's greedy tokens (eager and graph) equal the CPU's") {
    check_device_greedy(kGlm);
}

TEST_CASE("DeepSeek-V3 fixture (MLA): the device decoder's greedy tokens equal the CPU's") {
    check_device_greedy(kDeepseek);
}

TEST_CASE("a checkpoint the device decoder cannot run is a named error, not a crash") {
    CheckpointDecoderOptions o;
    o.max_context = 1 << 20;  // Beyond max_position_embeddings.
    auto big = DeviceDecoder::create_from_checkpoint(kMicro, o, small_arena());
    REQUIRE_FALSE(big.ok());
    CHECK(big.status().message().find("max_position_embeddings") != std::string::npos);
    o.max_context = 64;
    auto missing = DeviceDecoder::create_from_checkpoint(kMicro + "/nowhere", o, small_arena());
    CHECK_FALSE(missing.ok());
    auto dec = DeviceDecoder::create_from_checkpoint(kMicro, o, small_arena());
    REQUIRE(dec.ok());
    CHECK_FALSE((*dec)->set_tokens(std::vector<int32_t>{512}).ok());   // Outside the vocab.
    CHECK_FALSE((*dec)->set_tokens(std::vector<int32_t>{1, 2}).ok());  // Batch is 1.
}

TEST_CASE("sharded over every GPU (one rank per GPU, NCCL) equals one GPU") {
    const int devices = cuda_device_count();
    if (devices < 2) {
        std::printf("SKIPPED: sharded-vs-single-GPU needs at least 2 GPUs; %d visible\n", devices);
        MESSAGE("skipped: needs at least 2 GPUs, " << devices << " visible");
        return;
    }
    const int32_t ranks = std::min(devices, 8);  // The fixture has 8 experts.
    const int steps = 12;
    LoadOptions single;
    single.backend = "cuda";
    std::vector<float> want_logits;
    const std::vector<TokenId> want = engine_greedy(single, steps, &want_logits);
    for (const char* comm : {"nccl", "in_process"}) {
        CAPTURE(comm);
        LoadOptions sharded;
        sharded.backend = "cuda";
        sharded.sharding.ranks = ranks;
        sharded.sharding.communicator = comm;
        std::vector<float> got_logits;
        const std::vector<TokenId> got = engine_greedy(sharded, steps, &got_logits);
        CHECK(got == want);
        // Same weights, same kernels per expert; only the order of the per-token sum over
        // experts differs between ranks.
        testing::check_close(got_logits, want_logits, 1e-4, 1e-4, "prompt logits");
    }
    // More ranks than GPUs: a clear error, never two ranks sharing one GPU's arena silently.
    LoadOptions too_many;
    too_many.backend = "cuda";
    too_many.threads = 2;
    too_many.max_slots = 1;
    too_many.max_context = 64;
    too_many.sharding.ranks = std::min(devices + 1, 8);
    if (too_many.sharding.ranks > devices) {
        too_many.sharding.communicator = "nccl";
        auto m = load_model(kMicro, too_many);
        REQUIRE_FALSE(m.ok());
        CHECK(m.status().message().find("GPU") != std::string::npos);
    }
    CHECK(cuda_device_health().ok());
}

}  // namespace
}  // namespace edge::engine::cuda
