#include "engine/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <type_traits>

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

// int64s of a rank's control buffer: the count exchange's (count, verdict) pairs out and in
// (2 * size each), then agree()'s own pair and every rank's pairs (2 + 2 * size).
int64_t control_int64s(int32_t size) { return 6 * int64_t{size} + 2; }

// The call's verdict once every rank's (value, code) pair is in `pairs`: `local` when this rank
// failed, else an error with the code of the first rank that did (its own error says why).
Status peer_verdict(const Status& local, std::span<const int64_t> pairs, int32_t size,
                    const char* what) {
    if (!local.ok()) {
        return local;
    }
    for (int32_t r = 0; r < size; ++r) {
        const int64_t code = pairs[2 * static_cast<size_t>(r) + 1];
        if (code == 0) {
            continue;
        }
        const bool known = code > 0 && code <= static_cast<int64_t>(StatusCode::kUnauthenticated);
        return Status(known ? static_cast<StatusCode>(code) : StatusCode::kInternal,
                      std::string("nccl ") + what + ": rank " + std::to_string(r) +
                          " failed this call (its error says why); no data moved");
    }
    return ok_status();
}

// Runs `enqueue` (which sets `*call` to what it calls) between ncclGroupStart and ncclGroupEnd,
// ending the group even when an enqueue failed (an open group would hold every later call).
template <typename F>
ncclResult_t in_group(F&& enqueue, const char** call) {
    *call = "ncclGroupStart";
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) {
        return r;
    }
    r = enqueue(call);
    const ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess && end != ncclSuccess) {
        *call = "ncclGroupEnd";
        r = end;
    }
    return r;
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
    return adopt(comm, rank, size, device, std::make_shared<shard::AbortSignal>());
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::adopt(ncclComm* comm, int32_t rank,
                                                                  int32_t size, int32_t device,
                                                                  GroupFlag group_failed) {
    const char* call = "cudaSetDevice";
    cudaStream_t stream = nullptr;
    void* control = nullptr;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) {
        call = "cudaStreamCreateWithFlags";
        e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    }
    if (e == cudaSuccess) {
        // Allocated once, so the verdict exchanges never need memory they might not get.
        call = "cudaMalloc";
        e = cudaMalloc(&control, static_cast<size_t>(control_int64s(size)) * sizeof(int64_t));
    }
    if (e != cudaSuccess) {
        if (stream != nullptr) {
            check_cleanup(cudaStreamDestroy(stream), "cudaStreamDestroy");
        }
        // Abort, not destroy: the group's other ranks may already be gone or never use it.
        (void)ncclCommAbort(comm);
        return cuda_error_status(e, call, __FILE__, __LINE__);
    }
    return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(
        comm, stream, static_cast<int64_t*>(control), rank, size, device,
        std::move(group_failed)));
}

NcclCommunicator::~NcclCommunicator() {
    check_cleanup(cudaSetDevice(device_), "cudaSetDevice");
    if (comm_ != nullptr && group_failed_->raised()) {
        // Aborted while no call ran on it (its driver had failed): a collective it left in
        // flight would never end, so no synchronize and no destroy.
        (void)ncclCommAbort(comm_);
    } else if (comm_ != nullptr) {  // Healthy (fail() aborted it otherwise).
        check_cleanup(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        (void)ncclCommDestroy(comm_);  // Nothing left to report to at destruction.
    }
    check_cleanup(cudaStreamDestroy(stream_), "cudaStreamDestroy");
    check_cleanup(cudaFree(control_), "cudaFree");
    if (scratch_ != nullptr) {
        check_cleanup(cudaFree(scratch_), "cudaFree");
    }
    if (stage_ != nullptr) {
        check_cleanup(cudaFree(stage_), "cudaFree");
    }
}

Status NcclCommunicator::fail(Status s) {
    if (health_.ok()) {
        health_ = s;
        // Peers blocked on this rank would wait forever: abort now (its kernels end, its
        // connections close) and tell the ranks of this process, whose waits poll the flag.
        (void)group_failed_->raise(s);
        if (comm_ != nullptr) {
            (void)ncclCommAbort(comm_);
            comm_ = nullptr;
        }
    }
    return s;
}

Status NcclCommunicator::usable() {
    EDGE_RETURN_IF_ERROR(health_);
    // A rank of the group failed, or the group was aborted, after this one's last call: the
    // next collective would wait for it forever. Every rank returns the first failure's status.
    if (group_failed_->raised()) {
        return fail(group_failed_->status());
    }
    return ok_status();
}

void NcclCommunicator::abort(Status why) {
    // Only the signal: ncclCommAbort runs on this rank's driving thread, in usable() (every wait
    // polls it) or in the destructor, never concurrently with a call it is making.
    (void)group_failed_->raise(std::move(why));
}

Status NcclCommunicator::wait_stream() {
    for (;;) {
        const cudaError_t e = cudaStreamQuery(stream_);
        if (e == cudaSuccess) {
            return ok_status();
        }
        if (e != cudaErrorNotReady) {
            return fail(cuda_error_status(e, "cudaStreamQuery", __FILE__, __LINE__));
        }
        ncclResult_t async = ncclSuccess;
        EDGE_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &async));
        if (async != ncclSuccess && async != ncclInProgress) {
            return fail(nccl_status(async, "ncclCommGetAsyncError", __FILE__, __LINE__));
        }
        EDGE_RETURN_IF_ERROR(usable());  // Another rank failed meanwhile: stop waiting.
        std::this_thread::yield();
    }
}

Status NcclCommunicator::grow(void** buffer, int64_t* have, int64_t want, const char* what) {
    // The calling thread's current device may be another rank's: allocate on this rank's GPU.
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    if (*buffer != nullptr) {
        EDGE_CUDA_FAIL_IF_ERROR(cudaFree(*buffer));
        *buffer = nullptr;
        *have = 0;
    }
    const cudaError_t e = cudaMalloc(buffer, static_cast<size_t>(want));
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // Not sticky: the device and the communicator stay usable.
        *buffer = nullptr;
        return resource_exhausted_error("nccl rank " + std::to_string(rank_) +
                                        ": cannot allocate " + std::to_string(want) +
                                        " bytes of device memory for " + what);
    }
    EDGE_CUDA_FAIL_IF_ERROR(e);
    *have = want;
    return ok_status();
}

Status NcclCommunicator::ensure_stage(int64_t bytes) {
    if (bytes <= stage_bytes_) {
        return ok_status();
    }
    // Grows geometrically (the MoE dispatch sizes change every step), but no more than asked
    // when doubling does not fit.
    const int64_t want = std::max<int64_t>({bytes, 2 * stage_bytes_, int64_t{1} << 20});
    Status s = grow(&stage_, &stage_bytes_, want, "host-buffer staging");
    if (s.code() == StatusCode::kResourceExhausted && want > bytes) {
        s = grow(&stage_, &stage_bytes_, bytes, "host-buffer staging");
    }
    return s;
}

Status NcclCommunicator::ensure_scratch(int64_t bytes) {
    if (bytes <= scratch_bytes_) {
        return ok_status();
    }
    return grow(&scratch_, &scratch_bytes_, std::max<int64_t>(bytes, 4096),
                "all_reduce_sum's gather");
}

Status NcclCommunicator::agree(int64_t value, const Status& local, const char* what,
                               bool agree_values) {
    const int64_t mine[2] = {value, static_cast<int64_t>(local.code())};
    int64_t* d_mine = control_ + 4 * int64_t{size_};
    int64_t* d_all = d_mine + 2;
    std::vector<int64_t> all(2 * static_cast<size_t>(size_));
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    EDGE_CUDA_FAIL_IF_ERROR(
        cudaMemcpyAsync(d_mine, mine, sizeof(mine), cudaMemcpyHostToDevice, stream_));
    EDGE_NCCL_RETURN_IF_ERROR(ncclAllGather(d_mine, d_all, 2, ncclInt64, comm_, stream_));
    EDGE_RETURN_IF_ERROR(wait_stream());
    EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(all.data(), d_all, all.size() * sizeof(int64_t),
                                            cudaMemcpyDeviceToHost, stream_));
    EDGE_RETURN_IF_ERROR(wait_stream());
    EDGE_RETURN_IF_ERROR(peer_verdict(local, all, size_, what));
    if (!agree_values) {
        return ok_status();
    }
    for (int32_t r = 0; r < size_; ++r) {
        const int64_t theirs = all[2 * static_cast<size_t>(r)];
        if (theirs != value || value < 0) {
            return invalid_argument_error(std::string("nccl ") + what + ": rank " +
                                          std::to_string(rank_) + " has " +
                                          std::to_string(value) + ", rank " + std::to_string(r) +
                                          " has " + std::to_string(theirs));
        }
    }
    return ok_status();
}

Status NcclCommunicator::exchange_checked(std::span<const int64_t> send_counts,
                                          const Status& local, std::span<int64_t> incoming,
                                          const char* what) {
    const size_t n = static_cast<size_t>(size_);
    std::vector<int64_t> out(2 * n);
    for (size_t r = 0; r < n; ++r) {
        out[2 * r] = send_counts[r];
        out[2 * r + 1] = static_cast<int64_t>(local.code());
    }
    int64_t* d_send = control_;
    int64_t* d_recv = control_ + 2 * n;
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(d_send, out.data(), out.size() * sizeof(int64_t),
                                            cudaMemcpyHostToDevice, stream_));
    const char* call = nullptr;
    const ncclResult_t r = in_group(
        [&](const char** c) {
            for (int32_t peer = 0; peer < size_; ++peer) {
                *c = "ncclSend";
                ncclResult_t e = ncclSend(d_send + 2 * peer, 2, ncclInt64, peer, comm_, stream_);
                if (e == ncclSuccess) {
                    *c = "ncclRecv";
                    e = ncclRecv(d_recv + 2 * peer, 2, ncclInt64, peer, comm_, stream_);
                }
                if (e != ncclSuccess) {
                    return e;
                }
            }
            return ncclSuccess;
        },
        &call);
    if (r != ncclSuccess) {
        return fail(nccl_status(r, call, __FILE__, __LINE__));
    }
    std::vector<int64_t> in(2 * n);
    EDGE_RETURN_IF_ERROR(wait_stream());
    EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(in.data(), d_recv, in.size() * sizeof(int64_t),
                                            cudaMemcpyDeviceToHost, stream_));
    EDGE_RETURN_IF_ERROR(wait_stream());
    for (size_t peer = 0; peer < n; ++peer) {
        incoming[peer] = in[2 * peer];
    }
    return peer_verdict(local, in, size_, what);
}

Status NcclCommunicator::exchange_counts(std::span<const int64_t> send_counts,
                                         std::span<int64_t> recv_counts) {
    EDGE_RETURN_IF_ERROR(usable());
    Status local;
    if (send_counts.size() != static_cast<size_t>(size_) ||
        recv_counts.size() != static_cast<size_t>(size_)) {
        local = invalid_argument_error("nccl exchange_counts: spans must have one entry per rank");
    }
    // A rank with bad spans still takes part (sending zeros), so its peers get its error too.
    const std::vector<int64_t> zeros(static_cast<size_t>(size_), 0);
    std::vector<int64_t> incoming(static_cast<size_t>(size_), 0);
    EDGE_RETURN_IF_ERROR(exchange_checked(local.ok() ? send_counts : std::span(zeros), local,
                                          incoming, "exchange_counts"));
    std::copy(incoming.begin(), incoming.end(), recv_counts.begin());
    return ok_status();
}

Status NcclCommunicator::all_to_all_v(const void* send, std::span<const int64_t> send_counts,
                                      void* recv, std::span<const int64_t> recv_counts) {
    EDGE_RETURN_IF_ERROR(usable());
    // What this rank can find wrong alone; its peers learn it in the count exchange below.
    Status local;
    if (send_counts.size() != static_cast<size_t>(size_) ||
        recv_counts.size() != static_cast<size_t>(size_)) {
        local = invalid_argument_error("nccl all_to_all_v: spans must have one entry per rank");
    } else {
        for (int32_t r = 0; r < size_; ++r) {
            if (send_counts[r] < 0 || recv_counts[r] < 0) {
                local = invalid_argument_error("nccl all_to_all_v: negative count for rank " +
                                               std::to_string(r));
                break;
            }
        }
    }
    const bool host = local.ok() && !(is_device_memory(send) && is_device_memory(recv));
    int64_t out = 0;
    int64_t in = 0;
    if (host) {
        out = total_of(send_counts);
        in = total_of(recv_counts);
        local = ensure_stage(out + in + 256);
        EDGE_RETURN_IF_ERROR(health_);  // A CUDA-level failure: aborted, peers told.
    }
    const std::vector<int64_t> zeros(static_cast<size_t>(size_), 0);
    std::vector<int64_t> incoming(static_cast<size_t>(size_), 0);
    EDGE_RETURN_IF_ERROR(exchange_checked(local.ok() ? send_counts : std::span(zeros), local,
                                          incoming, "all_to_all_v"));
    // What each peer will really send must be what this rank expects: a mismatch is an error
    // on every rank (the others would block on the missing bytes).
    Status counts;
    for (int32_t r = 0; r < size_; ++r) {
        if (incoming[r] != recv_counts[r]) {
            counts = invalid_argument_error(
                "nccl all_to_all_v: rank " + std::to_string(rank_) + " expects " +
                std::to_string(recv_counts[r]) + " bytes from rank " + std::to_string(r) +
                ", which sends " + std::to_string(incoming[r]));
            break;
        }
    }
    EDGE_RETURN_IF_ERROR(agree(0, counts, "all_to_all_v counts", false));
    if (!host) {
        return send_recv_bytes(static_cast<const char*>(send), send_counts,
                               static_cast<char*>(recv), recv_counts);
    }
    // Host buffers: through the device and back.
    char* d_send = static_cast<char*>(stage_);
    char* d_recv = d_send + ((out + 255) & ~int64_t{255});
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    if (out > 0) {
        EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(d_send, send, static_cast<size_t>(out),
                                                cudaMemcpyHostToDevice, stream_));
    }
    EDGE_RETURN_IF_ERROR(send_recv_bytes(d_send, send_counts, d_recv, recv_counts));
    if (in > 0) {
        EDGE_RETURN_IF_ERROR(wait_stream());
        EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(recv, d_recv, static_cast<size_t>(in),
                                                cudaMemcpyDeviceToHost, stream_));
        EDGE_RETURN_IF_ERROR(wait_stream());
    }
    return ok_status();
}

Status NcclCommunicator::send_recv_bytes(const char* send, std::span<const int64_t> send_counts,
                                         char* recv, std::span<const int64_t> recv_counts) {
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    int64_t self_send = 0;
    int64_t self_recv = 0;
    for (int32_t r = 0; r < rank_; ++r) {
        self_send += send_counts[r];
        self_recv += recv_counts[r];
    }
    // This rank's own block is a copy, outside the NCCL group.
    if (send_counts[rank_] > 0) {
        EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(recv + self_recv, send + self_send,
                                                static_cast<size_t>(send_counts[rank_]),
                                                cudaMemcpyDeviceToDevice, stream_));
    }
    const char* call = nullptr;
    const ncclResult_t r = in_group(
        [&](const char** c) {
            const char* s = send;
            char* d = recv;
            for (int32_t peer = 0; peer < size_; ++peer) {
                if (peer != rank_ && send_counts[peer] > 0) {
                    *c = "ncclSend";
                    const ncclResult_t e = ncclSend(s, static_cast<size_t>(send_counts[peer]),
                                                    ncclUint8, peer, comm_, stream_);
                    if (e != ncclSuccess) {
                        return e;
                    }
                }
                if (peer != rank_ && recv_counts[peer] > 0) {
                    *c = "ncclRecv";
                    const ncclResult_t e = ncclRecv(d, static_cast<size_t>(recv_counts[peer]),
                                                    ncclUint8, peer, comm_, stream_);
                    if (e != ncclSuccess) {
                        return e;
                    }
                }
                s += send_counts[peer];
                d += recv_counts[peer];
            }
            return ncclSuccess;
        },
        &call);
    if (r != ncclSuccess) {
        return fail(nccl_status(r, call, __FILE__, __LINE__));
    }
    return wait_stream();
}

Status NcclCommunicator::all_gather(const void* send, int64_t bytes, void* recv) {
    EDGE_RETURN_IF_ERROR(usable());
    Status local;
    if (bytes < 0 || bytes > (std::numeric_limits<int64_t>::max() - 512) / (size_ + 1)) {
        local = invalid_argument_error("nccl all_gather: size " + std::to_string(bytes) +
                                       " is negative or too large");
    }
    const bool host =
        local.ok() && bytes > 0 && !(is_device_memory(send) && is_device_memory(recv));
    const int64_t in = local.ok() ? bytes * size_ : 0;
    if (host) {
        local = ensure_stage(in + bytes + 256);
        EDGE_RETURN_IF_ERROR(health_);
    }
    EDGE_RETURN_IF_ERROR(agree(bytes, local, "all_gather size"));
    if (bytes == 0) {
        return ok_status();
    }
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    if (!host) {
        EDGE_NCCL_RETURN_IF_ERROR(
            ncclAllGather(send, recv, static_cast<size_t>(bytes), ncclUint8, comm_, stream_));
        return wait_stream();
    }
    char* d_recv = static_cast<char*>(stage_);
    char* d_send = d_recv + ((in + 255) & ~int64_t{255});
    EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(d_send, send, static_cast<size_t>(bytes),
                                            cudaMemcpyHostToDevice, stream_));
    EDGE_NCCL_RETURN_IF_ERROR(
        ncclAllGather(d_send, d_recv, static_cast<size_t>(bytes), ncclUint8, comm_, stream_));
    EDGE_RETURN_IF_ERROR(wait_stream());
    EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(recv, d_recv, static_cast<size_t>(in),
                                            cudaMemcpyDeviceToHost, stream_));
    return wait_stream();
}

template <typename T>
Status NcclCommunicator::all_reduce_impl(std::span<T> data) {
    EDGE_RETURN_IF_ERROR(usable());
    const int64_t n = static_cast<int64_t>(data.size());
    const bool host = n > 0 && !is_device_memory(data.data());
    Status local;
    if (n > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(sizeof(T)) / size_) {
        local = invalid_argument_error("nccl all_reduce_sum: " + std::to_string(n) +
                                       " elements are too many");
    } else if (n > 0) {
        local = ensure_scratch(n * size_ * int64_t{sizeof(T)});
        if (local.ok() && host) {
            local = ensure_stage(n * int64_t{sizeof(T)});
        }
        EDGE_RETURN_IF_ERROR(health_);
    }
    EDGE_RETURN_IF_ERROR(agree(n, local, "all_reduce_sum length"));
    if (n == 0) {
        return ok_status();
    }
    EDGE_CUDA_FAIL_IF_ERROR(cudaSetDevice(device_));
    T* d_data = data.data();
    if (host) {
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
        EDGE_RETURN_IF_ERROR(wait_stream());
        EDGE_CUDA_FAIL_IF_ERROR(cudaMemcpyAsync(data.data(), d_data, data.size_bytes(),
                                                cudaMemcpyDeviceToHost, stream_));
    }
    return wait_stream();
}

Status NcclCommunicator::all_reduce_sum(std::span<float> data) { return all_reduce_impl(data); }
Status NcclCommunicator::all_reduce_sum(std::span<int64_t> data) { return all_reduce_impl(data); }

Status NcclCommunicator::barrier() {
    EDGE_RETURN_IF_ERROR(usable());
    return agree(0, ok_status(), "barrier", false);
}

Result<std::vector<std::unique_ptr<shard::Communicator>>> create_nccl_communicators(
    int32_t ranks) {
    const int devices = cuda_device_count();
    if (ranks < 1 || ranks > devices) {
        return invalid_argument_error("nccl: " + std::to_string(ranks) +
                                      " ranks need one GPU each; " + std::to_string(devices) +
                                      " visible");
    }
    // One call for the whole group: a rank that cannot initialise fails the call instead of
    // leaving the others blocked in ncclCommInitRank waiting for it.
    std::vector<ncclComm_t> comms(static_cast<size_t>(ranks), nullptr);
    std::vector<int> devlist(static_cast<size_t>(ranks));
    std::iota(devlist.begin(), devlist.end(), 0);
    const ncclResult_t r = ncclCommInitAll(comms.data(), ranks, devlist.data());
    if (r != ncclSuccess) {
        for (ncclComm_t c : comms) {
            if (c != nullptr) {
                (void)ncclCommAbort(c);  // A failed init's comms are aborted, never destroyed.
            }
        }
        return nccl_status(r, "ncclCommInitAll", __FILE__, __LINE__)
            .with_context("nccl: " + std::to_string(ranks) + " ranks");
    }
    auto group_failed = std::make_shared<shard::AbortSignal>();
    std::vector<std::unique_ptr<shard::Communicator>> out;
    std::vector<NcclCommunicator*> adopted;
    for (int32_t k = 0; k < ranks; ++k) {
        auto c = NcclCommunicator::adopt(comms[static_cast<size_t>(k)], k, ranks, k, group_failed);
        if (!c.ok()) {
            // adopt() aborted rank k; abort the rest too, so no destructor waits on rank k.
            for (int32_t j = k + 1; j < ranks; ++j) {
                (void)ncclCommAbort(comms[static_cast<size_t>(j)]);
            }
            for (NcclCommunicator* a : adopted) {
                (void)a->fail(c.status());
            }
            return c.status().with_context("nccl: rank " + std::to_string(k) + " of " +
                                           std::to_string(ranks));
        }
        adopted.push_back(c->get());
        out.push_back(std::move(c).value());
    }
    return out;
}

}  // namespace edge::engine::cuda
