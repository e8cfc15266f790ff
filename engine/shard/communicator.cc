#include "engine/shard/communicator.h"

#include "engine/shard/in_process_communicator.h"

namespace edge::engine::shard {

// The one place that decides which communicators exist. The NCCL one joins here, behind
// EDGE_HAVE_CUDA, in CUDA builds.
std::vector<std::string> available_communicators() { return {"in_process"}; }

Result<std::vector<std::unique_ptr<Communicator>>> create_communicators(std::string_view kind,
                                                                        int32_t ranks) {
    if (kind == "in_process") {
        return create_in_process_group(ranks);
    }
    return not_found_error("communicator '" + std::string(kind) + "' is not compiled in");
}

}  // namespace edge::engine::shard
