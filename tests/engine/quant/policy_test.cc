#include "engine/quant/policy.h"

#include <doctest/doctest.h>

namespace edge::engine::quant {
namespace {

bool contains(const Status& s, std::string_view text) {
    return s.message().find(text) != std::string::npos;
}

TEST_CASE("policy presets") {
    auto none = parse_quant_policy("none");
    REQUIRE(none.ok());
    CHECK_FALSE(none->quantizes_anything());

    auto experts = parse_quant_policy("experts-int4");
    REQUIRE(experts.ok());
    CHECK(experts->format_for(TensorClass::kRoutedExperts) == WeightFormat::kInt4G32);
    CHECK(experts->format_for(TensorClass::kAttention) == WeightFormat::kBF16);
    CHECK(experts->format_for(TensorClass::kSharedExpert) == WeightFormat::kBF16);

    auto g128 = parse_quant_policy(" experts-int4-g128 ");
    REQUIRE(g128.ok());
    CHECK(g128->format_for(TensorClass::kRoutedExperts) == WeightFormat::kInt4G128);

    auto fp8 = parse_quant_policy("all-fp8");
    REQUIRE(fp8.ok());
    for (TensorClass c : {TensorClass::kAttention, TensorClass::kDenseMlp,
                          TensorClass::kSharedExpert, TensorClass::kRoutedExperts}) {
        CHECK(fp8->format_for(c) == WeightFormat::kFP8E4M3Block128);
    }
    CHECK(fp8->format_for(TensorClass::kEmbeddings) == WeightFormat::kBF16);
    CHECK(fp8->format_for(TensorClass::kLmHead) == WeightFormat::kBF16);

    auto int8 = parse_quant_policy("all-int8");
    REQUIRE(int8.ok());
    CHECK(int8->format_for(TensorClass::kDenseMlp) == WeightFormat::kInt8Row);
}

TEST_CASE("policy pairs and overrides") {
    auto p = parse_quant_policy("attention=fp8, routed_experts=int4-g32");
    REQUIRE(p.ok());
    CHECK(p->format_for(TensorClass::kAttention) == WeightFormat::kFP8E4M3Block128);
    CHECK(p->format_for(TensorClass::kRoutedExperts) == WeightFormat::kInt4G32);
    CHECK(p->format_for(TensorClass::kLmHead) == WeightFormat::kBF16);

    auto o =
        parse_quant_policy("experts-int4,routed_experts=int8,lm_head=int4-g128,embeddings=bf16");
    REQUIRE(o.ok());
    CHECK(o->format_for(TensorClass::kRoutedExperts) == WeightFormat::kInt8Row);
    CHECK(o->format_for(TensorClass::kLmHead) == WeightFormat::kInt4G128);

    // to_string round-trips.
    auto again = parse_quant_policy(o->to_string());
    REQUIRE(again.ok());
    CHECK(*again == *o);
    CHECK(o->to_string() ==
          "attention=bf16,dense_mlp=bf16,shared_expert=bf16,routed_experts=int8,"
          "embeddings=bf16,lm_head=int4-g128");
}

TEST_CASE("policy errors are clear") {
    auto cls = parse_quant_policy("attention=fp8,experts=int4-g32");
    REQUIRE_FALSE(cls.ok());
    CHECK(cls.status().code() == StatusCode::kInvalidArgument);
    CHECK(contains(cls.status(), "unknown tensor class 'experts'"));
    CHECK(contains(cls.status(), "routed_experts"));

    auto fmt = parse_quant_policy("attention=fp4");
    REQUIRE_FALSE(fmt.ok());
    CHECK(contains(fmt.status(), "unknown format 'fp4' for attention"));
    CHECK(contains(fmt.status(), "int4-g128"));

    auto preset = parse_quant_policy("experts-int3");
    REQUIRE_FALSE(preset.ok());
    CHECK(contains(preset.status(), "unknown preset 'experts-int3'"));
    CHECK(contains(preset.status(), "experts-int4-g128"));

    CHECK(contains(parse_quant_policy("").status(), "empty quantization policy"));
    CHECK(contains(parse_quant_policy("attention=fp8,,lm_head=int8").status(), "empty item"));
    CHECK(contains(parse_quant_policy("attention=fp8,attention=int8").status(), "given twice"));
    CHECK(contains(parse_quant_policy("experts-int4,all-fp8").status(),
                   "preset 'all-fp8' after preset 'experts-int4'"));
    CHECK(contains(parse_quant_policy("attention=fp8,all-fp8").status(),
                   "must come before class=format pairs"));
    CHECK_FALSE(parse_quant_policy("attention=").ok());
    CHECK_FALSE(parse_quant_policy("=fp8").ok());
}

TEST_CASE("tensor classes from Qwen3-MoE names") {
    CHECK(tensor_class_for_name("model.embed_tokens.weight") == TensorClass::kEmbeddings);
    CHECK(tensor_class_for_name("lm_head.weight") == TensorClass::kLmHead);
    CHECK(tensor_class_for_name("model.layers.0.self_attn.q_proj.weight") ==
          TensorClass::kAttention);
    CHECK(tensor_class_for_name("model.layers.3.self_attn.o_proj.weight") ==
          TensorClass::kAttention);
    CHECK(tensor_class_for_name("model.layers.0.self_attn.q_norm.weight") == std::nullopt);
    CHECK(tensor_class_for_name("model.layers.1.mlp.experts.17.down_proj.weight") ==
          TensorClass::kRoutedExperts);
    CHECK(tensor_class_for_name("model.layers.1.mlp.gate.weight") == std::nullopt);  // Router.
    CHECK(tensor_class_for_name("model.layers.1.mlp.gate_proj.weight") == TensorClass::kDenseMlp);
    CHECK(tensor_class_for_name("model.layers.1.input_layernorm.weight") == std::nullopt);
    CHECK(tensor_class_for_name("model.norm.weight") == std::nullopt);
}

TEST_CASE("tensor classes from GLM-4.5 and DeepSeek-V3 names") {
    // GLM-4.5
    CHECK(tensor_class_for_name("model.layers.5.mlp.shared_experts.up_proj.weight") ==
          TensorClass::kSharedExpert);
    CHECK(tensor_class_for_name("model.layers.5.mlp.gate.e_score_correction_bias") == std::nullopt);
    CHECK(tensor_class_for_name("model.layers.5.self_attn.q_proj.bias") == std::nullopt);
    CHECK(tensor_class_for_name("model.layers.0.mlp.down_proj.weight") == TensorClass::kDenseMlp);
    // DeepSeek-V3 / Kimi K2 (MLA), including the FP8 scale and compressed-tensors suffixes.
    CHECK(tensor_class_for_name("model.layers.0.self_attn.kv_a_proj_with_mqa.weight") ==
          TensorClass::kAttention);
    CHECK(tensor_class_for_name("model.layers.0.self_attn.q_b_proj.weight_scale_inv") ==
          TensorClass::kAttention);
    CHECK(tensor_class_for_name("model.layers.0.self_attn.kv_a_layernorm.weight") == std::nullopt);
    CHECK(tensor_class_for_name("model.layers.9.mlp.experts.255.gate_proj.weight_packed") ==
          TensorClass::kRoutedExperts);
    CHECK(tensor_class_for_name("model.layers.9.mlp.experts.255.gate_proj.weight_scale") ==
          TensorClass::kRoutedExperts);
    CHECK(tensor_class_for_name("model.layers.9.mlp.experts.255.gate_proj.weight_shape") ==
          TensorClass::kRoutedExperts);
    CHECK(tensor_class_for_name("model.layers.9.mlp.shared_experts.down_proj.weight") ==
          TensorClass::kSharedExpert);
    // Qwen2-MoE-style single shared expert and its gate.
    CHECK(tensor_class_for_name("model.layers.2.mlp.shared_expert.gate_proj.weight") ==
          TensorClass::kSharedExpert);
    CHECK(tensor_class_for_name("model.layers.2.mlp.shared_expert_gate.weight") == std::nullopt);
    CHECK(tensor_class_for_name("something.else") == std::nullopt);
}

}  // namespace
}  // namespace edge::engine::quant
