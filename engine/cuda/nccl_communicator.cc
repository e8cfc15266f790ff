#include "engine/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <string>
#include <thread>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/nccl_reduce.h"

namespace edge::engine::cuda {
namespace {

Status nccl_status(ncclResult_t r, const char* call, const char* file, int line) {
    if (r == ncclSuccess) {
        return ok_status();
    }
    std::string msg = std::string(call) + " failed at " + file + ":" + std::to_string(line) +
                      ": " + ncclGetErrorString(r);
    if (r == ncclUnhandledCudaError) {
        Status s = unavailable_error("NCCL: " + msg);
        mark_device_unhealthy(s);
        return s;
    }
    return r == ncclInvalidArgument || r == ncclInvalidUsage ? invalid_argument_error(msg)
                                                             : unavailable_error("NCCL: " + msg);
}

// Whether `p` is memory a kernel on a device can address (cudaMalloc'd or managed); plain host
// memory (moe_block's rank buffers) is staged through the device instead.
bool is_device_memory(const void* p) {
    if (p == nullptr) {
        return true;  // Nothing to stage; the counts are all zero.
    }
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();  // Not a pointer CUDA knows: host memory.
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

int64_t total_of(std::span<const int64_t> counts) {
    int64_t t = 0;
    for (int64_t c : counts) {
        t += std::max<int64_t>(c, 0);
    }
    return t;
}

}  // namespace
}  // namespace edge::engine::cuda

#define EDGE_NCCL_RETURN_IF_ERROR(call)                                                       \
    do {                                                                                      \
        const ncclResult_t edge_nccl_result_ = (call);                                        \
        if (edge_nccl_result_ != ncclSuccess) {                                               \
            return fail(nccl_status(edge_nccl_result_, #call, __FILE__, __LINE__));           \
        }                                                                                     \
    } while (0)

// Inside member functions: record the failure (the communicator is unusable afterwards).
#define EDGE_CUDA_FAIL_IF_ERROR(call)                                                         \
    do {                                                                                      \
        const cudaError_t edge_cuda_error_ = (call);                                          \
        if (edge_cuda_error_ != cudaSuccess) {                                                \
            return fail(cuda_error_status(edge_cuda_error_, #call, __FILE__, __LINE__));      \
        }                                                                                     \
    } while (0)

namespace edge::engine::cuda {

Result<NcclUniqueId> nccl_unique_id() {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        return nccl_status(r, "ncclGetUniqueId", __FILE__, __LINE__);
    }
    static_assert(sizeof(id.internal) == sizeof(NcclUniqueId));
    NcclUniqueId out;
    std::memcpy(out.data(), id.internal, out.size());
    return out;
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(const NcclUniqueId& id,
                                                                   int32_t rank, int32_t size,
                                                                   int32_t device) {
    if (size < 1 || rank < 0 || rank >= size) {
        return invalid_argument_error("nccl: rank " + std::to_string(rank) + " of " +
                                      std::to_string(size));
    }
    EDGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    ncclUniqueId uid;
    std::memcpy(uid.internal, id.data(), id.size());
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRank(&comm, size, uid, rank);
    if (r != ncclSuccess) {
        return nccl_status(r, "ncclCommInitRank", __FILE__, __LINE__);
    }
    cudaStream_t stream = nullptr;
    const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        (void)ncclCommDestroy(comm);  // Already failing; the CUDA error is returned.
        return cuda_error_status(e, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
    }
    return std::unique_ptr<NcclCommunicator>(
        new NcclCommunicator(comm, stream, rank, size, device));
}

NcclCommunicator::~NcclCommunicator() {
    check_cleanup(cudaSetDevice(device_), "cudaSetDevice");
    if (health_.ok()) {
        check_cleanup(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        (void)ncclCommDestroy(comm_);  // Nothing left to report to at destruction.
    } else {
        (void)ncclCommAbort(comm_);  // A peer may be gone: never wait on it.
    }
    check_cleanup(cudaStreamDestroy(stream_), "cudaStreamDestroy");
    if (scratch_ != nullptr) {
        check_cleanup(cudaFree(scratch_), "cudaFree");
    }
    if (stage_ != nullptr) {
        check_cleanup(cudaFree(stage_), "cudaFree");
    }
}

Status NcclCommunicator::ensure_stage(int64_t bytes) {
    if (bytes <= stage_bytes_) {
        return ok_status();
    }
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    if (stage_ != nullptr) {
        EDGE_CUDA_FAIL_IF_ERROR(cudaFree(stage_));
        stage_ = nullptr;
        stage_bytes_ = 0;
    }
    // Grows geometrically: the MoE dispatch sizes change every step.
    const int64_t want = std::max<int64_t>({bytes, 2 * stage_bytes_, int64_t{1} << 20});
    EDGE_CUDA_FAIL_IF_ERROR(cudaMalloc(&stage_, static_cast<size_t>(want)));
    stage_bytes_ = want;
    return ok_status();
}

Status NcclCommunicator::fail(Status s) {
    if (health_.ok()) {
        health_ = s;
    }
    return s;
}

Status NcclCommunicator::ensure_scratch(int64_t bytes) {
    if (bytes <= scratch_bytes_) {
        return ok_status();
    }
    // The calling thread's current device may be another rank's: allocate on this rank's GPU.
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    if (scratch_ != nullptr) {
        EDGE_CUDA_FAIL_IF_ERROR(cudaFree(scratch_));
        scratch_ = nullptr;
        scratch_bytes_ = 0;
    }
    const int64_t want = std::max<int64_t>(bytes, 4096);
    EDGE_CUDA_FAIL_IF_ERROR(cudaMalloc(&scratch_, static_cast<size_t>(want)));
    scratch_bytes_ = want;
    return ok_status();
}

Status NcclCommunicator::gather_values(int64_t value, std::vector<int64_t>* all) {
    EDGE_RETURN_IF_ERROR(health_);
    EDGE_RETURN_IF_ERROR(ensure_scratch((size_ + 1) * int64_t{8}));
    int64_t* d = static_cast<int64_t*>(scratch_);
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    EDGE_CUDA_FAIL_IF_ERROR(
        cudaMemcpyAsync(d + size_, &value, 8, cudaMemcpyHostToDevice, stream_));
    EDGE_NCCL_RETURN_IF_ERROR(ncclAllGather(d + size_, d, 1, ncclInt64, comm_, stream_));
    all->resize(size_);
    EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(all->data(), d, size_ * sizeof(int64_t),
                                            cudaMemcpyDeviceToHost, stream_));
    EDGE_CUDA_FAIL_IF_ERROR(cudaStreamSynchronize(stream_));
    return ok_status();
}

Status NcclCommunicator::check_agree(int64_t value, const char* what) {
    std::vector<int64_t> all;
    EDGE_RETURN_IF_ERROR(gather_values(value, &all));
    for (int32_t r = 0; r < size_; ++r) {
        if (all[r] != value) {
            return invalid_argument_error(std::string("nccl ") + what + ": rank " +
                                          std::to_string(rank_) + " has " +
                                          std::to_string(value) + ", rank " + std::to_string(r) +
                                          " has " + std::to_string(all[r]));
        }
    }
    return ok_status();
}

Status NcclCommunicator::exchange_counts(std::span<const int64_t> send_counts,
                                         std::span<int64_t> recv_counts) {
    EDGE_RETURN_IF_ERROR(health_);
    if (send_counts.size() != static_cast<size_t>(size_) ||
        recv_counts.size() != static_cast<size_t>(size_)) {
        return invalid_argument_error("nccl exchange_counts: spans must have one entry per rank");
    }
    EDGE_RETURN_IF_ERROR(ensure_scratch(2 * size_ * int64_t{8}));
    int64_t* d_send = static_cast<int64_t*>(scratch_);
    int64_t* d_recv = d_send + size_;
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(d_send, send_counts.data(), size_ * sizeof(int64_t),
                                            cudaMemcpyHostToDevice, stream_));
    EDGE_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    for (int32_t r = 0; r < size_; ++r) {
        EDGE_NCCL_RETURN_IF_ERROR(ncclSend(d_send + r, 1, ncclInt64, r, comm_, stream_));
        EDGE_NCCL_RETURN_IF_ERROR(ncclRecv(d_recv + r, 1, ncclInt64, r, comm_, stream_));
    }
    EDGE_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
    EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(recv_counts.data(), d_recv, size_ * sizeof(int64_t),
                                            cudaMemcpyDeviceToHost, stream_));
    EDGE_CUDA_FAIL_IF_ERROR(cudaStreamSynchronize(stream_));
    return ok_status();
}

Status NcclCommunicator::all_to_all_v(const void* send, std::span<const int64_t> send_counts,
                                      void* recv, std::span<const int64_t> recv_counts) {
    if (send_counts.size() != static_cast<size_t>(size_) ||
        recv_counts.size() != static_cast<size_t>(size_)) {
        return invalid_argument_error("nccl all_to_all_v: spans must have one entry per rank");
    }
    EDGE_RETURN_IF_ERROR(health_);
    if (is_device_memory(send) && is_device_memory(recv)) {
        return device_all_to_all_v(send, send_counts, recv, recv_counts);
    }
    // Host buffers: through the device and back.
    const int64_t out = total_of(send_counts);
    const int64_t in = total_of(recv_counts);
    EDGE_RETURN_IF_ERROR(ensure_stage(out + in + 256));
    char* d_send = static_cast<char*>(stage_);
    char* d_recv = d_send + ((out + 255) & ~int64_t{255});
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    if (out > 0) {
        EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(d_send, send, static_cast<size_t>(out),
                                                cudaMemcpyHostToDevice, stream_));
    }
    EDGE_RETURN_IF_ERROR(device_all_to_all_v(d_send, send_counts, d_recv, recv_counts));
    if (in > 0) {
        EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(recv, d_recv, static_cast<size_t>(in),
                                                cudaMemcpyDeviceToHost, stream_));
        EDGE_CUDA_FAIL_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    return ok_status();
}

Status NcclCommunicator::device_all_to_all_v(const void* send,
                                             std::span<const int64_t> send_counts, void* recv,
                                             std::span<const int64_t> recv_counts) {
    // What each peer will really send: a mismatch must be an error, not a hang.
    std::vector<int64_t> incoming(size_);
    EDGE_RETURN_IF_ERROR(exchange_counts(send_counts, incoming));
    bool bad = false;
    for (int32_t r = 0; r < size_; ++r) {
        bad = bad || incoming[r] != recv_counts[r] || send_counts[r] < 0;
    }
    // Every rank must learn that some rank saw a disagreement, or the others would block.
    std::vector<int64_t> verdicts;
    EDGE_RETURN_IF_ERROR(gather_values(bad ? 1 : 0, &verdicts));
    for (int32_t r = 0; r < size_; ++r) {
        if (verdicts[r] != 0) {
            return invalid_argument_error("nccl all_to_all_v: rank " + std::to_string(r) +
                                          " expects other counts than its peers send");
        }
    }
    const char* s = static_cast<const char*>(send);
    char* d = static_cast<char*>(recv);
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    EDGE_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    for (int32_t r = 0; r < size_; ++r) {
        if (r == rank_) {
            if (send_counts[r] > 0) {
                EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(d, s, static_cast<size_t>(send_counts[r]),
                                                        cudaMemcpyDeviceToDevice, stream_));
            }
        } else {
            if (send_counts[r] > 0) {
                EDGE_NCCL_RETURN_IF_ERROR(ncclSend(s, static_cast<size_t>(send_counts[r]),
                                                   ncclUint8, r, comm_, stream_));
            }
            if (recv_counts[r] > 0) {
                EDGE_NCCL_RETURN_IF_ERROR(ncclRecv(d, static_cast<size_t>(recv_counts[r]),
                                                   ncclUint8, r, comm_, stream_));
            }
        }
        s += send_counts[r];
        d += recv_counts[r];
    }
    EDGE_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
    EDGE_CUDA_FAIL_IF_ERROR(cudaStreamSynchronize(stream_));
    return ok_status();
}

Status NcclCommunicator::all_gather(const void* send, int64_t bytes, void* recv) {
    if (bytes < 0) {
        return invalid_argument_error("nccl all_gather: negative size");
    }
    EDGE_RETURN_IF_ERROR(check_agree(bytes, "all_gather size"));
    if (bytes == 0) {
        return ok_status();
    }
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    if (is_device_memory(send) && is_device_memory(recv)) {
        EDGE_NCCL_RETURN_IF_ERROR(
            ncclAllGather(send, recv, static_cast<size_t>(bytes), ncclUint8, comm_, stream_));
        EDGE_CUDA_FAIL_IF_ERROR(cudaStreamSynchronize(stream_));
        return ok_status();
    }
    const int64_t in = bytes * size_;
    EDGE_RETURN_IF_ERROR(ensure_stage(in + bytes + 256));
    char* d_recv = static_cast<char*>(stage_);
    char* d_send = d_recv + ((in + 255) & ~int64_t{255});
    EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(d_send, send, static_cast<size_t>(bytes),
                                            cudaMemcpyHostToDevice, stream_));
    EDGE_NCCL_RETURN_IF_ERROR(
        ncclAllGather(d_send, d_recv, static_cast<size_t>(bytes), ncclUint8, comm_, stream_));
    EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(recv, d_recv, static_cast<size_t>(in),
                                            cudaMemcpyDeviceToHost, stream_));
    EDGE_CUDA_FAIL_IF_ERROR(cudaStreamSynchronize(stream_));
    return ok_status();
}

template <typename T>
Status NcclCommunicator::all_reduce_impl(std::span<T> data) {
    const int64_t n = static_cast<int64_t>(data.size());
    EDGE_RETURN_IF_ERROR(check_agree(n, "all_reduce_sum length"));
    if (n == 0) {
        return ok_status();
    }
    EDGE_RETURN_IF_ERROR(ensure_scratch(n * size_ * int64_t{sizeof(T)}));
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    const bool host = !is_device_memory(data.data());
    T* d_data = data.data();
    if (host) {
        EDGE_RETURN_IF_ERROR(ensure_stage(n * int64_t{sizeof(T)}));
        d_data = static_cast<T*>(stage_);
        EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(d_data, data.data(), data.size_bytes(),
                                                cudaMemcpyHostToDevice, stream_));
    }
    EDGE_NCCL_RETURN_IF_ERROR(ncclAllGather(d_data, scratch_, static_cast<size_t>(n),
                                            std::is_same_v<T, float> ? ncclFloat32 : ncclInt64,
                                            comm_, stream_));
    Status s = sum_ranks_in_order(static_cast<const T*>(scratch_), size_, n, d_data, stream_);
    if (!s.ok()) {
        return fail(s);
    }
    if (host) {
        EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(data.data(), d_data, data.size_bytes(),
                                                cudaMemcpyDeviceToHost, stream_));
    }
    EDGE_CUDA_FAIL_IF_ERROR(cudaStreamSynchronize(stream_));
    return ok_status();
}

Status NcclCommunicator::all_reduce_sum(std::span<float> data) { return all_reduce_impl(data); }
Status NcclCommunicator::all_reduce_sum(std::span<int64_t> data) { return all_reduce_impl(data); }

Status NcclCommunicator::barrier() {
    std::vector<int64_t> all;
    return gather_values(0, &all);
}

Result<std::vector<std::unique_ptr<shard::Communicator>>> create_nccl_communicators(
    int32_t ranks) {
    const int devices = cuda_device_count();
    if (ranks < 1 || ranks > devices) {
        return invalid_argument_error("nccl: " + std::to_string(ranks) +
                                      " ranks need one GPU each; " + std::to_string(devices) +
                                      " visible");
    }
    // The multi-node bootstrap, in one process: rank 0's unique id handed to every rank, each
    // rank joining from its own thread (ncclCommInitRank blocks until the whole group joined).
    EDGE_ASSIGN_OR_RETURN(const NcclUniqueId id, nccl_unique_id());
    std::vector<Result<std::unique_ptr<NcclCommunicator>>> joined;
    for (int32_t r = 0; r < ranks; ++r) {
        joined.emplace_back(internal_error("nccl: rank did not run"));
    }
    {
        std::vector<std::thread> threads;
        threads.reserve(static_cast<size_t>(ranks));
        for (int32_t r = 0; r < ranks; ++r) {
            threads.emplace_back([&joined, &id, r, ranks] {
                joined[static_cast<size_t>(r)] = NcclCommunicator::create(id, r, ranks, r);
            });
        }
        for (std::thread& t : threads) {
            t.join();
        }
    }
    std::vector<std::unique_ptr<shard::Communicator>> out;
    for (int32_t r = 0; r < ranks; ++r) {
        auto& j = joined[static_cast<size_t>(r)];
        if (!j.ok()) {
            // The others are destroyed with `joined` (their destructors free their comms).
            return j.status().with_context("nccl: rank " + std::to_string(r) + " of " +
                                           std::to_string(ranks));
        }
        out.push_back(std::move(j).value());
    }
    return out;
}

}  // namespace edge::engine::cuda
