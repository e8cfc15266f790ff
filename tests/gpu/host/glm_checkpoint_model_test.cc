// What the device decoder reads from a GLM-4.5 checkpoint (Glm4MoeForCausalLM), checked on the
// CPU: the fixture's shape, routing rule, dense first layer, shared expert, biases and partial
// RoPE frequencies; errors naming the file and field or tensor for bad configs and missing
// tensors (DeepSeek-V3's MLA checkpoint: tests/gpu/host/mla_serving_twin_test.cc).

#include <doctest/doctest.h>

#include <cmath>

#include "engine/cpu/rope_scaling.h"
#include "engine/cuda/host/checkpoint_model.h"
#include "engine/model/safetensors.h"
#include "engine/model/safetensors_writer.h"
#include "tests/gpu/host/config_edit.h"
#include "tests/testing/test_certs.h"

namespace edge::engine::cuda {
namespace {

const std::string kGlm = EDGE_SOURCE_DIR "/tests/fixtures/micro-glm4-moe";

std::string glm_config() { return testing::read_file(kGlm + "/config.json"); }

// The fixture's config.json with `field`'s value replaced, alone in a temp dir.
Status read_with(const testing::TempDir& dir, const std::string& field, const std::string& value) {
    return read_config_with(dir, glm_config(), field, value);
}

// The fixture's checkpoint without tensor `drop` in `dir` (config.json unchanged).
void write_without(const testing::TempDir& dir, const std::string& drop) {
    auto ck = Checkpoint::open_dir(kGlm);
    REQUIRE(ck.ok());
    std::vector<TensorToWrite> keep;
    bool dropped = false;
    for (const std::string& name : (*ck)->names()) {
        if (name == drop) {
            dropped = true;
            continue;
        }
        auto t = (*ck)->tensor(name);
        REQUIRE(t.ok());
        keep.push_back(TensorToWrite{
            name, t->dtype(), t->shape(),
            std::string_view(static_cast<const char*>(t->data), static_cast<size_t>(t->nbytes)),
            nullptr});
    }
    REQUIRE(dropped);
    REQUIRE(write_safetensors(dir.file("model.safetensors"), keep).ok());
    dir.write("config.json", glm_config());
}

TEST_CASE("checkpoint model (GLM-4.5): shape, routing rule, dense layer, shared expert, biases") {
    auto m = read_checkpoint_model(kGlm, "none");
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->architecture == "Glm4MoeForCausalLM");
    CHECK(m->attention == AttentionKind::kGqa);
    CHECK(m->hidden == 128);
    CHECK(m->layers == 3);
    CHECK(m->experts == 8);
    CHECK(m->top_k == 2);
    CHECK(m->moe_inter == 64);
    CHECK(m->dense_inter == 256);
    CHECK(m->shared_inter == 64);
    CHECK(m->heads == 4);
    CHECK(m->kv_heads == 2);
    CHECK(m->head_dim == 32);
    CHECK(m->rot_dim == 16);  // partial_rotary_factor 0.5.
    CHECK(m->rms_eps == doctest::Approx(1e-5));
    CHECK(m->eos_token_ids == std::vector<int64_t>{509});
    CHECK(m->bos_token_id == 509);
    // The CPU model's partial-rotary frequencies: rot_dim / 2 of them over rot_dim.
    CHECK(m->inv_freq == cpu::rope_inv_freq(1e6, 16));
    CHECK(m->router.scoring == RouterScoring::kSigmoid);
    CHECK(m->router.experts == 8);
    CHECK(m->router.top_k == 2);
    CHECK(m->router.n_group == 2);
    CHECK(m->router.topk_group == 1);
    CHECK(m->router.norm_topk_prob);
    CHECK(m->router.scaling_factor == doctest::Approx(2.5));
    REQUIRE(m->layer.size() == 3);
    const CheckpointLayer& dense = m->layer[0];
    CHECK_FALSE(dense.moe);
    CHECK(dense.dense.present());
    CHECK(dense.dense.gate.rows == 256);
    CHECK(dense.dense.down.cols == 256);
    CHECK(dense.gate.empty());
    CHECK(dense.router.data == nullptr);
    CHECK_FALSE(dense.shared.present());
    for (size_t l = 0; l < 3; ++l) {
        CAPTURE(l);
        const CheckpointLayer& L = m->layer[l];
        CHECK(L.q_bias.size() == 128);
        CHECK(L.k_bias.size() == 64);
        CHECK(L.v_bias.size() == 64);
        CHECK(L.q_norm.size() == 32);
        CHECK(L.k_norm.size() == 32);
        if (l == 0) {
            continue;
        }
        CHECK(L.moe);
        CHECK_FALSE(L.dense.present());
        CHECK(L.router.rows == 8);
        CHECK(L.router_bias.size() == 8);
        REQUIRE(L.gate.size() == 8);
        CHECK(L.down[7].rows == 128);
        CHECK(L.shared.present());
        CHECK(L.shared.gate.rows == 64);
        CHECK(L.shared.down.cols == 64);
    }
    auto int4 = read_checkpoint_model(kGlm, "experts-int4");
    REQUIRE_MESSAGE(int4.ok(), int4.status().to_string());
    CHECK(int4->expert_format == WeightFormat::kInt4G32);
}

TEST_CASE("checkpoint model (GLM-4.5): bad configs name config.json and the field") {
    testing::TempDir dir;
    Status group = read_with(dir, "n_group", "3");  // Does not divide 8 experts.
    CHECK(group.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(group.message().find("config.json") != std::string::npos, group.message());
    CHECK_MESSAGE(group.message().find("n_group") != std::string::npos, group.message());
    Status topk_group = read_with(dir, "topk_group", "4");  // More than n_group 2.
    CHECK_FALSE(topk_group.ok());
    CHECK(topk_group.message().find("topk_group") != std::string::npos);
    Status rotary = read_with(dir, "partial_rotary_factor", "0.0");
    CHECK(rotary.code() == StatusCode::kInvalidArgument);
    CHECK(rotary.message().find("partial_rotary_factor") != std::string::npos);
    Status head = read_with(dir, "head_dim", "48");
    CHECK(head.code() == StatusCode::kUnimplemented);
    CHECK(head.message().find("head_dim") != std::string::npos);
    Status rope = read_with(dir, "rope_scaling", R"({"type": "longrope", "factor": 4.0})");
    CHECK(rope.code() == StatusCode::kUnimplemented);
    CHECK(rope.message().find("rope_scaling.type") != std::string::npos);
    Status act = read_with(dir, "hidden_act", "\"gelu\"");
    CHECK(act.code() == StatusCode::kUnimplemented);
    CHECK(act.message().find("hidden_act") != std::string::npos);
}

TEST_CASE("checkpoint model (GLM-4.5): a missing bias or shared-expert tensor names the tensor") {
    for (const std::string drop : {"model.layers.1.self_attn.k_proj.bias",
                                   "model.layers.2.mlp.shared_experts.down_proj.weight",
                                   "model.layers.0.mlp.up_proj.weight"}) {
        CAPTURE(drop);
        testing::TempDir dir;
        write_without(dir, drop);
        auto m = read_checkpoint_model(dir.path(), "none");
        REQUIRE_FALSE(m.ok());
        CHECK(m.status().code() != StatusCode::kUnimplemented);  // Broken, not a fallback.
        CHECK_MESSAGE(m.status().message().find(drop) != std::string::npos, m.status().message());
    }
    // Without attention_bias the biases are not read (the same checkpoint then loads).
    testing::TempDir dir;
    write_without(dir, "model.layers.1.self_attn.k_proj.bias");
    dir.write("config.json", config_with_field(glm_config(), "attention_bias", "false"));
    auto m = read_checkpoint_model(dir.path(), "none");
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->layer[1].k_bias.empty());
}

}  // namespace
}  // namespace edge::engine::cuda
