#pragma once

// Communicator is what expert-parallel sharding needs from the transport between R ranks: an
// all-to-all with variable per-peer byte counts (token dispatch and combine), an all-gather, a sum
// all-reduce (load counts) and a barrier. Everything above this interface (engine/shard/
// sharded_moe.h, the planner, the models) is written against it alone and never learns which
// implementation runs. Two exist or are planned:
//   "in_process": R ranks as threads of one process over shared memory
//                 (engine/shard/in_process_communicator.h), always compiled, used on CPU ranks and
//                 in every test;
//   "nccl":       one rank per GPU over NCCL (engine/cuda/, CUDA builds only).
// create_communicators() (communicator.cc) is the one place that decides which exist.
//
// Semantics (as MPI / NCCL collectives): every rank calls the same collectives in the same order
// with agreeing sizes; a call returns on a rank once that rank's part is complete (its receive
// buffer is filled and its send buffer may be reused). Buffers live where the implementation's
// ranks compute: host memory for "in_process", device memory for "nccl"; counts are always host
// values, in bytes for the byte collectives and in elements for the typed ones. Rank r's blocks
// are laid out back to back in rank order (0, 1, ..., size-1); there are no displacement arrays.
// A call whose sizes disagree between ranks returns kInvalidArgument on every rank that sees the
// disagreement; results are then unspecified but no call hangs or writes out of bounds.
//
// Abort (as ncclCommAbort / MPI_Abort): a rank that cannot go on (it threw, or fails where its
// peers cannot see it) would leave its peers waiting in their next collective for ever. abort(why)
// on any endpoint aborts the whole group: every collective in flight on any rank returns `why`
// (unless every rank already got through it: then its own result), once any copy it was making is
// done, so no buffer is touched after its call returned; so does every later call, for good. The
// first abort's status wins; later ones are ignored. RankGroup (rank_group.h) aborts its ranks'
// communicators when a rank throws or its body returns an error.
//
// Threading: one Communicator object per rank, driven by exactly one thread at a time (that rank's
// driver); abort() alone may be called from any thread at any time. Lifetime: the group's
// communicators must all outlive every call in flight on any of them (create them together,
// destroy them together after the ranks' threads are joined).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace edge::engine::shard {

class Communicator {
public:
    virtual ~Communicator() = default;

    // Implementation name: "in_process" or "nccl".
    virtual std::string_view kind() const = 0;
    // This endpoint's rank in [0, size()).
    virtual int32_t rank() const = 0;
    // Ranks in the group (R).
    virtual int32_t size() const = 0;

    // Sends send_counts[r] bytes to rank r and receives recv_counts[r] bytes from rank r. The send
    // blocks lie back to back in `send` in rank order, the received ones likewise in `recv`. Both
    // spans have size() entries; counts may be zero (a pointer may be null when all its counts
    // are). Rank r's send_counts[q] must equal rank q's recv_counts[r]: exchange the counts first
    // with exchange_counts() when the receiver cannot know them.
    [[nodiscard]] virtual Status all_to_all_v(const void* send,
                                              std::span<const int64_t> send_counts, void* recv,
                                              std::span<const int64_t> recv_counts) = 0;

    // Every rank contributes `bytes` bytes (the same count on every rank, may be 0); `recv`
    // receives size() * bytes, rank r's block at offset r * bytes.
    [[nodiscard]] virtual Status all_gather(const void* send, int64_t bytes, void* recv) = 0;

    // In place, element-wise sum over all ranks of `data` (the same length on every rank). The sum
    // is taken in rank order (((r0 + r1) + r2) ...), so every rank gets bit-identical results.
    [[nodiscard]] virtual Status all_reduce_sum(std::span<float> data) = 0;
    [[nodiscard]] virtual Status all_reduce_sum(std::span<int64_t> data) = 0;

    // Fills recv_counts[r] with what rank r will send to this rank (rank r's send_counts[me]).
    // Both spans have size() entries and are HOST memory for every implementation (an NCCL one
    // stages them through the device itself). Use before all_to_all_v when receivers cannot know
    // their counts.
    [[nodiscard]] virtual Status exchange_counts(std::span<const int64_t> send_counts,
                                                 std::span<int64_t> recv_counts) = 0;

    // Returns once every rank has entered the barrier.
    [[nodiscard]] virtual Status barrier() = 0;

    // Aborts the group (see above): every call in flight or later on any of its ranks returns
    // `why` (an OK `why` becomes kAborted). Idempotent; the first status wins. Never blocks.
    virtual void abort(Status why) = 0;
};

// Names of the implementations compiled in ("in_process"; "nccl" in CUDA builds).
std::vector<std::string> available_communicators();

// A group of `ranks` connected communicators, element r being rank r's endpoint. kNotFound for a
// kind that is not compiled in; kInvalidArgument for ranks < 1 or more than the implementation
// supports.
Result<std::vector<std::unique_ptr<Communicator>>> create_communicators(std::string_view kind,
                                                                        int32_t ranks);

}  // namespace edge::engine::shard
