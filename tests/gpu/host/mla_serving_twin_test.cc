// DeepSeek-V3 (MLA attention) on the whole-step serving path, on the CPU: what CheckpointModel
// reads from micro-deepseek-v3 (AttentionKind::kMla, the MLA dims and YaRN tables of the CPU
// model's MlaConfig, every MLA tensor, errors naming a missing one), and the serving CausalLM with
// the CPU twin of the device steps (twin::mla_attention_layer in each layer over the paged latent
// pool) driven by the serving script against the CPU engine: logits within 1e-3 and the same
// argmax (greedy token) on every row, over prefill steps, buckets, decode and prefix
// copy-on-write.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/host/checkpoint_model.h"
#include "engine/cuda/host/serving_model.h"
#include "engine/cuda/host/twin_step_runner.h"
#include "engine/model/safetensors.h"
#include "engine/model/safetensors_writer.h"
#include "tests/gpu/host/serving_script.h"
#include "tests/testing/test_certs.h"

namespace edge::engine::cuda {
namespace {

const std::string kMicroDeepseek = EDGE_SOURCE_DIR "/tests/fixtures/micro-deepseek-v3";

std::string deepseek_config() { return edge::testing::read_file(kMicroDeepseek + "/config.json"); }

TEST_CASE("checkpoint model (DeepSeek-V3): MLA attention, dims, YaRN tables and tensors") {
    auto m = read_checkpoint_model(kMicroDeepseek, "none");
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->architecture == "DeepseekV3ForCausalLM");
    CHECK(m->attention == AttentionKind::kMla);
    CHECK(m->layers == 3);
    CHECK(m->dense_inter == 256);
    CHECK(m->shared_inter == 64);
    CHECK(m->router.scoring == RouterScoring::kSigmoid);
    CHECK(m->mla.q_lora_rank == 64);
    CHECK(m->mla.kv_lora_rank == 32);
    CHECK(m->mla.rope == 16);
    CHECK(m->kv_heads == 1);
    CHECK(m->head_dim == 24);  // Half a latent row: the host cache's bytes per token.
    REQUIRE(m->inv_freq.size() == 8);
    CHECK(m->inv_freq[1] == doctest::Approx(std::pow(50000.0, -2.0 / 16.0)));
    REQUIRE(m->layer.size() == 3);
    CHECK_FALSE(m->layer[0].moe);
    for (const CheckpointLayer& L : m->layer) {
        CHECK(L.mla.q_a.rows == 64);
        CHECK(L.mla.q.rows == 4 * 48);
        CHECK(L.mla.kv_a.rows == 48);
        CHECK(L.mla.kv_b.rows == 4 * 64);
        CHECK(L.mla.o.cols == 4 * 32);
        CHECK(L.mla.kv_a_norm.size() == 32);
        CHECK(L.q.data == nullptr);  // No GQA projections.
    }

    SUBCASE("YaRN rope_scaling: MlaConfig's tables and scales") {
        edge::testing::TempDir dir;
        dir.write("model.safetensors",
                  edge::testing::read_file(kMicroDeepseek + "/model.safetensors"));
        const std::string cfg = deepseek_config();
        const std::string from = "\"rope_scaling\": null";
        REQUIRE(cfg.find(from) != std::string::npos);
        dir.write("config.json",
                  std::string(cfg).replace(cfg.find(from), from.size(),
                                           "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": "
                                           "40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, "
                                           "\"original_max_position_embeddings\": 256}"));
        auto y = read_checkpoint_model(dir.path(), "none");
        REQUIRE_MESSAGE(y.ok(), y.status().to_string());
        const double ms = 0.1 * std::log(40.0) + 1.0;
        CHECK(y->mla.softmax_scale == doctest::Approx(ms * ms / std::sqrt(48.0)));
        CHECK(y->mla.rope_mscale == doctest::Approx(1.0));
        CHECK(y->inv_freq[7] < m->inv_freq[7]);
    }
    SUBCASE("a missing MLA tensor is the checkpoint's error naming it") {
        edge::testing::TempDir dir;
        auto ck = Checkpoint::open_dir(kMicroDeepseek);
        REQUIRE(ck.ok());
        const std::string drop = "model.layers.2.self_attn.kv_b_proj.weight";
        std::vector<TensorToWrite> keep;
        for (const std::string& name : (*ck)->names()) {
            if (name == drop) {
                continue;
            }
            auto t = (*ck)->tensor(name);
            REQUIRE(t.ok());
            keep.push_back(TensorToWrite{
                name, t->dtype(), t->shape(),
                std::string_view(static_cast<const char*>(t->data), static_cast<size_t>(t->nbytes)),
                nullptr});
        }
        REQUIRE(write_safetensors(dir.file("model.safetensors"), keep).ok());
        dir.write("config.json", deepseek_config());
        auto bad = read_checkpoint_model(dir.path(), "none");
        REQUIRE_FALSE(bad.ok());
        CHECK_MESSAGE(bad.status().message().find(drop) != std::string::npos,
                      bad.status().message());
    }
}

TEST_CASE(
    "serving path on the CPU twin: DeepSeek-V3 (MLA over the paged latent pool, dense first "
    "layer, shared expert, sigmoid grouped routing) equals the CPU model") {
    // "all-int8" quantizes q_a/q_b/kv_a/o_proj on load on both sides and kv_b_proj stays as
    // stored: the same bytes. Its logits are not compared (the CPU's INT8 kernels quantize the
    // activations too; the twins do not).
    for (const char* policy : {"none", "all-int8"}) {
        CAPTURE(policy);
        LoadOptions cpu_options = testing::serving_script_options("cpu");
        LoadOptions twin_options = testing::serving_script_options("cuda");
        cpu_options.quantization = policy;
        twin_options.quantization = policy;
        auto cpu = load_model(kMicroDeepseek, cpu_options);
        REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
        auto twin = load_serving_causal_lm(kMicroDeepseek, twin_options, create_twin_step_runner);
        REQUIRE_MESSAGE(twin.ok(), twin.status().to_string());
        CHECK(twin->get()->spec().architecture == cpu->get()->spec().architecture);
        CHECK(twin->get()->spec().kv_bytes_per_token == cpu->get()->spec().kv_bytes_per_token);
        CHECK(twin->get()->spec().weight_bytes == cpu->get()->spec().weight_bytes);
        // The same weights and f32 activations; the twins accumulate in double against the
        // CPU's f32 sums (the CPU model runs plain MLA for prefill chunks, absorbed for decode).
        if (std::string(policy) == "none") {
            testing::run_serving_script(**cpu, **twin, 1e-3);
        }
    }
}

}  // namespace
}  // namespace edge::engine::cuda
