#include "engine/shard/communicator.h"

#include "engine/shard/in_process_communicator.h"
#if defined(EDGE_HAVE_NCCL)
#include "engine/cuda/nccl_communicator.h"
#endif

namespace edge::engine::shard {

// The one place that decides which communicators exist: in-process always; NCCL in CUDA builds
// that found it (EDGE_HAVE_NCCL comes from engine/cuda/CMakeLists.txt with the CUDA backend).
std::vector<std::string> available_communicators() {
#if defined(EDGE_HAVE_NCCL)
    return {"in_process", "nccl"};
#else
    return {"in_process"};
#endif
}

Result<std::vector<std::unique_ptr<Communicator>>> create_communicators(std::string_view kind,
                                                                        int32_t ranks) {
    if (kind == "in_process") {
        return create_in_process_group(ranks);
    }
#if defined(EDGE_HAVE_NCCL)
    if (kind == "nccl") {
        // One rank per GPU of this process (rank r on GPU r); kInvalidArgument naming both
        // counts when there are fewer GPUs than ranks.
        return cuda::create_nccl_communicators(ranks);
    }
#endif
    return not_found_error("communicator '" + std::string(kind) + "' is not compiled in");
}

}  // namespace edge::engine::shard
