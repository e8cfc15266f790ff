#include "engine/model/loader.h"

#include <functional>

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

// The architectures this build knows; GLM-4.5 and DeepSeek-V3 join as sibling files.
constexpr Arch kArchitectures[] = {
    {kQwen3MoeArchitecture, &load_qwen3_moe},
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
                               config.architecture() + "' is not supported (supported: " +
                               known + ")");
}

}  // namespace edge::engine
