// The loader's entry points agree: what load_model takes, check_model_files (check-config and
// the daemon's preflight) takes too.

#include "engine/model/loader.h"

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "engine/model/safetensors_writer.h"
#include "tests/testing/test_certs.h"

namespace edge::engine {
namespace {

namespace json = boost::json;

const std::string kMicro = std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-qwen3-moe";

TEST_CASE("check_model_files takes a dense model (0 routed experts) as the loader does") {
    // The micro Qwen3-MoE with its MoE blocks swapped for dense MLPs of intermediate_size and
    // num_experts 0: the loader builds no MoE block for it, and the check planned an expert
    // placement anyway ("ranks 1 exceeds the model's 0 routed experts").
    testing::TempDir dir;
    json::object config = json::parse(testing::read_file(kMicro + "/config.json")).as_object();
    config["num_experts"] = 0;
    const int64_t hidden = config.at("hidden_size").to_number<int64_t>();
    const int64_t inter = config.at("intermediate_size").to_number<int64_t>();
    const int64_t layers = config.at("num_hidden_layers").to_number<int64_t>();
    dir.write("config.json", json::serialize(config));

    auto micro = Checkpoint::open_dir(kMicro);
    REQUIRE_MESSAGE(micro.ok(), micro.status().to_string());
    std::vector<TensorToWrite> tensors;
    for (const std::string& name : (*micro)->names()) {
        if (name.find(".mlp.") != std::string::npos) {
            continue;
        }
        auto view = (*micro)->tensor(name);
        REQUIRE(view.ok());
        tensors.push_back({name, view->dtype(), view->shape(),
                           std::string_view(static_cast<const char*>(view->data),
                                            static_cast<size_t>(view->nbytes))});
    }
    // BF16 0x3c00 (1/128) everywhere: the check reads headers only, and the load needs values.
    const std::string dense_bytes = [&] {
        std::string b;
        for (int64_t i = 0; i < hidden * inter; ++i) {
            b += std::string("\x00\x3c", 2);
        }
        return b;
    }();
    for (int64_t l = 0; l < layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
        tensors.push_back({p + "gate_proj.weight", DType::kBF16, {inter, hidden}, dense_bytes});
        tensors.push_back({p + "up_proj.weight", DType::kBF16, {inter, hidden}, dense_bytes});
        tensors.push_back({p + "down_proj.weight", DType::kBF16, {hidden, inter}, dense_bytes});
    }
    REQUIRE(write_safetensors(dir.file("model.safetensors"), tensors).ok());

    LoadOptions o;
    o.threads = 1;
    o.max_slots = 1;
    o.max_context = 64;
    auto loaded = load_model(dir.path(), o);
    REQUIRE_MESSAGE(loaded.ok(), loaded.status().to_string());
    const Status checked = check_model_files(dir.path(), "");
    CHECK_MESSAGE(checked.ok(), checked.to_string());
    // With routed experts the placement is still checked against their count.
    shard::ShardingConfig sharding;
    sharding.ranks = 9;
    const Status too_many = check_model_files(kMicro, "", sharding);
    CHECK(too_many.message().find("ranks 9 exceeds the model's 8 routed experts") !=
          std::string::npos);
}

}  // namespace
}  // namespace edge::engine
