#include "engine/engine.h"

namespace edge::engine {

// Replaced by the real engine (issue 3); the daemon starts with no models until then.
Result<std::unique_ptr<Generator>> create_engine(const EngineConfig& config) {
    return unimplemented_error("the engine is not built yet");
}

}  // namespace edge::engine
