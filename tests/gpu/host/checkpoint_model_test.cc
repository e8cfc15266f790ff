// What the device decoder reads from a checkpoint, checked on the CPU: the fixture's shape and
// tensors, the expert format after quantize-on-load, and clear kUnimplemented errors (naming
// config.json and the field) for configs the whole-step device path does not run.

#include "engine/cuda/host/checkpoint_model.h"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "engine/cpu/rope_scaling.h"
#include "engine/model/archs/qwen3_moe.h"
#include "engine/model/model_config.h"
#include "tests/gpu/host/config_edit.h"
#include "tests/testing/test_certs.h"

namespace edge::engine::cuda {
namespace {

const std::string kMicro = EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe";

std::string fixture_config() { return testing::read_file(kMicro + "/config.json"); }

// The fixture's config.json with `field`'s value replaced, alone in a temp dir.
Status read_with(const testing::TempDir& dir, const std::string& field, const std::string& value) {
    return read_config_with(dir, fixture_config(), field, value);
}

TEST_CASE("checkpoint model: the fixture's shape, norms and every expert as host views") {
    auto m = read_checkpoint_model(kMicro, "none");
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->hidden == 128);
    CHECK(m->layers == 2);
    CHECK(m->experts == 8);
    CHECK(m->top_k == 2);
    CHECK(m->moe_inter == 64);
    CHECK(m->heads == 4);
    CHECK(m->kv_heads == 2);
    CHECK(m->head_dim == 32);
    CHECK(m->vocab == 512);
    CHECK(m->norm_topk_prob);
    CHECK(m->rms_eps == doctest::Approx(1e-6));
    REQUIRE(m->inv_freq.size() == 16);
    CHECK(m->inv_freq[0] == 1.0);
    CHECK(m->inv_freq[1] == doctest::Approx(std::pow(1e6, -2.0 / 32.0)));
    CHECK(m->embed.rows == 512);
    CHECK(m->lm_head.data != m->embed.data);  // Not tied in the fixture.
    CHECK(m->final_norm.size() == 128);
    REQUIRE(m->layer.size() == 2);
    for (const CheckpointLayer& L : m->layer) {
        CHECK(L.q.rows == 128);
        CHECK(L.k.rows == 64);
        CHECK(L.o.cols == 128);
        CHECK(L.router.rows == 8);
        CHECK(L.q_norm.size() == 32);
        REQUIRE(L.gate.size() == 8);
        CHECK(L.down.size() == 8);
        CHECK(L.gate[3].rows == 64);
        CHECK(L.down[3].rows == 128);
        CHECK(L.gate[3].format == m->expert_format);
    }
}

TEST_CASE("checkpoint model: tied embeddings project with embed_tokens beside an lm_head.weight") {
    // As Hugging Face ties them (and the CPU model, qwen3_moe.cc): tie_word_embeddings alone
    // decides, a stored lm_head.weight (the fixture's differs from its embeddings) is not read.
    testing::TempDir dir;
    std::filesystem::copy(kMicro, dir.path(), std::filesystem::copy_options::recursive);
    dir.write("config.json", config_with_field(fixture_config(), "tie_word_embeddings", "true"));
    auto m = read_checkpoint_model(dir.path(), "none");
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->lm_head.data == m->embed.data);
    CHECK(m->lm_head.rows == m->embed.rows);
}

TEST_CASE("checkpoint model: quantize-on-load sets the expert format, dense layers untouched") {
    auto int4 = read_checkpoint_model(kMicro, "experts-int4");
    REQUIRE_MESSAGE(int4.ok(), int4.status().to_string());
    CHECK(int4->expert_format == WeightFormat::kInt4G32);
    CHECK(int4->layer[1].up[5].format == WeightFormat::kInt4G32);
    CHECK(int4->layer[1].up[5].scales != nullptr);
    CHECK(int4->layer[0].q.format != WeightFormat::kInt4G32);
    auto fp8 = read_checkpoint_model(kMicro, "routed_experts=fp8");
    REQUIRE_MESSAGE(fp8.ok(), fp8.status().to_string());
    CHECK(fp8->expert_format == WeightFormat::kFP8E4M3Block128);
    auto bad = read_checkpoint_model(kMicro, "routed_experts=fp4");
    CHECK_FALSE(bad.ok());
}

TEST_CASE("checkpoint model: YaRN gives the CPU model's frequencies and cos/sin factor") {
    testing::TempDir dir;
    dir.write("config.json", config_with_field(fixture_config(), "rope_scaling",
                                               R"({"rope_type": "yarn", "factor": 8.0, )"
                                               R"("original_max_position_embeddings": 64})"));
    std::filesystem::create_symlink(kMicro + "/model.safetensors", dir.file("model.safetensors"));
    auto m = read_checkpoint_model(dir.path(), "none");
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    auto json = ConfigJson::read(dir.path());
    REQUIRE(json.ok());
    auto c = Qwen3MoeConfig::from_json(*json);
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(m->inv_freq == c->rope.inv_freq);
    CHECK(m->inv_freq != cpu::rope_inv_freq(1e6, 32));
    CHECK(m->rope_mscale == doctest::Approx(0.1 * std::log(8.0) + 1.0));
    auto plain = read_checkpoint_model(kMicro, "none");
    REQUIRE(plain.ok());
    CHECK(plain->rope_mscale == 1.0);
}

TEST_CASE("checkpoint model: configs the device path does not run are named errors") {
    testing::TempDir dir;
    Status dense = read_with(dir, "mlp_only_layers", "[1]");
    CHECK(dense.code() == StatusCode::kUnimplemented);
    CHECK_MESSAGE(dense.message().find("config.json: decoder_sparse_step / mlp_only_layers") !=
                      std::string::npos,
                  dense.message());
    Status rope = read_with(dir, "rope_scaling", R"({"type": "linear", "factor": 4.0})");
    CHECK(rope.code() == StatusCode::kUnimplemented);
    CHECK(rope.message().find("rope_scaling.type") != std::string::npos);
    Status bias = read_with(dir, "attention_bias", "true");
    CHECK(bias.code() == StatusCode::kUnimplemented);
    Status head = read_with(dir, "head_dim", "48");
    CHECK(head.code() == StatusCode::kUnimplemented);
    CHECK(head.message().find("head_dim") != std::string::npos);
    // A good config without its weights: the checkpoint error, not a crash.
    Status missing = read_with(dir, "head_dim", "32");
    CHECK_FALSE(missing.ok());
    CHECK(missing.code() != StatusCode::kUnimplemented);
    CHECK_FALSE(read_checkpoint_model(dir.path() + "/nowhere", "none").ok());
}

}  // namespace
}  // namespace edge::engine::cuda
