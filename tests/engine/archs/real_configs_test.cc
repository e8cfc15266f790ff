// The config.json files of released checkpoints (tests/fixtures/configs/, their exact text; see
// the README there for where each came from), read as the loaders read them: every field that
// changes the math is checked against the value the checkpoint means, and a variant the engine
// does not compute (one field of a real config changed) is refused naming the file and field.

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "common/file.h"
#include "engine/cpu/rope_scaling.h"
#include "engine/model/archs/deepseek_v3.h"
#include "engine/model/archs/deepseek_v3_config.h"
#include "engine/model/archs/glm4_moe.h"
#include "engine/model/archs/glm4_moe_common.h"
#include "engine/model/archs/qwen3_moe.h"
#include "engine/model/model_config.h"
#include "engine/model/weight_loader.h"

namespace edge::engine {
namespace {

namespace json = boost::json;

const std::string kConfigs = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/configs/";

ConfigJson read_config(const std::string& name) {
    auto c = ConfigJson::read(kConfigs + name);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    return std::move(c).value();
}

// The config `name` with `field` set to `value` (JSON text): one field of a real config changed.
ConfigJson with_field(const std::string& name, const std::string& field, const std::string& value) {
    json::object root = read_config(name).root();
    root[field] = json::parse(value);
    auto c = ConfigJson::parse(json::serialize(root), name + "/config.json");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    return std::move(c).value();
}

void require_refused(const Status& s, const std::string& file, const std::string& field) {
    REQUIRE_FALSE(s.ok());
    CAPTURE(s.message());
    CHECK(s.message().find(file + "/config.json") != std::string::npos);
    CHECK(s.message().find("'" + field) != std::string::npos);
}

TEST_CASE("real config: Qwen3-30B-A3B") {
    const ConfigJson json = read_config("qwen3-30b-a3b");
    CHECK(json.architecture() == kQwen3MoeArchitecture);
    auto c = Qwen3MoeConfig::from_json(json);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->hidden_size == 2048);
    CHECK(c->num_hidden_layers == 48);
    CHECK(c->num_attention_heads == 32);
    CHECK(c->num_key_value_heads == 4);
    CHECK(c->head_dim == 128);  // Given: not hidden_size / heads (64).
    CHECK(c->num_experts == 128);
    CHECK(c->num_experts_per_tok == 8);
    CHECK(c->moe_intermediate_size == 768);
    CHECK(c->rope_theta == 1000000.0);
    CHECK(c->rms_norm_eps == 1e-6);
    CHECK(c->norm_topk_prob);
    CHECK_FALSE(c->tie_word_embeddings);
    CHECK_FALSE(c->attention_bias);
    CHECK(c->max_position_embeddings == 40960);
    for (int64_t l = 0; l < 48; ++l) {
        CHECK(c->is_moe_layer(l));
    }
    CHECK(c->eos_token_ids == std::vector<int64_t>{151645});
    CHECK(c->bos_token_id == 151643);
    CHECK(parse_stored_quantization(json)->quant_method.empty());
    // The variants this architecture does not compute are refused, named.
    CHECK(c->rope.inv_freq == cpu::rope_inv_freq(1e6, 128));  // No rope_scaling.
    CHECK(c->rope.mscale == 1.0);
    require_refused(Qwen3MoeConfig::from_json(
                        with_field("qwen3-30b-a3b", "rope_scaling", R"({"rope_type": "linear"})"))
                        .status(),
                    "qwen3-30b-a3b", "rope_scaling.rope_type");
    require_refused(
        Qwen3MoeConfig::from_json(with_field("qwen3-30b-a3b", "use_sliding_window", "true"))
            .status(),
        "qwen3-30b-a3b", "use_sliding_window");
}

TEST_CASE("real config: DeepSeek-R1 (DeepseekV3ForCausalLM, FP8, YaRN 40)") {
    const ConfigJson json = read_config("deepseek-r1");
    CHECK(json.architecture() == kDeepseekV3Architecture);
    REQUIRE(check_deepseek_v3_config(json).ok());
    auto c = SigmoidMoeConfig::from_json(json, kDeepseekV3Defaults);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->num_hidden_layers == 61);  // The MTP layer (61) is not a decoder layer.
    CHECK(c->num_nextn_predict_layers == 1);
    CHECK(c->n_routed_experts == 256);
    CHECK(c->num_experts_per_tok == 8);
    CHECK(c->n_shared_experts == 1);
    CHECK(c->n_group == 8);
    CHECK(c->topk_group == 4);
    CHECK(c->first_k_dense_replace == 3);
    CHECK_FALSE(c->is_moe_layer(2));
    CHECK(c->is_moe_layer(3));
    CHECK(c->is_moe_layer(60));
    CHECK(c->routed_scaling_factor == 2.5);
    CHECK(c->norm_topk_prob);
    CHECK(c->rope_theta == 10000.0);
    CHECK(c->rms_norm_eps == 1e-6);
    CHECK_FALSE(c->tie_word_embeddings);
    CHECK(c->max_position_embeddings == 163840);
    CHECK(c->eos_token_ids == std::vector<int64_t>{1});
    CHECK(c->bos_token_id == 0);
    auto m = MlaConfig::from_json(json, *c);
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->q_lora_rank == 1536);
    CHECK(m->kv_lora_rank == 512);
    CHECK(m->qk_nope_head_dim == 128);
    CHECK(m->qk_rope_head_dim == 64);
    CHECK(m->v_head_dim == 128);
    CHECK(m->rope_interleave);
    // mscale == mscale_all_dim: cos/sin unscaled; the softmax takes get_mscale(40, 1)^2.
    CHECK(m->rope_mscale == doctest::Approx(1.0));
    const double ms = 0.1 * std::log(40.0) + 1.0;
    CHECK(m->softmax_scale == doctest::Approx(ms * ms / std::sqrt(192.0)));
    // YaRN over 64 rotary dims, theta 1e4, 4096 original positions, beta 32 / 1: dims up to
    // floor(10.47) keep their frequency, dims from ceil(22.52) are divided by 40, linear between.
    const std::vector<double> base = cpu::rope_inv_freq(10000.0, 64);
    REQUIRE(m->inv_freq.size() == 32);
    CHECK(m->inv_freq[10] == doctest::Approx(base[10]));
    CHECK(m->inv_freq[23] == doctest::Approx(base[23] / 40.0));
    const double ramp = (16.0 - 10.0) / (23.0 - 10.0);
    CHECK(m->inv_freq[16] ==
          doctest::Approx(base[16] / 40.0 * ramp + base[16] * (1.0 - ramp)).epsilon(1e-12));
    auto q = parse_stored_quantization(json);
    REQUIRE_MESSAGE(q.ok(), q.status().to_string());
    CHECK(q->quant_method == "fp8");
}

TEST_CASE("real config: Kimi K2 Instruct (kimi_k2, YaRN 32 with beta 1 / 1)") {
    const ConfigJson json = read_config("kimi-k2-instruct");
    CHECK(json.architecture() == kDeepseekV3Architecture);
    REQUIRE(check_deepseek_v3_config(json).ok());
    auto c = SigmoidMoeConfig::from_json(json, kDeepseekV3Defaults);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->n_routed_experts == 384);
    CHECK(c->num_experts_per_tok == 8);
    CHECK(c->n_group == 1);  // Not DeepSeek-V3's default 8.
    CHECK(c->topk_group == 1);
    CHECK(c->first_k_dense_replace == 1);
    CHECK_FALSE(c->is_moe_layer(0));
    CHECK(c->is_moe_layer(1));
    CHECK(c->routed_scaling_factor == 2.827);
    CHECK(c->rope_theta == 50000.0);
    CHECK(c->num_nextn_predict_layers == 0);
    CHECK(c->max_position_embeddings == 131072);
    CHECK(c->eos_token_ids == std::vector<int64_t>{163585});
    CHECK(c->bos_token_id == 163584);
    auto m = MlaConfig::from_json(json, *c);
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->q_lora_rank == 1536);
    CHECK(m->rope_mscale == doctest::Approx(1.0));
    const double ms = 0.1 * std::log(32.0) + 1.0;
    CHECK(m->softmax_scale == doctest::Approx(ms * ms / std::sqrt(192.0)));
    // beta_fast == beta_slow == 1: the ramp is one dim wide (19.17 -> [19, 20]); below it the
    // frequencies are kept, above it divided by 32.
    const std::vector<double> base = cpu::rope_inv_freq(50000.0, 64);
    REQUIRE(m->inv_freq.size() == 32);
    for (size_t i = 0; i < 32; ++i) {
        CAPTURE(i);
        CHECK(m->inv_freq[i] == doctest::Approx(i <= 19 ? base[i] : base[i] / 32.0));
    }
}

TEST_CASE("real config: Kimi K2 Thinking's compressed-tensors INT4 (group 32) block") {
    // Kimi K2 Instruct's config with the quantization_config the INT4 Kimi K2 checkpoints ship.
    auto block =
        read_small_file(kConfigs + "kimi-k2-thinking-quantization/quantization_config.json");
    REQUIRE_MESSAGE(block.ok(), block.status().to_string());
    const ConfigJson json = with_field("kimi-k2-instruct", "quantization_config", *block);
    REQUIRE(check_deepseek_v3_config(json).ok());
    auto q = parse_stored_quantization(json);
    REQUIRE_MESSAGE(q.ok(), q.status().to_string());
    CHECK(q->quant_method == "compressed-tensors");
    CHECK(q->int4_groups.size() == 1);
    CHECK(q->int4_groups.contains(32));
    CHECK(q->fp8_group.empty());
    CHECK(q->int8_group.empty());
    // Only the routed experts are quantized: attention, shared experts, the dense layer's MLP
    // and lm_head are stored as they were.
    CHECK(q->ignores("model.layers.0.self_attn.q_a_proj"));
    CHECK(q->ignores("model.layers.0.mlp.gate_proj"));
    CHECK(q->ignores("model.layers.3.mlp.shared_experts.down_proj"));
    CHECK(q->ignores("lm_head"));
    CHECK_FALSE(q->ignores("model.layers.3.mlp.experts.17.gate_proj"));
    CHECK_FALSE(q->ignores("model.layers.3.mlp.experts.17.down_proj"));
}

TEST_CASE("real config: INTELLECT-3-Base (Glm4MoeForCausalLM, GLM-4.5-Air shape)") {
    const ConfigJson json = read_config("intellect-3-base");
    CHECK(json.architecture() == kGlm4MoeArchitecture);
    REQUIRE(check_glm4_moe_config(json).ok());
    auto c = SigmoidMoeConfig::from_json(json, kGlm4MoeDefaults);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->num_hidden_layers == 46);  // MTP layer 46 is not a decoder layer.
    CHECK(c->num_nextn_predict_layers == 1);
    CHECK(c->n_routed_experts == 128);
    CHECK(c->num_experts_per_tok == 8);
    CHECK(c->n_shared_experts == 1);
    CHECK(c->first_k_dense_replace == 1);
    CHECK(c->routed_scaling_factor == 1.0);
    CHECK(c->rope_theta == 1000000.0);
    CHECK(c->rms_norm_eps == 1e-5);
    CHECK(c->norm_topk_prob);
    CHECK(c->eos_token_ids == std::vector<int64_t>{151334, 151329});
    CHECK(c->bos_token_id == -1);
    auto a = Glm4AttentionConfig::from_json(json, *c);
    REQUIRE_MESSAGE(a.ok(), a.status().to_string());
    CHECK(a->head_dim == 128);   // Given: not hidden_size / heads (42).
    CHECK(a->rotary_dim == 64);  // partial_rotary_factor 0.5.
    CHECK(a->num_key_value_heads == 8);
    CHECK(a->attention_bias);
    CHECK_FALSE(a->use_qk_norm);
    CHECK(a->rope.inv_freq == cpu::rope_inv_freq(c->rope_theta, 64));  // No rope_scaling.
    require_refused(check_glm4_moe_config(with_field("intellect-3-base", "rope_scaling",
                                                     R"({"rope_type": "dynamic", "factor": 4.0})")),
                    "intellect-3-base", "rope_scaling.rope_type");
}

TEST_CASE("real config: routing and layer variants the engine does not compute are refused") {
    // DeepSeek-V2's methods, on DeepSeek-R1's config: the router computes noaux_tc only.
    for (const char* method : {"\"greedy\"", "\"group_limited_greedy\""}) {
        CAPTURE(method);
        require_refused(check_deepseek_v3_config(with_field("deepseek-r1", "topk_method", method)),
                        "deepseek-r1", "topk_method");
    }
    require_refused(
        check_deepseek_v3_config(with_field("deepseek-r1", "scoring_func", "\"softmax\"")),
        "deepseek-r1", "scoring_func");
    // Every other layer MoE: the dense layers between would be loaded as MoE ones.
    require_refused(check_deepseek_v3_config(with_field("kimi-k2-instruct", "moe_layer_freq", "2")),
                    "kimi-k2-instruct", "moe_layer_freq");
    require_refused(check_glm4_moe_config(with_field("intellect-3-base", "moe_layer_freq", "2")),
                    "intellect-3-base", "moe_layer_freq");
    require_refused(
        check_glm4_moe_config(with_field("intellect-3-base", "topk_method", "\"greedy\"")),
        "intellect-3-base", "topk_method");
    // A per-layer list is not an integer, nor read as one.
    require_refused(
        check_deepseek_v3_config(with_field("kimi-k2-instruct", "moe_layer_freq", "[0, 1]")),
        "kimi-k2-instruct", "moe_layer_freq");
    // RoPE scalings other than YaRN, in either spelling of the type.
    for (const char* key : {"type", "rope_type"}) {
        CAPTURE(key);
        require_refused(check_deepseek_v3_config(with_field(
                            "deepseek-r1", "rope_scaling",
                            std::string("{\"") + key + "\": \"dynamic\", \"factor\": 4}")),
                        "deepseek-r1", "rope_scaling");
    }
    // FP8 blocks of another size.
    auto q = parse_stored_quantization(
        with_field("deepseek-r1", "quantization_config",
                   R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                       "weight_block_size": [64, 64]})"));
    REQUIRE_FALSE(q.ok());
    CHECK(q.status().message().find("weight_block_size") != std::string::npos);
    // The values the released checkpoints set pass.
    CHECK(check_deepseek_v3_config(with_field("deepseek-r1", "topk_method", "\"noaux_tc\"")).ok());
    CHECK(check_deepseek_v3_config(with_field("kimi-k2-instruct", "moe_layer_freq", "1")).ok());
    CHECK(check_deepseek_v3_config(with_field("kimi-k2-instruct", "moe_layer_freq", "null")).ok());
}

}  // namespace
}  // namespace edge::engine
