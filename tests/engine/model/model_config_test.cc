// The model version (version_digest) as a loaded model reports it: the load-time quantization
// policy is part of it, in canonical form, and a model loaded without one keeps the digest it had
// before the policy counted.

#include "engine/model/model_config.h"

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <set>
#include <string>

#include "engine/model/archs/deepseek_v3_config.h"
#include "engine/model/loader.h"
#include "engine/model/safetensors.h"
#include "engine/quant/policy.h"

namespace edge::engine {
namespace {

const std::string kFixtures = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/";

// The digests of two fixtures as the code before the policy counted computed them (taken from a
// build of that code): pins and rollout targets set then hold these, so they must not move.
constexpr const char* kMicroQwen3Before =
    "9d574d06e00392558053c61e206e50b6b842bc7c560e249816846ad374511a02";
constexpr const char* kMicroGlm4Before =
    "7df74f0f32f6f84aa59449a760185c1363ff005de70943039bfc53f9e3aefb99";

std::string version_of(const std::string& fixture, const std::string& policy) {
    LoadOptions options;
    options.threads = 1;
    options.max_slots = 1;
    options.max_context = 64;
    options.quantization = policy;
    auto model = load_model(kFixtures + fixture, options);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    return (*model)->spec().version;
}

TEST_CASE("model version: no policy, or one that quantizes nothing, keeps the old digest") {
    // Qwen3-MoE and the GLM-4.5 / DeepSeek-V3 family compute it in separate loaders.
    for (const auto& [fixture, before] : {std::pair{"micro-qwen3-moe", kMicroQwen3Before},
                                          std::pair{"micro-glm4-moe", kMicroGlm4Before}}) {
        CAPTURE(fixture);
        for (const char* policy : {"none", "", "attention=bf16", "none,routed_experts=bf16"}) {
            CAPTURE(policy);
            CHECK(version_of(fixture, policy) == before);
        }
    }
}

TEST_CASE("model version: one checkpoint under different load-time policies, different versions") {
    for (const char* fixture : {"micro-qwen3-moe", "micro-glm4-moe"}) {
        CAPTURE(fixture);
        std::set<std::string> seen;
        for (const char* policy :
             {"none", "experts-int4", "all-fp8", "all-int8", "embeddings=int8"}) {
            CAPTURE(policy);
            CHECK(seen.insert(version_of(fixture, policy)).second);
        }
    }
}

TEST_CASE("model version: spellings of one policy share a version") {
    const std::string int4 = version_of("micro-qwen3-moe", "experts-int4");
    CHECK(version_of("micro-qwen3-moe", "routed_experts=int4-g32") == int4);
    CHECK(version_of("micro-qwen3-moe", " experts-int4 , attention=bf16") == int4);
    CHECK(version_of("micro-qwen3-moe", "none,routed_experts=int4-g32") == int4);
    const std::string fp8 = version_of("micro-qwen3-moe", "all-fp8");
    CHECK(version_of("micro-qwen3-moe",
                     "routed_experts=fp8,shared_expert=fp8,dense_mlp=fp8,attention=fp8") == fp8);
}

TEST_CASE("version_digest: a policy that quantizes nothing adds nothing, any other is fed") {
    // The function itself, as every loader (and the device path's spec) calls it.
    const std::string dir = kFixtures + "micro-qwen3-moe";
    auto config = ConfigJson::read(dir);
    REQUIRE(config.ok());
    auto ckpt = Checkpoint::open_dir(dir, /*populate=*/false);
    REQUIRE(ckpt.ok());
    const std::string plain = version_digest(*config, **ckpt, quant::QuantPolicy{});
    CHECK(plain == kMicroQwen3Before);
    auto int4 = quant::parse_quant_policy("experts-int4");
    REQUIRE(int4.ok());
    CHECK(version_digest(*config, **ckpt, *int4) != plain);
    auto g128 = quant::parse_quant_policy("experts-int4-g128");
    REQUIRE(g128.ok());
    CHECK(version_digest(*config, **ckpt, *g128) != version_digest(*config, **ckpt, *int4));
}

TEST_CASE("config: rope_scaling and rope_parameters together are one scaling, keys of both kept") {
    // A DeepSeek-V3 config.json with `extra` fields.
    auto config = [](const std::string& extra) {
        return ConfigJson::parse(
            "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"hidden_size\": 128, "
            "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"vocab_size\": 512, "
            "\"max_position_embeddings\": 2048, \"intermediate_size\": 256, "
            "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 64, "
            "\"n_routed_experts\": 16, \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 32, "
            "\"qk_rope_head_dim\": 16, \"v_head_dim\": 32, " +
                extra + "}",
            "c.json");
    };
    auto mla = [](const ConfigJson& json) {
        auto c = SigmoidMoeConfig::from_json(json, kDeepseekV3Defaults);
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        auto m = MlaConfig::from_json(json, *c);
        REQUIRE_MESSAGE(m.ok(), m.status().to_string());
        return std::move(m).value();
    };
    const std::string yarn =
        "\"factor\": 4.0, \"mscale\": 1.0, \"mscale_all_dim\": 0.5, \"beta_fast\": 16, "
        "\"original_max_position_embeddings\": 512";
    auto v4 =
        config("\"rope_theta\": 50000.0, \"rope_scaling\": {\"type\": \"yarn\", " + yarn + "}");
    REQUIRE_MESSAGE(v4.ok(), v4.status().to_string());
    // rope_scaling with the type and a few keys, rope_parameters with them all (the reviewer's
    // DeepSeek config: mscale_all_dim was dropped, and the perplexity moved).
    auto both = config(
        "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, "
        "\"original_max_position_embeddings\": 512}, \"rope_parameters\": {\"rope_type\": "
        "\"yarn\", \"rope_theta\": 50000.0, " +
        yarn + "}");
    REQUIRE_MESSAGE(both.ok(), both.status().to_string());
    const boost::json::object& scaling = both->root().at("rope_scaling").as_object();
    CHECK(scaling.at("mscale_all_dim").to_number<double>() == 0.5);
    CHECK(scaling.at("mscale").to_number<double>() == 1.0);
    CHECK(scaling.at("beta_fast").to_number<double>() == 16.0);
    CHECK(scaling.at("type").as_string() == "yarn");
    const MlaConfig a = mla(*v4);
    const MlaConfig b = mla(*both);
    CHECK(b.inv_freq == a.inv_freq);
    CHECK(b.rope_mscale == a.rope_mscale);
    CHECK(b.softmax_scale == a.softmax_scale);

    // `type` and `rope_type` are one setting: a disagreement is refused, naming both fields.
    auto clash = config(
        "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}, \"rope_parameters\": "
        "{\"rope_type\": \"linear\", \"factor\": 4.0}");
    REQUIRE_FALSE(clash.ok());
    CHECK(clash.status().message() ==
          "c.json: field 'rope_parameters.rope_type' (\"linear\") disagrees with field "
          "'rope_scaling.type' (\"yarn\")");
    // Also when rope_parameters holds nothing but the type.
    auto plain = config(
        "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}, \"rope_parameters\": "
        "{\"rope_type\": \"default\", \"rope_theta\": 10000.0}");
    REQUIRE_FALSE(plain.ok());
    CHECK(plain.status().message() ==
          "c.json: field 'rope_parameters.rope_type' (\"default\") disagrees with field "
          "'rope_scaling.rope_type' (\"yarn\")");
}

TEST_CASE("config.json: rope_scaling of the type 'default' alone is no scaling") {
    for (const char* plain : {R"({"rope_type": "default"})", R"({"type": "default"})"}) {
        auto c = ConfigJson::parse(
            std::string("{\"model_type\": \"qwen3_moe\", \"rope_scaling\": ") + plain + "}",
            "c.json");
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        CHECK(c->is_null("rope_scaling"));  // As an absent one: every architecture takes it.
    }
    // Anything more is for the architecture to read or refuse.
    for (const char* more :
         {R"({"rope_type": "default", "factor": 2.0})", R"({"rope_type": "linear"})"}) {
        auto c = ConfigJson::parse(
            std::string("{\"model_type\": \"qwen3_moe\", \"rope_scaling\": ") + more + "}",
            "c.json");
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        CHECK_FALSE(c->is_null("rope_scaling"));
    }
}

}  // namespace
}  // namespace edge::engine
