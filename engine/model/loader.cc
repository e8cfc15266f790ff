#include "engine/model/loader.h"

#include <cstdio>
#include <functional>

#include "engine/model/archs/deepseek_v3.h"
#include "engine/model/archs/glm4_moe.h"
#include "engine/model/archs/qwen3_moe.h"
#include "engine/model/model_config.h"
#include "engine/model/moe_block.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_loader.h"

namespace edge::engine {
namespace {

using ArchLoader = Result<std::unique_ptr<CausalLM>> (*)(const std::string&, const ConfigJson&,
                                                         const LoadOptions&);
struct Arch {
    const char* name;
    ArchLoader load;
    // The config's fields, as the load checks them; sets the positions the model serves.
    Status (*check_config)(const ConfigJson&, int64_t*);
    const char* experts_field;  // config.json's count of routed experts per MoE layer.
};

Result<std::unique_ptr<CausalLM>> load_deepseek_v3_auto(const std::string& dir,
                                                        const ConfigJson& config,
                                                        const LoadOptions& options) {
    return load_deepseek_v3(dir, config, options, MlaPath::kAuto);
}

// The architectures this build knows (Kimi K2 checkpoints name DeepseekV3ForCausalLM).
constexpr Arch kArchitectures[] = {
    {kQwen3MoeArchitecture, &load_qwen3_moe, &check_qwen3_moe_config, "num_experts"},
    {kGlm4MoeArchitecture, &load_glm4_moe, &check_glm4_moe_config, "n_routed_experts"},
    {kDeepseekV3Architecture, &load_deepseek_v3_auto, &check_deepseek_v3_config,
     "n_routed_experts"},
};

// `s` with control characters written as \xNN: a name read from a file, about to be printed in
// an error on someone's terminal.
std::string printable(std::string_view s) {
    std::string out;
    for (const char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            char hex[5];
            std::snprintf(hex, sizeof(hex), "\\x%02x", u);
            out += hex;
        } else {
            out += c;
        }
    }
    return out;
}

// The architecture `config` names, or kUnimplemented listing those this build knows.
Result<const Arch*> find_arch(const ConfigJson& config) {
    std::string known;
    for (const Arch& a : kArchitectures) {
        if (config.architecture() == a.name) {
            return &a;
        }
        known += (known.empty() ? "" : ", ") + std::string(a.name);
    }
    return unimplemented_error(config.path() + ": field 'architectures': '" +
                               printable(config.architecture()) +
                               "' is not supported (supported: " + known + ")");
}

}  // namespace

Result<std::unique_ptr<CausalLM>> load_model(const std::string& dir, const LoadOptions& options) {
    EDGE_ASSIGN_OR_RETURN(ConfigJson config, ConfigJson::read(dir));
    EDGE_ASSIGN_OR_RETURN(const Arch* arch, find_arch(config));
    return arch->load(dir, config, options);
}

Status check_model_files(const std::string& dir, const std::string& policy,
                         const shard::ShardingConfig& sharding, int64_t max_context) {
    EDGE_ASSIGN_OR_RETURN(ConfigJson config, ConfigJson::read(dir));
    EDGE_ASSIGN_OR_RETURN(const Arch* arch, find_arch(config));
    int64_t positions = 0;
    EDGE_RETURN_IF_ERROR(arch->check_config(config, &positions));
    // Against what the load serves, not config.json's max_position_embeddings: with YaRN the
    // model serves more (Qwen's recipe: 131072 where the config says 40960).
    EDGE_RETURN_IF_ERROR(check_max_context(config, positions, max_context));
    // One layer's placement: the plan is the same for every layer (check_config bounded the
    // count). A model with 0 routed experts is dense: the loaders build no MoE block and place
    // nothing, so neither does the check.
    EDGE_ASSIGN_OR_RETURN(const int64_t experts, config.get_int(arch->experts_field));
    if (experts > 0) {
        EDGE_RETURN_IF_ERROR(
            plan_expert_placement(sharding, 1, static_cast<int32_t>(experts)).status());
    }
    // Headers only: checking reads no weights.
    EDGE_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint,
                          Checkpoint::open_dir(dir, /*populate=*/false));
    // The stored quantization_config and the policy, as the WeightLoader checks them, and its
    // checks of the tensors against both (quantized dtypes the config does not declare, an INT4
    // group that does not divide a matrix the policy quantizes).
    EDGE_ASSIGN_OR_RETURN(std::unique_ptr<WeightLoader> loader,
                          WeightLoader::create(*checkpoint, config, policy));
    return loader->check_headers();
}

}  // namespace edge::engine
