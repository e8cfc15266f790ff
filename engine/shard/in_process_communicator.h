#pragma once

// InProcessCommunicator: the Communicator (communicator.h) for R ranks that are threads of one
// process. The ranks share memory, so a collective is: each rank publishes pointers to its buffers
// in a shared table, all ranks meet at a barrier, each rank copies (or sums) what it needs straight
// from its peers' buffers into its own, and all ranks meet again so no sender reuses a buffer that
// is still being read. Every collective, barrier() included, is exactly these two barrier phases,
// so ranks that disagree about sizes or about which collective runs get kInvalidArgument and
// never hang or overrun a buffer. Barriers spin briefly, then sleep on an atomic wait.
//
// abort() raises the group's abort signal and wakes every barrier: a rank waiting at a meeting
// that not every rank reached, or arriving at one later, returns the abort status. A rank released
// by the abort first waits for any peer still copying from its buffers (that copy never blocks), so
// once its call returned nothing reads or writes its buffers.
//
// Threading: create_in_process_group() returns R endpoints; endpoint r is driven by one thread
// at a time. Lifetime: the endpoints share the group state (kept alive by any endpoint).

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/shard/communicator.h"

namespace edge::engine::shard {

// At most this many ranks in one process.
inline constexpr int32_t kMaxInProcessRanks = 256;

// R connected endpoints, element r being rank r. kInvalidArgument unless 1 <= ranks <= 256.
Result<std::vector<std::unique_ptr<Communicator>>> create_in_process_group(int32_t ranks);

}  // namespace edge::engine::shard
