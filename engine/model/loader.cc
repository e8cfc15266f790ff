#include "engine/model/loader.h"

#include <functional>

#include "engine/model/archs/deepseek_v3.h"
#include "engine/model/archs/glm4_moe.h"
#include "engine/model/archs/qwen3_moe.h"
#include "engine/model/model_config.h"

namespace edge::engine {
namespace {

using ArchLoader = Result<std::unique_ptr<CausalLM>> (*)(const std::string&, const ConfigJson&,
                                                         const LoadOptions&);
struct Arch {
    const char* name;
    ArchLoader load;
};

Result<std::unique_ptr<CausalLM>> load_deepseek_v3_auto(const std::string& dir,
                                                        const ConfigJson& config,
                                                        const LoadOptions& options) {
    return load_deepseek_v3(dir, config, options, MlaPath::kAuto);
}

// The architectures this build knows (Kimi K2 checkpoints name DeepseekV3ForCausalLM).
constexpr Arch kArchitectures[] = {
    {kQwen3MoeArchitecture, &load_qwen3_moe},
    {kGlm4MoeArchitecture, &load_glm4_moe},
    {kDeepseekV3Architecture, &load_deepseek_v3_auto},
};

}  // namespace

Result<std::unique_ptr<CausalLM>> load_model(const std::string& dir, const LoadOptions& options) {
    EDGE_ASSIGN_OR_RETURN(ConfigJson config, ConfigJson::read(dir));
    std::string known;
    for (const Arch& a : kArchitectures) {
        if (config.architecture() == a.name) {
            return a.load(dir, config, options);
        }
        known += (known.empty() ? "" : ", ") + std::string(a.name);
    }
    return unimplemented_error(config.path() + ": field 'architectures': '" +
                               config.architecture() + "' is not supported (supported: " + known +
                               ")");
}

}  // namespace edge::engine
