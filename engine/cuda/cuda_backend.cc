#include "engine/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/cpu/thread_pool.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_allocator.h"
#include "engine/cuda/host/launch_plan.h"
#include "engine/cuda/kernels/kernels.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::cuda {
namespace {

// A weight copied to the device: its device view and the one-entry pointer tables the grouped
// matmul takes.
struct DeviceWeight {
    Weight view;                       // Device pointers.
    void* data = nullptr;              // Arena ranges, released with the backend or by
                                       // release_weights().
    void* scales = nullptr;
    void* tables = nullptr;            // [data pointer, scales pointer] on the device.
};

// Each job's staging range starts 256-byte aligned: the vectorized kernels load float4s.
int64_t padded(int64_t floats) { return (floats + 63) & ~int64_t{63}; }

// A device buffer from the arena that grows on demand.
struct Staging {
    void* p = nullptr;
    int64_t bytes = 0;
};

class CudaBackend final : public Backend {
public:
    CudaBackend(const CudaBackendOptions& options, std::shared_ptr<DeviceAllocator> alloc,
                cudaStream_t stream)
        : pool_(options.host_threads), device_(options.device), alloc_(std::move(alloc)),
          stream_(stream) {}

    ~CudaBackend() override {
        check_cleanup(cudaSetDevice(device_), "cudaSetDevice");
        check_cleanup(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        check_cleanup(cudaStreamDestroy(stream_), "cudaStreamDestroy");
        // The arena may be shared with other backends on this device: give back what this one
        // took (the arena itself goes with its last backend).
        for (auto& [host, d] : weights_) {
            free_weight(d);
        }
        for (Staging* st : {&x_, &y_, &offsets_}) {
            alloc_->release(st->p);
        }
    }

    std::string_view name() const override { return "cuda"; }
    bool supports(Op op, WeightFormat format) const override {
        return op != Op::kMatmul || cuda_matmul_supports(format);
    }
    int threads() const override { return pool_.size(); }

    Status health() const override {
        Status device = cuda_device_health();
        if (!device.ok()) {
            return device;
        }
        std::lock_guard<std::mutex> lock(health_mu_);
        return health_;
    }

    void matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) override {
        const MatmulJob job{&w, x, n, y, ldy};
        matmul_batch(std::span<const MatmulJob>(&job, 1));
    }

    Status take_error() override {
        Status s = std::move(call_error_);
        call_error_ = ok_status();
        return s;
    }

    void matmul_batch(std::span<const MatmulJob> jobs) override {
        Status s = run_matmuls(jobs);
        if (!s.ok()) {
            // A failure part way may leave copies into the outputs queued: let them land before
            // the outputs are poisoned (and before the next call reuses the staging buffers).
            (void)drain();
            if (is_call_error(s)) {
                // A full arena or a weight this backend cannot take is this call's problem, not
                // a lost device: the caller fails the step (take_error) and the process stays
                // ready, rather than a capacity problem restarting every model of the process.
                // Not kResourceExhausted: the scheduler reads that from forward() as a full KV
                // cache and would preempt sequences, which frees no weight memory.
                if (call_error_.ok()) {
                    call_error_ = s.code() == StatusCode::kResourceExhausted
                                      ? unavailable_error("device weight memory: " + s.message())
                                      : s;
                }
            } else {
                // The interface has no error path: mark the backend and the process's device
                // health unhealthy (the scheduler fails the batch, /readyz fails, the daemon
                // restarts).
                {
                    std::lock_guard<std::mutex> lock(health_mu_);
                    if (health_.ok()) {
                        health_ = s;
                    }
                }
                mark_device_unhealthy(s);
            }
            // Poison the outputs so nothing downstream looks valid.
            for (const MatmulJob& j : jobs) {
                for (int64_t t = 0; t < j.n; ++t) {
                    std::fill(j.y + t * j.ldy, j.y + t * j.ldy + j.w->rows,
                              std::numeric_limits<float>::quiet_NaN());
                }
            }
        }
    }

    void release_weights(std::span<const Weight* const> weights) override {
        // Only this backend's stream reads its weights. matmul_batch drains it before returning,
        // but a call that failed part way may have left work queued: drain again before the
        // ranges go back to an arena other backends on this device allocate from. If that
        // fails, keep them: a leak is better than a kernel reading memory handed out again.
        if (!drain().ok()) {
            return;
        }
        for (const Weight* w : weights) {
            auto it = weights_.find(w->data);
            if (it != weights_.end()) {
                free_weight(it->second);
                weights_.erase(it);
            }
        }
    }

protected:
    void run_tasks(int64_t n, void (*fn)(void*, int64_t, int), void* ctx) override {
        pool_.for_each_task(n, [fn, ctx](int64_t i, int worker) { fn(ctx, i, worker); });
    }

private:
    void free_weight(const DeviceWeight& d) {
        alloc_->release(d.data);
        alloc_->release(d.scales);
        alloc_->release(d.tables);
    }

    // Errors that leave the device usable: the arena's kResourceExhausted, and kInvalidArgument
    // for a weight or shape the device kernels do not take. CUDA failures are never among them
    // (cuda_error_status gives kInternal or kUnavailable).
    static bool is_call_error(const Status& s) {
        return s.code() == StatusCode::kResourceExhausted ||
               s.code() == StatusCode::kInvalidArgument;
    }

    Status drain() {
        EDGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
        EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
        return ok_status();
    }

    Result<const DeviceWeight*> device_weight(const Weight& w) {
        auto it = weights_.find(w.data);
        if (it != weights_.end()) {
            const Weight& v = it->second.view;
            if (v.format != w.format || v.rows != w.rows || v.cols != w.cols) {
                return internal_error("cuda backend: two weights share the address of a " +
                                      std::to_string(v.rows) + " x " + std::to_string(v.cols) +
                                      " tensor");
            }
            return &it->second;
        }
        if (w.layout != WeightLayout::kRows) {
            // Row tiles are a CPU kernel layout; the device kernels read row-major weights.
            return invalid_argument_error("cuda backend: a " + std::to_string(w.rows) + " x " +
                                          std::to_string(w.cols) +
                                          " weight in CPU row tiles cannot be uploaded (load it "
                                          "row-major: WeightLoader::use_row_tiles(false))");
        }
        const int64_t data_bytes = quant::weight_data_bytes(w.format, w.rows, w.cols);
        const int64_t scale_bytes =
            quant::weight_scale_count(w.format, w.rows, w.cols) * int64_t{sizeof(float)};
        if (data_bytes <= 0 || w.data == nullptr || (scale_bytes > 0 && w.scales == nullptr)) {
            return invalid_argument_error("cuda backend: bad weight view (" +
                                          std::to_string(w.rows) + " x " + std::to_string(w.cols) +
                                          ")");
        }
        DeviceWeight d;
        // Each range is recorded in `d` as it is taken, so a failure part way can give it back.
        Status uploaded = [&]() -> Status {
            EDGE_ASSIGN_OR_RETURN(d.data, alloc_->allocate(data_bytes, "weight"));
            EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d.data, w.data,
                                                      static_cast<size_t>(data_bytes),
                                                      cudaMemcpyHostToDevice, stream_));
            if (scale_bytes > 0) {
                EDGE_ASSIGN_OR_RETURN(d.scales, alloc_->allocate(scale_bytes, "weight scales"));
                EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d.scales, w.scales,
                                                          static_cast<size_t>(scale_bytes),
                                                          cudaMemcpyHostToDevice, stream_));
            }
            EDGE_ASSIGN_OR_RETURN(d.tables, alloc_->allocate(2 * sizeof(void*), "weight tables"));
            const void* table[2] = {d.data, d.scales};
            EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d.tables, table, sizeof(table),
                                                      cudaMemcpyHostToDevice, stream_));
            // The host arrays above are pageable and read before cudaMemcpyAsync returns; the sync
            // keeps `table` alive regardless.
            EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
            return ok_status();
        }();
        if (!uploaded.ok()) {
            // Now that a full arena fails only the call, a partial upload must not keep its
            // ranges; copies into them may still be queued, so drain first (or leak them).
            if (drain().ok()) {
                free_weight(d);
            }
            return uploaded;
        }
        d.view = Weight{w.format, w.rows, w.cols, d.data, static_cast<const float*>(d.scales)};
        return &weights_.emplace(w.data, d).first->second;
    }

    Status ensure(Staging& s, int64_t bytes, const char* what) {
        if (bytes <= s.bytes) {
            return ok_status();
        }
        alloc_->release(s.p);
        s = Staging{};
        const int64_t want = std::max<int64_t>(bytes, 1 << 20);
        EDGE_ASSIGN_OR_RETURN(s.p, alloc_->allocate(want, what));
        s.bytes = want;
        return ok_status();
    }

    Status run_matmuls(std::span<const MatmulJob> jobs) {
        EDGE_RETURN_IF_ERROR(cuda_device_health());
        EDGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
        int64_t x_floats = 0;
        int64_t y_floats = 0;
        std::vector<const DeviceWeight*> dev(jobs.size());
        std::vector<int32_t> offsets;
        for (size_t i = 0; i < jobs.size(); ++i) {
            const MatmulJob& j = jobs[i];
            if (j.n <= 0) {
                continue;
            }
            if (j.n > std::numeric_limits<int32_t>::max()) {
                return invalid_argument_error("cuda matmul: too many tokens");
            }
            EDGE_ASSIGN_OR_RETURN(dev[i], device_weight(*j.w));
            x_floats += padded(j.n * j.w->cols);
            y_floats += padded(j.n * j.w->rows);
            offsets.push_back(0);
            offsets.push_back(static_cast<int32_t>(j.n));
        }
        if (offsets.empty()) {
            return ok_status();
        }
        EDGE_RETURN_IF_ERROR(ensure(x_, x_floats * 4, "matmul inputs"));
        EDGE_RETURN_IF_ERROR(ensure(y_, y_floats * 4, "matmul outputs"));
        EDGE_RETURN_IF_ERROR(
            ensure(offsets_, static_cast<int64_t>(offsets.size() * sizeof(int32_t)), "offsets"));
        EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(offsets_.p, offsets.data(),
                                                  offsets.size() * sizeof(int32_t),
                                                  cudaMemcpyHostToDevice, stream_));
        float* xd = static_cast<float*>(x_.p);
        float* yd = static_cast<float*>(y_.p);
        const int32_t* od = static_cast<const int32_t*>(offsets_.p);
        for (size_t i = 0; i < jobs.size(); ++i) {
            const MatmulJob& j = jobs[i];
            if (j.n <= 0) {
                continue;
            }
            const Weight& w = dev[i]->view;
            EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(xd, j.x,
                                                      static_cast<size_t>(j.n * w.cols) * 4,
                                                      cudaMemcpyHostToDevice, stream_));
            kernels::GroupedWeights gw;
            gw.format = w.format;
            gw.rows = w.rows;
            gw.cols = w.cols;
            gw.groups = 1;
            gw.data = static_cast<const void* const*>(dev[i]->tables);
            gw.scales = dev[i]->scales != nullptr
                            ? static_cast<const float* const*>(dev[i]->tables) + 1
                            : nullptr;
            EDGE_RETURN_IF_ERROR(kernels::grouped_matmul(gw, od, xd, yd, stream_));
            EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
                j.y, static_cast<size_t>(j.ldy) * 4, yd, static_cast<size_t>(w.rows) * 4,
                static_cast<size_t>(w.rows) * 4, static_cast<size_t>(j.n),
                cudaMemcpyDeviceToHost, stream_));
            xd += padded(j.n * w.cols);
            yd += padded(j.n * w.rows);
            od += 2;
        }
        EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
        return ok_status();
    }

    cpu::ThreadPool pool_;
    int32_t device_;
    std::shared_ptr<DeviceAllocator> alloc_;
    cudaStream_t stream_;
    std::unordered_map<const void*, DeviceWeight> weights_;
    Staging x_, y_, offsets_;
    Status call_error_;  // See take_error(); driving thread only.
    mutable std::mutex health_mu_;
    Status health_;
};

// The arena of `device`, shared by every backend of the process on that device (expert-parallel
// rank 0 and the model's driver backend both live on GPU 0): created by the first with its
// memory config, freed with the last.
Result<std::shared_ptr<DeviceAllocator>> shared_arena(int32_t device,
                                                      const DeviceMemoryConfig& memory) {
    static std::mutex mu;
    static std::unordered_map<int32_t, std::weak_ptr<DeviceAllocator>> arenas;
    std::lock_guard<std::mutex> lock(mu);
    if (auto live = arenas[device].lock()) {
        return live;
    }
    EDGE_ASSIGN_OR_RETURN(std::unique_ptr<DeviceAllocator> fresh,
                          DeviceAllocator::create(memory, device));
    std::shared_ptr<DeviceAllocator> arena(std::move(fresh));
    arenas[device] = arena;
    return arena;
}

}  // namespace

Result<std::unique_ptr<Backend>> create_cuda_backend(const CudaBackendOptions& options) {
    const int count = cuda_device_count();
    if (options.device < 0 || options.device >= count) {
        return unavailable_error("cuda backend: device " + std::to_string(options.device) +
                                 " requested, " + std::to_string(count) + " visible");
    }
    EDGE_RETURN_IF_ERROR(cuda_device_health());
    EDGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
    EDGE_ASSIGN_OR_RETURN(auto alloc, shared_arena(options.device, options.memory));
    cudaStream_t stream = nullptr;
    EDGE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return std::unique_ptr<Backend>(
        std::make_unique<CudaBackend>(options, std::move(alloc), stream));
}

}  // namespace edge::engine::cuda
