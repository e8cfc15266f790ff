#pragma once

// Backend is where a model's arithmetic runs: matmuls over stored weights and the parallel loops of
// the other ops. Models ask supports(op, format) at load time and refuse weights a backend cannot
// run, so forward() never meets an unsupported case. create_backend() (backend.cc) is the one
// place that decides which backends exist; today the CPU backend, later CUDA.
//
// Threading: a Backend is driven by one thread at a time (the model's forward); it runs work on its
// own threads internally. Lifetime: weights passed to it must outlive the call.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/result.h"
#include "engine/cpu/matmul_job.h"
#include "engine/cpu/weight.h"

namespace edge::engine {

enum class Op {
    kMatmul,     // y = x W^T over a Weight of some format.
    kRmsNorm,
    kRope,
    kSoftmax,
    kSiluMul,
    kAttention,  // Causal GQA over the KV cache.
};

struct BackendOptions {
    int32_t threads = 0;  // Compute threads; 0: one per hardware thread.
    int32_t device = 0;   // Device ordinal for device backends (CUDA: the GPU); the CPU ignores
                          // it. Expert-parallel ranks pass their rank (one GPU per rank).
    // Activations of multi-token BF16 products on the CPU (engine.activation_precision); device
    // backends ignore it.
    ActivationPrecision activation_precision = ActivationPrecision::kExact;
    // The CPU backend's matmul kernels (engine.cpu_kernels): "auto", or an ISA name of
    // cpu::isa_name() no better than this CPU's; device backends ignore it.
    std::string cpu_kernels = "auto";
};

class Backend {
public:
    virtual ~Backend() = default;

    virtual std::string_view name() const = 0;
    // Whether `op` runs on weights stored as `format` (ops without weights ignore `format`).
    virtual bool supports(Op op, WeightFormat format) const = 0;
    // Whether matmul takes quantized weights in WeightLayout::kRowTiles16 (engine/cpu/weight.h);
    // models ask their WeightLoader for row tiles only then. Device backends upload row-major
    // weights only.
    virtual bool supports_row_tiles() const { return false; }
    virtual int threads() const = 0;
    // BackendOptions::activation_precision as this backend applies it (kExact where it has none).
    virtual ActivationPrecision activation_precision() const { return ActivationPrecision::kExact; }
    // BackendOptions::cpu_kernels as this backend resolved it ("auto" where it has none).
    virtual std::string cpu_kernels() const { return "auto"; }
    // OK while the backend can run work; once a device reports a sticky error (the CUDA context
    // is lost) it returns that error for good, and the daemon's /readyz fails on it. Thread-safe.
    virtual Status health() const { return ok_status(); }
    // The compute calls below have no error path. One that fails without losing the device (a
    // full device arena, a weight it cannot upload) writes NaN outputs, records its error here
    // and leaves the backend usable; callers check after a step's work and fail that step. The
    // first such error since the last call, then cleared; OK when there was none (the CPU).
    [[nodiscard]] virtual Status take_error() { return ok_status(); }

    // y[t * ldy + r] = sum_c W[r][c] * x[t * W.cols + c] for t < n, r < W.rows; weight rows are
    // read once for all n tokens.
    virtual void matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) = 0;

    // The same at full activation precision whatever BackendOptions::activation_precision says:
    // for small matmuls whose results make discrete choices (the MoE router's logits decide the
    // experts, and a near tie flipped by bf16 activations changes the output by far more than
    // the rounding). The default is matmul().
    virtual void matmul_exact(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) {
        matmul(w, x, n, y, ldy);
    }

    // Independent matmuls run as one parallel step: jobs[i] computes y = x W^T for its own
    // weight, input and output.
    virtual void matmul_batch(std::span<const MatmulJob> jobs) = 0;


    // Independent SwiGLU feed-forwards (the routed experts of a step, each with its own tokens):
    // jobs[i].y = down(silu(gate x) * up x). The default runs every gate and up projection as one
    // matmul_batch, the SiLU product on the host, then every down projection as one more; the CPU
    // backend has no barrier between the projections (engine/cpu/cpu_backend.h).
    virtual void swiglu_batch(std::span<const SwiGluJob> jobs);

    // Drops what this backend keeps of `weights` (a device backend's uploaded copies) once the
    // work already given to it has finished; a later call that uses one of them brings it back.
    // Expert parallelism calls it when a new plan moves experts off a rank, so a GPU does not
    // keep every expert it ever held. Weights it keeps nothing of are ignored. The default has
    // nothing to drop: the CPU reads host weights in place.
    virtual void release_weights(std::span<const Weight* const> weights) { (void)weights; }

    // Runs body(task, worker) for every task in [0, n) on the backend's threads; worker <
    // threads() names the thread running it (for per-thread scratch).
    template <typename F>
    void for_each_task(int64_t n, F&& body) {
        run_tasks(
            n,
            [](void* ctx, int64_t i, int worker) {
                (*static_cast<std::remove_reference_t<F>*>(ctx))(i, worker);
            },
            &body);
    }

protected:
    virtual void run_tasks(int64_t n, void (*fn)(void*, int64_t, int), void* ctx) = 0;
};

// OK unless a device of a compiled-in backend has failed for good (a sticky CUDA error, or a fault
// reported with report_device_fault(): the process must restart). For the scheduler (which fails
// the sequences it runs), the daemon's /readyz, gossip draining and exit; thread-safe, cheap.
Status device_health();

// Records a sticky device fault found outside the CUDA runtime's own error codes (a kernel's error
// flag, a communicator, a watchdog): device_health() returns the first one for the rest of the
// process. Thread-safe.
void report_device_fault(const Status& fault);

// Forgets faults recorded by report_device_fault() (not the CUDA runtime's own sticky errors, which
// only a new process clears). For tests that inject a fault and must leave the process clean; never
// called by the daemon.
void clear_reported_device_fault_for_testing();

// The backend `engine.backend` asks for, resolved on this machine: "cpu" -> "cpu"; "auto" ->
// "cuda" when the CUDA backend is compiled in and a device is visible, else "cpu"; "cuda" ->
// "cuda", or kUnavailable when no device is visible / kNotFound when the build has no CUDA
// backend (a clear startup error, never a silent fall back to the CPU). kInvalidArgument for any
// other name.
Result<std::string> resolve_backend(std::string_view requested);

// Names of the backends compiled in ("cpu", later "cuda").
std::vector<std::string> available_backends();

// A backend by name; kNotFound for one that is not compiled in.
Result<std::unique_ptr<Backend>> create_backend(std::string_view name,
                                                const BackendOptions& options);

}  // namespace edge::engine
