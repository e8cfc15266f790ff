#pragma once

// NcclCommunicator: the sharding Communicator (engine/shard/communicator.h) over NCCL, one rank
// per GPU; RAII over ncclComm_t (destroyed with the object, aborted instead when a call failed so
// a dead peer cannot hang the destructor). Buffers are device memory on the rank's GPU; counts are
// host values. Host buffers are accepted too (the CPU-side MoE dispatch of engine/model/moe_block
// passes them): they are staged through a device buffer, one copy each way. all_to_all_v is grouped ncclSend/ncclRecv; all_reduce_sum gathers every rank's
// data and sums it on the device in rank order, so results are bit-identical on every rank as the
// interface requires; sizes are compared across ranks (a small all-gather) before each collective
// so disagreeing sizes give kInvalidArgument instead of a hang. Every call waits for its stream.
//
// Bootstrap: rank 0 calls nccl_unique_id() and the daemon hands the 128 bytes to every rank (any
// node); each rank calls NcclCommunicator::create with it. create_nccl_communicators() builds a
// whole group in one process the same way (rank r on GPU r, one thread per rank joining), for
// single-node serving and tests; shard::create_communicators("nccl", R) calls it.
//
// This header includes no CUDA or NCCL header. Threading: as Communicator (one driving thread
// per rank); ranks of one process must be driven by different threads.

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/result.h"
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

    // OK until a call failed at the NCCL or CUDA level; then that error for good.
    Status health() const { return health_; }

private:
    NcclCommunicator(ncclComm* comm, CUstream_st* stream, int32_t rank, int32_t size,
                     int32_t device)
        : comm_(comm), stream_(stream), rank_(rank), size_(size), device_(device) {}

    // Gathers one int64 from every rank (host in, host out) through the device scratch.
    Status gather_values(int64_t value, std::vector<int64_t>* all);
    // kInvalidArgument unless every rank passed the same `value` for `what`.
    Status check_agree(int64_t value, const char* what);
    Status ensure_scratch(int64_t bytes);
    // The staging buffer for host-memory arguments, at least `bytes`.
    Status ensure_stage(int64_t bytes);
    Status device_all_to_all_v(const void* send, std::span<const int64_t> send_counts,
                               void* recv, std::span<const int64_t> recv_counts);
    Status fail(Status s);
    template <typename T>
    Status all_reduce_impl(std::span<T> data);

    ncclComm* comm_;
    CUstream_st* stream_;
    int32_t rank_;
    int32_t size_;
    int32_t device_;
    void* scratch_ = nullptr;  // cudaMalloc'd, grows on demand.
    int64_t scratch_bytes_ = 0;
    void* stage_ = nullptr;  // cudaMalloc'd, grows on demand (host-buffer staging).
    int64_t stage_bytes_ = 0;
    Status health_;
};

// `ranks` communicators on devices 0 .. ranks-1 of this process, element r being rank r (unique id
// from nccl_unique_id(), one joining thread per rank). kInvalidArgument naming both counts when
// fewer GPUs than ranks are visible.
Result<std::vector<std::unique_ptr<shard::Communicator>>> create_nccl_communicators(int32_t ranks);

}  // namespace edge::engine::cuda
