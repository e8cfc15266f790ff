#pragma once

// NcclCommunicator: the sharding Communicator (engine/shard/communicator.h) over NCCL, one rank
// per GPU; RAII over ncclComm_t. Buffers are device memory on the rank's GPU; counts are host
// values. Host buffers are accepted too (the CPU-side MoE dispatch of engine/model/moe_block
// passes them): they are staged through a device buffer, one copy each way. all_to_all_v is
// grouped ncclSend/ncclRecv; all_reduce_sum gathers every rank's data and sums it on the device in
// rank order, so results are bit-identical on every rank as the interface requires.
//
// No rank leaves a call alone. Everything a rank can find wrong before the data moves (spans of
// the wrong size, negative sizes, sizes that disagree between ranks, a staging buffer it cannot
// allocate) goes into a small exchange every rank takes part in before the data collective, so
// every rank returns the error (the failing rank its own, its peers one naming it) and the
// communicator stays usable. A failure at the NCCL or CUDA level instead makes health() fail for
// good and aborts the communicator at once (ncclCommAbort); every wait polls the stream with
// ncclCommGetAsyncError and a flag shared by the ranks of one create_nccl_communicators group, so
// a rank whose peer aborted returns that error (and aborts too) instead of waiting forever. Ranks
// in other processes learn of an abort through NCCL's own remote-error detection.
//
// abort(why) (Communicator::abort) raises that same group signal with `why`, from any thread: each
// rank's next poll (every wait polls) or next call returns `why` and calls ncclCommAbort on the
// rank's own driving thread, so no NCCL call on the communicator races the abort; an endpoint no
// thread drives any more is aborted by its destructor. Ranks of the group in this process return
// `why`; ranks in other processes get the error NCCL reports for the aborted peer.
//
// Bootstrap: rank 0 calls nccl_unique_id() and the daemon hands the 128 bytes to every rank (any
// node); each rank calls NcclCommunicator::create with it (blocks until every rank joined).
// create_nccl_communicators() builds a whole group in one process with ncclCommInitAll (rank r on
// GPU r), which fails as a whole when one rank cannot initialise, for single-node serving and
// tests; shard::create_communicators("nccl", R) calls it.
//
// This header includes no CUDA or NCCL header. Threading: as Communicator (one driving thread
// per rank); ranks of one process must be driven by different threads.

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/result.h"
#include "engine/shard/abort_signal.h"
#include "engine/shard/communicator.h"

struct ncclComm;
struct CUstream_st;

namespace edge::engine::cuda {

using NcclUniqueId = std::array<char, 128>;

// A fresh unique id for a new group (rank 0 calls it once per group).
Result<NcclUniqueId> nccl_unique_id();

class NcclCommunicator final : public shard::Communicator {
public:
    // Joins group `id` as `rank` of `size` on CUDA device `device` (blocks until all ranks join).
    static Result<std::unique_ptr<NcclCommunicator>> create(const NcclUniqueId& id, int32_t rank,
                                                            int32_t size, int32_t device);
    ~NcclCommunicator() override;
    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;

    std::string_view kind() const override { return "nccl"; }
    int32_t rank() const override { return rank_; }
    int32_t size() const override { return size_; }

    Status all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                        std::span<const int64_t> recv_counts) override;
    Status all_gather(const void* send, int64_t bytes, void* recv) override;
    Status all_reduce_sum(std::span<float> data) override;
    Status all_reduce_sum(std::span<int64_t> data) override;
    Status exchange_counts(std::span<const int64_t> send_counts,
                           std::span<int64_t> recv_counts) override;
    Status barrier() override;
    void abort(Status why) override;

    // OK until a call failed at the NCCL or CUDA level (or a peer of the same process group
    // did, or the group was aborted); then that error for good, the communicator aborted.
    Status health() const { return health_; }

private:
    // Raised by any rank of a create_nccl_communicators group that failed at the NCCL or CUDA
    // level, or by abort(); its peers' waits see it and abort too.
    using GroupFlag = std::shared_ptr<shard::AbortSignal>;

    NcclCommunicator(ncclComm* comm, CUstream_st* stream, int64_t* control, int32_t rank,
                     int32_t size, int32_t device, GroupFlag group_failed)
        : comm_(comm),
          stream_(stream),
          control_(control),
          rank_(rank),
          size_(size),
          device_(device),
          group_failed_(std::move(group_failed)) {}
    // Wraps an initialised `comm` (its stream and control buffer made on `device`); aborts
    // `comm` when that fails.
    static Result<std::unique_ptr<NcclCommunicator>> adopt(ncclComm* comm, int32_t rank,
                                                           int32_t size, int32_t device,
                                                           GroupFlag group_failed);
    friend Result<std::vector<std::unique_ptr<shard::Communicator>>> create_nccl_communicators(
        int32_t ranks);

    // Every rank passes `value` and its `local` verdict on the call (OK, or the error it found
    // before the collective); returns `local` when it failed, else an error with the code of the
    // first rank that failed, else kInvalidArgument for a negative value or values that differ
    // between ranks (`what` names them; agree_values = false skips that check).
    Status agree(int64_t value, const Status& local, const char* what, bool agree_values = true);
    // exchange_counts with a verdict: each rank sends `send_counts` (size() entries) and its
    // `local` verdict; `incoming` gets what every rank sends here. Returns as agree() does.
    Status exchange_checked(std::span<const int64_t> send_counts, const Status& local,
                            std::span<int64_t> incoming, const char* what);
    // Grouped send / receive of byte blocks (device memory), counts already agreed.
    Status send_recv_bytes(const char* send, std::span<const int64_t> send_counts, char* recv,
                           std::span<const int64_t> recv_counts);
    // Waits for the stream; fails (and aborts) on an NCCL async error or a failed group peer
    // instead of waiting forever. Called after every collective before its result is copied to
    // (pageable) host memory: such a copy blocks until the collective ends, which a failed peer
    // would make never.
    Status wait_stream();
    // health_, and not aborted by another rank of the group: checked as every call starts.
    Status usable();
    // The device buffers, at least `bytes`. A failed allocation is this call's error only
    // (kResourceExhausted, the communicator stays usable); other CUDA errors go through fail().
    Status ensure_scratch(int64_t bytes);
    Status ensure_stage(int64_t bytes);
    Status grow(void** buffer, int64_t* have, int64_t want, const char* what);
    // Records the first NCCL / CUDA level failure, aborts the communicator and tells the group.
    Status fail(Status s);
    template <typename T>
    Status all_reduce_impl(std::span<T> data);

    ncclComm* comm_;     // Null once aborted.
    CUstream_st* stream_;
    int64_t* control_;   // cudaMalloc'd at creation: counts and verdicts (control_int64s()).
    int32_t rank_;
    int32_t size_;
    int32_t device_;
    GroupFlag group_failed_;
    void* scratch_ = nullptr;  // cudaMalloc'd, grows on demand (all_reduce_sum's gather).
    int64_t scratch_bytes_ = 0;
    void* stage_ = nullptr;  // cudaMalloc'd, grows on demand (host-buffer staging).
    int64_t stage_bytes_ = 0;
    Status health_;
};

// `ranks` communicators on devices 0 .. ranks-1 of this process, element r being rank r
// (ncclCommInitAll; sharing one group flag). kInvalidArgument naming both counts when fewer GPUs
// than ranks are visible; the NCCL or CUDA error, with no communicator left behind, when any rank
// fails to initialise.
Result<std::vector<std::unique_ptr<shard::Communicator>>> create_nccl_communicators(int32_t ranks);

}  // namespace edge::engine::cuda
