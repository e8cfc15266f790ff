// The whole serving path of the device forward on the CPU (no GPU): the CausalLM of
// host/serving_model.h driven like the scheduler drives it, with the CPU twin of the device's
// steps (host/twin_step_runner.h: the same staging buffers, paged pool, scratch block and padded
// rows, every op a kernel's CPU twin), against the CPU model. What it leaves to the gpu suite:
// the CUDA kernels themselves (each compared with its twin there) and the graphs.

#include <doctest/doctest.h>

#include <filesystem>

#include "engine/backend.h"
#include "engine/cuda/host/paged_kv_layout.h"
#include "engine/cuda/host/serving_model.h"
#include "engine/cuda/host/twin_step_runner.h"
#include "tests/gpu/host/serving_script.h"
#include "tests/gpu/host/twin_check.h"
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
    const std::string text = edge::testing::read_file(testing::kMicroGlm4 + "/config.json");
    const std::vector<std::pair<std::string, std::string>> variants = {
        {"\"n_shared_experts\": 1", "\"n_shared_experts\": 0"},
        {"\"use_qk_norm\": true", "\"use_qk_norm\": false"},
        {"\"n_group\": 2", "\"n_group\": 1"},
        {"\"attention_bias\": true", "\"attention_bias\": false"},
    };
    for (const auto& v : variants) {
        CAPTURE(v.second);
        edge::testing::TempDir dir;
        const std::string config = text;
        const size_t at = config.find(v.first);
        REQUIRE(at != std::string::npos);
        dir.write("config.json", std::string(config).replace(at, v.first.size(), v.second));
        std::filesystem::create_symlink(testing::kMicroGlm4 + "/model.safetensors",
                                        dir.file("model.safetensors"));
        testing::check_twin_equals_cpu(dir.path());
    }
}

TEST_CASE("serving path on the CPU twin: YaRN rope_scaling (Qwen3, GLM-4.5) equals the CPU model") {
    // A short original length and an attention factor away from 1, so both the scaled
    // frequencies and the cos/sin factor move the logits.
    const std::string yarn = R"("rope_scaling": {"rope_type": "yarn", "factor": 8.0, )"
                             R"("original_max_position_embeddings": 64, "attention_factor": 1.5})";
    for (const std::string& fixture : {testing::kMicroQwen3, testing::kMicroGlm4}) {
        CAPTURE(fixture);
        edge::testing::TempDir dir;
        std::string config = edge::testing::read_file(fixture + "/config.json");
        const std::string plain = "\"rope_scaling\": null";
        const size_t at = config.find(plain);
        REQUIRE(at != std::string::npos);
        dir.write("config.json", config.replace(at, plain.size(), yarn));
        std::filesystem::create_symlink(fixture + "/model.safetensors",
                                        dir.file("model.safetensors"));
        testing::check_twin_equals_cpu(dir.path());
    }
}

// The twin runner, recording each step's (bucket, logit bucket): how many rows every step ran
// and how many of them went through the final norm and the LM head.
class CountingRunner final : public StepRunner {
  public:
    CountingRunner(std::unique_ptr<StepRunner> inner, std::vector<std::pair<int32_t, int32_t>>* log)
        : inner_(std::move(inner)), log_(log) {}
    Status copy_kv_blocks(std::span<const BlockMove> moves) override {
        return inner_->copy_kv_blocks(moves);
    }
    Status run_rows(int32_t bucket, int32_t logit_bucket,
                    std::span<const int32_t> staging) override {
        log_->emplace_back(bucket, logit_bucket);
        return inner_->run_rows(bucket, logit_bucket, staging);
    }
    Status copy_logits(std::span<const RowRun> runs, float* out) override {
        return inner_->copy_logits(runs, out);
    }

  private:
    std::unique_ptr<StepRunner> inner_;
    std::vector<std::pair<int32_t, int32_t>>* log_;
};

TEST_CASE(
    "serving path on the CPU twin: the LM head runs only on the rows whose logits are asked "
    "for, and those logits equal the CPU model's") {
    auto cpu = load_model(testing::kMicroQwen3, testing::serving_script_options("cpu"));
    REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
    std::vector<std::pair<int32_t, int32_t>> log;
    auto twin = load_serving_causal_lm(
        testing::kMicroQwen3, testing::serving_script_options("cuda"),
        [&](const CheckpointModel& model,
            const ServingDecoderOptions& so) -> Result<std::unique_ptr<StepRunner>> {
            CHECK(so.max_rows == 64);
            CHECK(so.max_logit_rows == 16);  // 4 slots: at least 16.
            EDGE_ASSIGN_OR_RETURN(std::unique_ptr<StepRunner> inner,
                                  create_twin_step_runner(model, so));
            return std::unique_ptr<StepRunner>(
                std::make_unique<CountingRunner>(std::move(inner), &log));
        });
    REQUIRE_MESSAGE(twin.ok(), twin.status().to_string());
    CausalLM& c = **cpu;
    CausalLM& d = **twin;
    const int32_t V = c.spec().vocab_size;
    const int32_t a = *c.acquire_slot(), b = *c.acquire_slot();
    REQUIRE(*d.acquire_slot() == a);
    REQUIRE(*d.acquire_slot() == b);
    const std::vector<TokenId> pa = {510, 72, 101, 108, 108, 111};
    testing::forward_both(c, d, {{a, 0, pa, false}}, 1e-3, "a's prompt");
    CHECK(log == std::vector<std::pair<int32_t, int32_t>>{{8, 1}});
    // A long prefill chunk next to a decode row: 101 rows in two steps, of bucket 64 and (37
    // rows) of the half-step bucket 48; the first (64 prefill rows) wants no logits and runs no
    // LM head, the second runs it on 2 rows (b's last token and a's decode token), not on 112.
    std::vector<TokenId> pb(100);
    for (size_t i = 0; i < pb.size(); ++i) {
        pb[i] = static_cast<TokenId>((i * 53 + 7) % 500);
    }
    const std::vector<TokenId> ta = {11};
    log.clear();
    std::vector<float> logits = testing::forward_both(
        c, d, {{b, 0, pb, false}, {a, c.slot_length(a), ta, false}}, 1e-3, "long prefill");
    CHECK(logits.size() == static_cast<size_t>(2 * V));
    CHECK(log == std::vector<std::pair<int32_t, int32_t>>{{64, 0}, {48, 2}});
    // Every row's logits of a 40-token chunk: steps end at 16 logits rows (the logits buffer's
    // rows), the last one with b's decode row too.
    std::vector<TokenId> pa2(40);
    for (size_t i = 0; i < pa2.size(); ++i) {
        pa2[i] = static_cast<TokenId>((i * 29 + 3) % 500);
    }
    const std::vector<TokenId> tb = {testing::row_argmax(logits, 0, V)};
    log.clear();
    logits = testing::forward_both(
        c, d, {{a, c.slot_length(a), pa2, true}, {b, c.slot_length(b), tb, false}}, 1e-3,
        "all logits");
    CHECK(logits.size() == static_cast<size_t>(41 * V));
    CHECK(log == std::vector<std::pair<int32_t, int32_t>>{{16, 16}, {16, 16}, {16, 16}});
}

TEST_CASE("twin runner: logit buckets and compact logits rows outside the step are refused") {
    auto model = read_checkpoint_model(testing::kMicroQwen3, "none");
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    ServingDecoderOptions so;
    so.max_rows = 8;
    so.kv_blocks = 4;
    so.max_blocks_per_seq = 2;
    so.max_logit_rows = 4;
    auto runner = create_twin_step_runner(*model, so);
    REQUIRE_MESSAGE(runner.ok(), runner.status().to_string());
    ServingDecoderOptions too_many = so;
    too_many.max_logit_rows = 9;
    CHECK_FALSE(create_twin_step_runner(*model, too_many).ok());
    const StepLayout layout{so.max_rows, so.max_blocks_per_seq, so.max_logit_rows};
    const std::vector<TokenId> toks = {5, 6, 7};
    auto steps = plan_device_steps(std::vector<SequenceChunk>{{0, 0, toks, false}}, {{1}}, layout,
                                   *row_buckets(8), so.kv_blocks);
    REQUIRE(steps.ok());
    REQUIRE(steps->size() == 1);
    const DeviceStep& s = (*steps)[0];
    REQUIRE(s.bucket == 4);
    REQUIRE(s.logit_bucket == 1);
    StepRunner& r = **runner;
    CHECK_FALSE(r.run_rows(s.bucket, 3, s.staging).ok());  // Not a logit bucket.
    CHECK_FALSE(r.run_rows(s.bucket, 8, s.staging).ok());  // Past max_logit_rows.
    REQUIRE(r.run_rows(s.bucket, s.logit_bucket, s.staging).ok());
    std::vector<float> out(static_cast<size_t>(2 * model->vocab));
    CHECK(r.copy_logits(logit_runs(s, 1), out.data()).ok());
    CHECK_FALSE(r.copy_logits(std::vector<RowRun>{{0, 2, 0}}, out.data()).ok());
    CHECK_FALSE(r.copy_logits(std::vector<RowRun>{{1, 1, 0}}, out.data()).ok());
    REQUIRE(r.run_rows(s.bucket, 0, s.staging).ok());  // No LM head: nothing to copy.
    CHECK_FALSE(r.copy_logits(std::vector<RowRun>{{0, 1, 0}}, out.data()).ok());
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

// The device pool holds the blocks the host cache assigns and one more, the scratch block padded
// rows write; that block came on top of engine.kv_cache_bytes. The budget holds both now, and
// the scheduler counts the blocks the device pool gives it.
TEST_CASE("serving path: the device KV pool with its scratch block fits kv_cache_bytes") {
    const LoadOptions base = testing::serving_script_options("cuda");
    auto probe = load_serving_causal_lm(testing::kMicroQwen3, base, create_twin_step_runner);
    REQUIRE_MESSAGE(probe.ok(), probe.status().to_string());
    const int64_t block = probe->get()->spec().kv_bytes_per_token * kKvBlockTokens;
    REQUIRE(block > 0);
    for (const int64_t budget : {2 * block, 2 * block + block / 2, 3 * block, 7 * block,
                                 7 * block + block - 1, 64 * block, int64_t{1} << 20}) {
        CAPTURE(budget);
        LoadOptions o = base;
        o.kv_cache_bytes = budget;
        ServingDecoderOptions seen;
        PagedKvLayout pool;
        auto m = load_serving_causal_lm(
            testing::kMicroQwen3, o,
            [&](const CheckpointModel& model, const ServingDecoderOptions& so) {
                seen = so;
                pool = PagedKvLayout{model.layers, model.kv_heads, model.head_dim,
                                     so.kv_blocks + 1};  // As the device decoder sizes it.
                return create_twin_step_runner(model, so);
            });
        REQUIRE_MESSAGE(m.ok(), m.status().to_string());
        const KvCacheStats kv = m->get()->kv_stats();
        CHECK(kv.blocks_total == seen.kv_blocks);
        CHECK(pool.pool_floats() * 4 == (int64_t{seen.kv_blocks} + 1) * block);
        CHECK(pool.pool_floats() * 4 <= budget);
        CHECK(pool.pool_floats() * 4 + block > budget);  // No block of the budget is left over.
        CHECK(kv.budget_bytes == budget);
        CHECK(kv.allocated_bytes == pool.pool_floats() * 4);
    }
    // One block is the scratch block alone: nothing for the sequences.
    LoadOptions one = base;
    one.kv_cache_bytes = 2 * block - 1;
    auto refused = load_serving_causal_lm(testing::kMicroQwen3, one, create_twin_step_runner);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == StatusCode::kInvalidArgument);
    CHECK(refused.status().message().find("scratch block") != std::string::npos);
    CHECK(serving_kv_budget(0, block).value() == 0);  // Unset: every slot's whole context.
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
