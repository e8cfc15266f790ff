#include "engine/cuda/device_decoder.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "engine/cpu/rope_scaling.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_allocator.h"
#include "engine/cuda/host/checkpoint_model.h"
#include "engine/cuda/host/launch_plan.h"
#include "engine/cuda/host/paged_kv_layout.h"
#include "engine/cuda/kernels/kernels.h"
#include "engine/cuda/kernels/mla.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::cuda {
namespace {

__device__ __forceinline__ uint32_t hash32(uint64_t seed, uint64_t i) {
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<uint32_t>(z ^ (z >> 31));
}

__device__ __forceinline__ float uniform(uint64_t seed, uint64_t i) {
    return static_cast<float>(hash32(seed, i) >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

__global__ void fill_f32_kernel(float* p, int64_t n, uint64_t seed, float center, float spread) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        p[i] = center + spread * uniform(seed, i);
    }
}

__global__ void fill_bf16_kernel(uint16_t* p, int64_t n, uint64_t seed, float spread) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        p[i] = static_cast<uint16_t>(__float_as_uint(spread * uniform(seed, i)) >> 16);
    }
}

// Random bytes ANDed with `mask` (0xBF keeps E4M3 bytes finite and below 2).
__global__ void fill_bytes_kernel(uint8_t* p, int64_t n, uint64_t seed, uint32_t mask) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        p[i] = static_cast<uint8_t>(hash32(seed, i) & mask);
    }
}

__global__ void iota_kernel(int32_t* p, int32_t n, int32_t start) {
    for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        p[i] = start + i;
    }
}

__global__ void fill_i32_kernel(int32_t* p, int32_t n, int32_t value) {
    for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        p[i] = value;
    }
}

__global__ void advance_kernel(int32_t* positions, int32_t n) {
    const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        positions[i] += 1;
    }
}

// A dense SwiGLU on the device (registered dense weights); null data when absent.
struct DenseMlp {
    Weight gate, up, down;
    bool present() const { return gate.data != nullptr; }
};

struct Layer {
    float* in_norm = nullptr;
    float* post_norm = nullptr;
    float* q_norm = nullptr;  // Null: no per-head q/k norm.
    float* k_norm = nullptr;
    float* q_bias = nullptr;  // Null: no attention bias.
    float* k_bias = nullptr;
    float* v_bias = nullptr;
    Weight q, k, v, o, router;
    bool moe = true;               // Routed experts; else the dense MLP.
    DenseMlp dense;                // moe false.
    DenseMlp shared;               // Shared experts of a moe layer, or absent.
    float* router_bias = nullptr;  // e_score_correction_bias, or null.
    kernels::GroupedWeights gate, up, down;
    int32_t* offsets = nullptr;  // experts + 1, written by permute each step (moe layers).
    kernels::MlaDeviceWeights mla;  // kMla attention (its o_proj is `o`).
};

}  // namespace

struct DeviceDecoder::Impl {
    DecoderShape s;
    std::unique_ptr<DeviceAllocator> alloc;
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    uint64_t seed = 1;
    uint64_t fills = 0;
    float eps = 1e-6f;            // RMSNorm epsilon (the checkpoint's rms_norm_eps).
    bool norm_topk_prob = true;   // Renormalise the top-k routing weights.
    RouterParams rule;            // The checkpoint's routing rule; softmax top-k when random.
    AttentionKind attention = AttentionKind::kGqa;
    MlaDims mla;                  // kMla: the attention's shapes and scales.
    MlaLatentLayout mla_kv;       // kMla: the pool's layout (the same bytes as `kv`'s).
    float* mla_scratch = nullptr; // kMla: mla_scratch_floats(mla, batch).
    float* mla_out = nullptr;     // kMla: [batch][heads * v_head_dim], the input of o_proj.
    int32_t rot_dim = 0;          // Leading values of a head RoPE rotates; 0: head_dim.
    float rope_mscale = 1.0f;     // kGqa: factor on cos and sin (YaRN's; 1 without).
    int64_t mlp_inter = 0;        // Widest dense / shared SwiGLU (0: none).
    bool zero_kv = false;         // Positions below the start hold zeros (else random values).
    std::vector<double> host_inv_freq;  // RoPE frequencies; empty: rope_inv_freq(1e6).
    int64_t dense_bytes = 0;      // Bytes of the dense weights one step reads (not embed).
    std::vector<Layer> layers;
    Weight embed, lm_head;
    float* final_norm = nullptr;
    double* inv_freq = nullptr;
    PagedKvLayout kv;
    float* pool = nullptr;
    int32_t* block_table = nullptr;
    int32_t max_blocks = 0;
    int32_t* tokens = nullptr;
    int32_t* positions = nullptr;
    int32_t* seq_ids = nullptr;
    int32_t* dense_offsets = nullptr;  // {0, batch}
    const int32_t* step_offsets = nullptr;  // {0, rows} of the step being enqueued.
    // Serving (create_for_serving): buckets, the staging buffer (tokens, positions, sequences,
    // logit rows and block table live in it), {0, bucket} per bucket, {0, logit bucket} per
    // logit bucket, and one graph per (bucket, logit bucket or none).
    bool serving = false;
    ServingDecoderOptions serve;
    StepLayout layout;
    std::vector<int32_t> buckets;
    std::vector<int32_t> logit_buckets;  // row_buckets(serve.max_logit_rows).
    int32_t* staging = nullptr;
    int32_t* logit_idx = nullptr;       // In staging: the rows the LM head runs on.
    int32_t* bucket_offsets = nullptr;  // 2 per bucket.
    int32_t* logit_offsets = nullptr;   // 2 per logit bucket.
    // Per (bucket b, logit choice j) at b * (logit_buckets.size() + 1) + j, j 0: no logits,
    // j > 0: logit_buckets[j - 1]; null until captured.
    std::vector<cudaGraph_t> bucket_graphs;
    std::vector<cudaGraphExec_t> bucket_execs;
    int32_t last_logit_rows = 0;  // Compact logits rows of the last run_rows.
    float *x = nullptr, *h = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr;
    float *o = nullptr, *router_logits = nullptr, *topk_w = nullptr;
    float *permuted = nullptr, *gate = nullptr, *up = nullptr, *act = nullptr, *down = nullptr;
    float* logits = nullptr;
    int32_t *topk_idx = nullptr, *row_of = nullptr;
    int32_t position = 0;  // Host copy of every sequence's position (they advance together).

    // The checkpoint's shape and norms for `batch` rows starting at `context` of `max_context`
    // positions, positions below the start holding zeros.
    void take_model_shape(const CheckpointModel& m, int32_t batch, int32_t context,
                          int32_t max_context) {
        s.hidden = m.hidden;
        s.layers = m.layers;
        s.experts = m.experts;
        s.top_k = m.top_k;
        s.moe_inter = m.moe_inter;
        s.heads = m.heads;
        s.kv_heads = m.kv_heads;
        s.head_dim = m.head_dim;
        s.vocab = m.vocab;
        s.batch = batch;
        s.context = context;
        s.max_context = max_context;
        s.expert_format = m.expert_format;
        eps = m.rms_eps;
        norm_topk_prob = m.norm_topk_prob;
        rule = m.router;
        attention = m.attention;
        mla = m.mla;
        rot_dim = m.rot_dim;
        rope_mscale = static_cast<float>(m.rope_mscale);
        mlp_inter = std::max(m.dense_inter, m.shared_inter);
        zero_kv = true;
    }

    // Captures one step of `rows` rows (enqueue_step) on the stream as a graph and instantiates
    // it into *graph / *exec (both left null on failure, the graph destroyed).
    Status capture_step(int64_t rows, const int32_t* offsets, bool feed_back, int64_t logit_rows,
                        const int32_t* logit_offs, cudaGraph_t* graph, cudaGraphExec_t* exec) {
        EDGE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        Status s = enqueue_step(rows, offsets, feed_back, logit_rows, logit_offs);
        cudaGraph_t g = nullptr;
        const cudaError_t end = cudaStreamEndCapture(stream, &g);
        if (!s.ok() || end != cudaSuccess) {
            if (g != nullptr) {
                check_cleanup(cudaGraphDestroy(g), "cudaGraphDestroy");
            }
            EDGE_RETURN_IF_ERROR(s);
            EDGE_CUDA_RETURN_IF_ERROR(end);
        }
        cudaGraphExec_t e = nullptr;
        const cudaError_t inst = cudaGraphInstantiate(&e, g, 0);
        if (inst != cudaSuccess) {
            // The caller captures again into the same slots next time: keep nothing here.
            check_cleanup(cudaGraphDestroy(g), "cudaGraphDestroy");
            EDGE_CUDA_RETURN_IF_ERROR(inst);
        }
        *graph = g;
        *exec = e;
        return ok_status();
    }

    ~Impl() {
        if (exec != nullptr) {
            check_cleanup(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
        }
        for (cudaGraphExec_t e : bucket_execs) {
            if (e != nullptr) {
                check_cleanup(cudaGraphExecDestroy(e), "cudaGraphExecDestroy");
            }
        }
        for (cudaGraph_t g : bucket_graphs) {
            if (g != nullptr) {
                check_cleanup(cudaGraphDestroy(g), "cudaGraphDestroy");
            }
        }
        if (graph != nullptr) {
            check_cleanup(cudaGraphDestroy(graph), "cudaGraphDestroy");
        }
        if (stream != nullptr) {
            check_cleanup(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
            check_cleanup(cudaStreamDestroy(stream), "cudaStreamDestroy");
        }
    }

    template <typename T>
    Result<T*> take(int64_t count, const char* what) {
        EDGE_ASSIGN_OR_RETURN(void* p, alloc->allocate(count * int64_t{sizeof(T)}, what));
        return static_cast<T*>(p);
    }

    Status fill_f32(float* p, int64_t n, float center, float spread) {
        const LaunchShape ls = plan_elementwise(n);
        fill_f32_kernel<<<ls.grid_x, ls.block, 0, stream>>>(p, n, seed + ++fills, center, spread);
        EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("fill");
        return ok_status();
    }

    // A rows x cols weight of `format` with random contents.
    Result<Weight> random_weight(WeightFormat format, int64_t rows, int64_t cols, float spread) {
        const int64_t data_bytes = quant::weight_data_bytes(format, rows, cols);
        const int64_t scales = quant::weight_scale_count(format, rows, cols);
        EDGE_ASSIGN_OR_RETURN(uint8_t* data, take<uint8_t>(data_bytes, "weight"));
        float* sc = nullptr;
        if (scales > 0) {
            EDGE_ASSIGN_OR_RETURN(sc, take<float>(scales, "weight scales"));
        }
        const LaunchShape ls = plan_elementwise(data_bytes);
        if (format == WeightFormat::kBF16) {
            fill_bf16_kernel<<<ls.grid_x, ls.block, 0, stream>>>(
                reinterpret_cast<uint16_t*>(data), rows * cols, seed + ++fills, spread);
        } else if (format == WeightFormat::kFP8E4M3Block128) {
            fill_bytes_kernel<<<ls.grid_x, ls.block, 0, stream>>>(data, data_bytes, seed + ++fills,
                                                                 0xBFu);
            EDGE_RETURN_IF_ERROR(fill_f32(sc, scales, spread, 0.0f));
        } else if (format == WeightFormat::kInt4G32) {
            fill_bytes_kernel<<<ls.grid_x, ls.block, 0, stream>>>(data, data_bytes, seed + ++fills,
                                                                 0xFFu);
            EDGE_RETURN_IF_ERROR(fill_f32(sc, scales, spread / 8.0f, 0.0f));
        } else {
            return invalid_argument_error(std::string("device decoder: expert format ") +
                                          quant::weight_format_name(format) +
                                          " (use bf16, fp8-block128 or int4-g32)");
        }
        EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("random weight");
        return Weight{format, rows, cols, data, sc};
    }

    Result<kernels::GroupedWeights> random_experts(int64_t rows, int64_t cols) {
        const int32_t E = s.experts;
        std::vector<const void*> data(E);
        std::vector<const float*> scales(E);
        const float spread = 1.0f / std::sqrt(static_cast<float>(cols));
        for (int32_t e = 0; e < E; ++e) {
            EDGE_ASSIGN_OR_RETURN(Weight w, random_weight(s.expert_format, rows, cols, spread));
            data[e] = w.data;
            scales[e] = w.scales;
        }
        return expert_tables(s.expert_format, rows, cols, data, scales);
    }

    Status dense(const Weight& w, const float* in, float* out) {
        return kernels::grouped_matmul(single_group(w), step_offsets, in, out, stream);
    }

    // Device arrays {data pointer, scales pointer} of each dense weight.
    std::vector<std::pair<const void*, const void* const*>> tables;
    const void* const* dense_tables(const Weight& w) {
        for (const auto& [data, table] : tables) {
            if (data == w.data) {
                return table;
            }
        }
        return nullptr;  // Never: every dense weight is registered at creation.
    }
    Status register_dense(const Weight& w) {
        EDGE_ASSIGN_OR_RETURN(const void** t, take<const void*>(2, "dense table"));
        const void* p[2] = {w.data, w.scales};
        EDGE_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(t, p, sizeof(p), cudaMemcpyHostToDevice, stream));
        EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        tables.emplace_back(w.data, t);
        dense_bytes += quant::weight_data_bytes(w.format, w.rows, w.cols) +
                       quant::weight_scale_count(w.format, w.rows, w.cols) * 4;
        return ok_status();
    }

    // A host weight (checkpoint view) copied to the device; its device view.
    Result<Weight> upload_weight(const Weight& w) {
        const int64_t data_bytes = quant::weight_data_bytes(w.format, w.rows, w.cols);
        const int64_t scales = quant::weight_scale_count(w.format, w.rows, w.cols);
        if (!cuda_matmul_supports(w.format) || data_bytes <= 0 || w.data == nullptr ||
            (scales > 0 && w.scales == nullptr)) {
            return invalid_argument_error(std::string("device decoder: cannot run a ") +
                                          quant::weight_format_name(w.format) + " weight of " +
                                          std::to_string(w.rows) + " x " +
                                          std::to_string(w.cols));
        }
        EDGE_ASSIGN_OR_RETURN(uint8_t* data, take<uint8_t>(data_bytes, "weight"));
        EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(data, w.data, static_cast<size_t>(data_bytes),
                                                  cudaMemcpyHostToDevice, stream));
        float* sc = nullptr;
        if (scales > 0) {
            EDGE_ASSIGN_OR_RETURN(sc, take<float>(scales, "weight scales"));
            EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sc, w.scales,
                                                      static_cast<size_t>(scales) * 4,
                                                      cudaMemcpyHostToDevice, stream));
        }
        return Weight{w.format, w.rows, w.cols, data, sc};
    }

    Result<Weight> upload_dense(const Weight& w) {
        EDGE_ASSIGN_OR_RETURN(Weight d, upload_weight(w));
        EDGE_RETURN_IF_ERROR(register_dense(d));
        return d;
    }

    // Null for an empty vector (an absent bias or norm).
    Result<float*> upload_optional(const std::vector<float>& v) {
        if (v.empty()) {
            return static_cast<float*>(nullptr);
        }
        return upload_floats(v);
    }

    Result<DenseMlp> upload_mlp(const CheckpointMlp& w) {
        DenseMlp d;
        EDGE_ASSIGN_OR_RETURN(d.gate, upload_dense(w.gate));
        EDGE_ASSIGN_OR_RETURN(d.up, upload_dense(w.up));
        EDGE_ASSIGN_OR_RETURN(d.down, upload_dense(w.down));
        return d;
    }

    Result<float*> upload_floats(const std::vector<float>& v) {
        EDGE_ASSIGN_OR_RETURN(float* d, take<float>(static_cast<int64_t>(v.size()), "norm"));
        EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, v.data(), v.size() * sizeof(float),
                                                  cudaMemcpyHostToDevice, stream));
        return d;
    }

    // The experts of one projection as one grouped weight (device tables of pointers).
    Result<kernels::GroupedWeights> upload_experts(const std::vector<Weight>& experts) {
        const int32_t E = static_cast<int32_t>(experts.size());
        std::vector<const void*> data(E);
        std::vector<const float*> scales(E);
        for (int32_t e = 0; e < E; ++e) {
            EDGE_ASSIGN_OR_RETURN(Weight w, upload_weight(experts[e]));
            data[e] = w.data;
            scales[e] = w.scales;
        }
        return expert_tables(experts[0].format, experts[0].rows, experts[0].cols, data, scales);
    }

    Result<kernels::GroupedWeights> expert_tables(WeightFormat format, int64_t rows, int64_t cols,
                                                  const std::vector<const void*>& data,
                                                  const std::vector<const float*>& scales) {
        const int32_t E = static_cast<int32_t>(data.size());
        EDGE_ASSIGN_OR_RETURN(const void** dd, take<const void*>(E, "expert table"));
        EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dd, data.data(), E * sizeof(void*),
                                                  cudaMemcpyHostToDevice, stream));
        kernels::GroupedWeights g;
        g.format = format;
        g.rows = rows;
        g.cols = cols;
        g.groups = E;
        g.data = dd;
        if (scales[0] != nullptr) {
            EDGE_ASSIGN_OR_RETURN(const float** ds, take<const float*>(E, "expert scales table"));
            EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ds, scales.data(), E * sizeof(float*),
                                                      cudaMemcpyHostToDevice, stream));
            g.scales = ds;
        }
        EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // The host tables die here.
        return g;
    }

    // Every tensor of `m` to the device (the shape was set from it).
    Status upload_model(const CheckpointModel& m) {
        EDGE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        EDGE_ASSIGN_OR_RETURN(embed, upload_weight(m.embed));
        if (m.lm_head.data == m.embed.data) {
            lm_head = embed;
            EDGE_RETURN_IF_ERROR(register_dense(lm_head));
        } else {
            EDGE_ASSIGN_OR_RETURN(lm_head, upload_dense(m.lm_head));
        }
        EDGE_ASSIGN_OR_RETURN(final_norm, upload_floats(m.final_norm));
        layers.resize(s.layers);
        for (int32_t l = 0; l < s.layers; ++l) {
            const CheckpointLayer& src = m.layer[static_cast<size_t>(l)];
            Layer& L = layers[l];
            EDGE_ASSIGN_OR_RETURN(L.in_norm, upload_floats(src.input_norm));
            EDGE_ASSIGN_OR_RETURN(L.post_norm, upload_floats(src.post_norm));
            switch (m.attention) {
                case AttentionKind::kGqa: {
                    EDGE_ASSIGN_OR_RETURN(L.q_norm, upload_optional(src.q_norm));
                    EDGE_ASSIGN_OR_RETURN(L.k_norm, upload_optional(src.k_norm));
                    EDGE_ASSIGN_OR_RETURN(L.q_bias, upload_optional(src.q_bias));
                    EDGE_ASSIGN_OR_RETURN(L.k_bias, upload_optional(src.k_bias));
                    EDGE_ASSIGN_OR_RETURN(L.v_bias, upload_optional(src.v_bias));
                    EDGE_ASSIGN_OR_RETURN(L.q, upload_dense(src.q));
                    EDGE_ASSIGN_OR_RETURN(L.k, upload_dense(src.k));
                    EDGE_ASSIGN_OR_RETURN(L.v, upload_dense(src.v));
                    EDGE_ASSIGN_OR_RETURN(L.o, upload_dense(src.o));
                    break;
                }
                case AttentionKind::kMla:
                    EDGE_RETURN_IF_ERROR(upload_mla(src.mla, &L));
                    break;
            }
            L.moe = src.moe;
            if (!src.moe) {
                EDGE_ASSIGN_OR_RETURN(L.dense, upload_mlp(src.dense));
                continue;
            }
            if (src.shared.present()) {
                EDGE_ASSIGN_OR_RETURN(L.shared, upload_mlp(src.shared));
            }
            EDGE_ASSIGN_OR_RETURN(L.router_bias, upload_optional(src.router_bias));
            EDGE_ASSIGN_OR_RETURN(L.router, upload_dense(src.router));
            EDGE_ASSIGN_OR_RETURN(L.gate, upload_experts(src.gate));
            EDGE_ASSIGN_OR_RETURN(L.up, upload_experts(src.up));
            EDGE_ASSIGN_OR_RETURN(L.down, upload_experts(src.down));
            EDGE_ASSIGN_OR_RETURN(L.offsets, take<int32_t>(s.experts + 1, "offsets"));
        }
        host_inv_freq = m.inv_freq;
        return build_buffers();
    }

    // A registered dense weight as a single-group GroupedWeights (dense matmuls, the MLA entry).
    kernels::GroupedWeights single_group(const Weight& w) {
        kernels::GroupedWeights g;
        g.format = w.format;
        g.rows = w.rows;
        g.cols = w.cols;
        g.groups = 1;
        const void* const* t = dense_tables(w);
        g.data = t;
        g.scales = w.scales != nullptr ? reinterpret_cast<const float* const*>(t + 1) : nullptr;
        return g;
    }

    // kMla attention weights of one layer (kv_b_proj as a plain view: the MLA kernels read it).
    Status upload_mla(const MlaLayerWeights& src, Layer* L) {
        if (src.q_a.data != nullptr) {
            EDGE_ASSIGN_OR_RETURN(Weight q_a, upload_dense(src.q_a));
            L->mla.q_a = single_group(q_a);
            EDGE_ASSIGN_OR_RETURN(float* n, upload_floats(src.q_a_norm));
            L->mla.q_a_norm = n;
        }
        EDGE_ASSIGN_OR_RETURN(Weight q, upload_dense(src.q));
        L->mla.q = single_group(q);
        EDGE_ASSIGN_OR_RETURN(Weight kv_a, upload_dense(src.kv_a));
        L->mla.kv_a = single_group(kv_a);
        EDGE_ASSIGN_OR_RETURN(float* kv_norm, upload_floats(src.kv_a_norm));
        L->mla.kv_a_norm = kv_norm;
        EDGE_ASSIGN_OR_RETURN(L->mla.kv_b, upload_weight(src.kv_b));
        dense_bytes += quant::weight_data_bytes(src.kv_b.format, src.kv_b.rows, src.kv_b.cols);
        EDGE_ASSIGN_OR_RETURN(L->o, upload_dense(src.o));
        return ok_status();
    }

    Result<Weight> random_dense(int64_t rows, int64_t cols) {
        EDGE_ASSIGN_OR_RETURN(Weight w, random_weight(WeightFormat::kBF16, rows, cols,
                                                      1.0f / std::sqrt(static_cast<float>(cols))));
        EDGE_RETURN_IF_ERROR(register_dense(w));
        return w;
    }

    Status build() {
        const int64_t H = s.hidden, E = s.experts, I = s.moe_inter;
        const int64_t hd = s.head_dim, qd = s.heads * hd, kvd = s.kv_heads * hd;
        EDGE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        EDGE_ASSIGN_OR_RETURN(embed, random_weight(WeightFormat::kBF16, s.vocab, H, 1.0f));
        EDGE_ASSIGN_OR_RETURN(lm_head, random_dense(s.vocab, H));
        EDGE_ASSIGN_OR_RETURN(final_norm, take<float>(H, "norm"));
        EDGE_RETURN_IF_ERROR(fill_f32(final_norm, H, 1.0f, 0.1f));
        layers.resize(s.layers);
        for (Layer& L : layers) {
            for (float** n : {&L.in_norm, &L.post_norm}) {
                EDGE_ASSIGN_OR_RETURN(*n, take<float>(H, "norm"));
                EDGE_RETURN_IF_ERROR(fill_f32(*n, H, 1.0f, 0.1f));
            }
            for (float** n : {&L.q_norm, &L.k_norm}) {
                EDGE_ASSIGN_OR_RETURN(*n, take<float>(hd, "norm"));
                EDGE_RETURN_IF_ERROR(fill_f32(*n, hd, 1.0f, 0.1f));
            }
            EDGE_ASSIGN_OR_RETURN(L.q, random_dense(qd, H));
            EDGE_ASSIGN_OR_RETURN(L.k, random_dense(kvd, H));
            EDGE_ASSIGN_OR_RETURN(L.v, random_dense(kvd, H));
            EDGE_ASSIGN_OR_RETURN(L.o, random_dense(H, qd));
            EDGE_ASSIGN_OR_RETURN(L.router, random_dense(E, H));
            EDGE_ASSIGN_OR_RETURN(L.gate, random_experts(I, H));
            EDGE_ASSIGN_OR_RETURN(L.up, random_experts(I, H));
            EDGE_ASSIGN_OR_RETURN(L.down, random_experts(H, I));
            EDGE_ASSIGN_OR_RETURN(L.offsets, take<int32_t>(E + 1, "offsets"));
        }
        return build_buffers();
    }

    // The KV cache, sequence state and activations (after the weights).
    Status build_buffers() {
        const int64_t B = s.batch, hd = s.head_dim;
        if (rot_dim <= 0) {
            rot_dim = s.head_dim;
        }
        std::vector<double> freq =
            host_inv_freq.empty() ? cpu::rope_inv_freq(1e6, rot_dim) : host_inv_freq;
        if (static_cast<int64_t>(freq.size()) != rot_dim / 2 || rot_dim > hd) {
            return invalid_argument_error("device decoder: " + std::to_string(freq.size()) +
                                          " RoPE frequencies for rot_dim " +
                                          std::to_string(rot_dim) + " of head_dim " +
                                          std::to_string(hd));
        }
        EDGE_ASSIGN_OR_RETURN(inv_freq, take<double>(rot_dim / 2, "rope"));
        EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(inv_freq, freq.data(),
                                                  rot_dim / 2 * sizeof(double),
                                                  cudaMemcpyHostToDevice, stream));
        max_blocks = serving ? serve.max_blocks_per_seq : kv_blocks_for(s.max_context);
        kv = PagedKvLayout{s.layers, s.kv_heads, s.head_dim,
                           serving ? serve.kv_blocks + 1 : static_cast<int32_t>(B) * max_blocks};
        EDGE_ASSIGN_OR_RETURN(pool, take<float>(kv.pool_floats(), "KV pool"));
        if (attention == AttentionKind::kMla) {
            // The latent pool: kv_heads 1 and head_dim half a latent row make `kv` its size.
            mla_kv = mla_latent_layout(mla, s.layers, kv.num_blocks);
            if (mla_kv.pool_floats() != kv.pool_floats()) {
                return invalid_argument_error("device decoder: the MLA pool does not match the "
                                              "KV layout (kv_heads 1, head_dim half a row)");
            }
        }
        if (zero_kv) {
            EDGE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
                pool, 0, static_cast<size_t>(kv.pool_floats()) * sizeof(float), stream));
        } else {
            EDGE_RETURN_IF_ERROR(fill_f32(pool, kv.pool_floats(), 0.0f, 1.0f));
        }
        if (serving) {
            EDGE_RETURN_IF_ERROR(build_serving_buffers());
        } else {
            EDGE_RETURN_IF_ERROR(build_batch_buffers());
        }
        return build_activations();
    }

    // Serving: the staging buffer holds the step's tokens, positions, sequences and block table
    // (uploaded by run_rows); {0, bucket} per bucket for the dense matmuls.
    Status build_serving_buffers() {
        layout = StepLayout{static_cast<int32_t>(s.batch), max_blocks, serve.max_logit_rows};
        EDGE_ASSIGN_OR_RETURN(buckets, row_buckets(layout.max_rows));
        EDGE_ASSIGN_OR_RETURN(staging, take<int32_t>(layout.total_ints(), "staging"));
        EDGE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
            staging, 0, static_cast<size_t>(layout.total_ints()) * sizeof(int32_t), stream));
        tokens = staging + layout.tokens_offset();
        positions = staging + layout.positions_offset();
        seq_ids = staging + layout.seqs_offset();
        logit_idx = staging + layout.logit_rows_offset();
        block_table = staging + layout.table_offset();
        EDGE_ASSIGN_OR_RETURN(logit_buckets, row_buckets(layout.max_logit_rows));
        std::vector<int32_t> off, logit_off;
        for (int32_t b : buckets) {
            off.push_back(0);
            off.push_back(b);
        }
        for (int32_t b : logit_buckets) {
            logit_off.push_back(0);
            logit_off.push_back(b);
        }
        EDGE_ASSIGN_OR_RETURN(bucket_offsets, take<int32_t>(static_cast<int64_t>(off.size()),
                                                            "bucket offsets"));
        EDGE_ASSIGN_OR_RETURN(logit_offsets,
                              take<int32_t>(static_cast<int64_t>(logit_off.size()),
                                            "logit bucket offsets"));
        EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bucket_offsets, off.data(),
                                                  off.size() * sizeof(int32_t),
                                                  cudaMemcpyHostToDevice, stream));
        EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logit_offsets, logit_off.data(),
                                                  logit_off.size() * sizeof(int32_t),
                                                  cudaMemcpyHostToDevice, stream));
        const size_t graphs = buckets.size() * (logit_buckets.size() + 1);
        bucket_graphs.assign(graphs, nullptr);
        bucket_execs.assign(graphs, nullptr);
        // `off` and `logit_off` die here.
        EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        return ok_status();
    }

    // The fixed batch: sequence b owns blocks [b * max_blocks, (b + 1) * max_blocks), every
    // sequence at the same position.
    Status build_batch_buffers() {
        const int64_t B = s.batch;
        EDGE_ASSIGN_OR_RETURN(block_table, take<int32_t>(B * max_blocks, "block table"));
        iota_kernel<<<64, 256, 0, stream>>>(block_table, static_cast<int32_t>(B) * max_blocks, 0);
        EDGE_ASSIGN_OR_RETURN(seq_ids, take<int32_t>(B, "sequences"));
        iota_kernel<<<1, 256, 0, stream>>>(seq_ids, static_cast<int32_t>(B), 0);
        EDGE_ASSIGN_OR_RETURN(positions, take<int32_t>(B, "positions"));
        fill_i32_kernel<<<1, 256, 0, stream>>>(positions, static_cast<int32_t>(B), s.context);
        EDGE_ASSIGN_OR_RETURN(tokens, take<int32_t>(B, "tokens"));
        if (zero_kv) {
            fill_i32_kernel<<<1, 256, 0, stream>>>(tokens, static_cast<int32_t>(B), 0);
        } else {
            iota_kernel<<<1, 256, 0, stream>>>(tokens, static_cast<int32_t>(B), 1);
        }
        EDGE_ASSIGN_OR_RETURN(dense_offsets, take<int32_t>(2, "offsets"));
        const int32_t off[2] = {0, static_cast<int32_t>(B)};
        EDGE_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dense_offsets, off, sizeof(off), cudaMemcpyHostToDevice, stream));
        EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("decoder setup");
        EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // `off` dies here.
        return ok_status();
    }

    // Activations for s.batch rows.
    Status build_activations() {
        const int64_t H = s.hidden, B = s.batch, E = s.experts, K = s.top_k, I = s.moe_inter;
        const int64_t hd = s.head_dim, qd = s.heads * hd, kvd = s.kv_heads * hd;
        for (float** b : {&x, &h, &o}) {
            EDGE_ASSIGN_OR_RETURN(*b, take<float>(B * H, "activations"));
        }
        EDGE_ASSIGN_OR_RETURN(q, take<float>(B * qd, "q"));
        EDGE_ASSIGN_OR_RETURN(attn, take<float>(B * qd, "attn"));
        EDGE_ASSIGN_OR_RETURN(k, take<float>(B * kvd, "k"));
        EDGE_ASSIGN_OR_RETURN(v, take<float>(B * kvd, "v"));
        EDGE_ASSIGN_OR_RETURN(router_logits, take<float>(B * E, "router"));
        EDGE_ASSIGN_OR_RETURN(topk_idx, take<int32_t>(B * K, "topk"));
        EDGE_ASSIGN_OR_RETURN(topk_w, take<float>(B * K, "topk"));
        EDGE_ASSIGN_OR_RETURN(row_of, take<int32_t>(B * K, "rows"));
        EDGE_ASSIGN_OR_RETURN(permuted, take<float>(B * K * H, "permuted"));
        EDGE_ASSIGN_OR_RETURN(down, take<float>(B * K * H, "expert out"));
        // The expert activations also hold the dense MLP's and the shared experts'.
        const int64_t inter = std::max(K * I, mlp_inter);
        for (float** b : {&gate, &up, &act}) {
            EDGE_ASSIGN_OR_RETURN(*b, take<float>(B * inter, "expert act"));
        }
        // Serving computes logits only for the rows gathered by the logit rows.
        const int64_t logit_rows = serving ? int64_t{serve.max_logit_rows} : B;
        EDGE_ASSIGN_OR_RETURN(logits, take<float>(logit_rows * s.vocab, "logits"));
        if (attention == AttentionKind::kMla) {
            EDGE_ASSIGN_OR_RETURN(mla_scratch, take<float>(mla_scratch_floats(mla, B), "mla"));
            EDGE_ASSIGN_OR_RETURN(mla_out,
                                  take<float>(B * s.heads * mla.v_head_dim, "mla out"));
        }
        position = s.context;
        EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        return ok_status();
    }

    // The checkpoint's rule, or softmax top-k for random weights (rule.experts still 0).
    RouterParams router_params() const {
        if (rule.experts > 0) {
            return rule;
        }
        RouterParams rp;
        rp.scoring = RouterScoring::kSoftmax;
        rp.experts = s.experts;
        rp.top_k = s.top_k;
        rp.norm_topk_prob = norm_topk_prob;
        return rp;
    }

    // x += down(silu(gate h) * up h) over `rows` rows (gate/up/act/o as scratch).
    Status mlp(const DenseMlp& w, int64_t rows) {
        EDGE_RETURN_IF_ERROR(dense(w.gate, h, gate));
        EDGE_RETURN_IF_ERROR(dense(w.up, h, up));
        EDGE_RETURN_IF_ERROR(kernels::silu_mul(gate, up, rows * w.gate.rows, act, stream));
        EDGE_RETURN_IF_ERROR(dense(w.down, act, o));
        return kernels::add_inplace(x, o, rows * s.hidden, stream);
    }

    // kGqa attention of layer li over `rows` rows: x += o(attention(rope(norm(qkv + bias)))).
    Status gqa_attention(int32_t li, int64_t rows) {
        const Layer& L = layers[li];
        const int64_t H = s.hidden, B = rows, hd = s.head_dim;
        const int64_t qd = s.heads * hd, kvd = s.kv_heads * hd;
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        EDGE_RETURN_IF_ERROR(kernels::rms_norm(x, L.in_norm, B, H, eps, h, stream));
        EDGE_RETURN_IF_ERROR(dense(L.q, h, q));
        EDGE_RETURN_IF_ERROR(dense(L.k, h, k));
        EDGE_RETURN_IF_ERROR(dense(L.v, h, v));
        if (L.q_bias != nullptr) {
            EDGE_RETURN_IF_ERROR(kernels::add_bias_rows(q, L.q_bias, B, qd, stream));
            EDGE_RETURN_IF_ERROR(kernels::add_bias_rows(k, L.k_bias, B, kvd, stream));
            EDGE_RETURN_IF_ERROR(kernels::add_bias_rows(v, L.v_bias, B, kvd, stream));
        }
        if (L.q_norm != nullptr) {
            EDGE_RETURN_IF_ERROR(kernels::rms_norm(q, L.q_norm, B * s.heads, hd, eps, q, stream));
            EDGE_RETURN_IF_ERROR(
                kernels::rms_norm(k, L.k_norm, B * s.kv_heads, hd, eps, k, stream));
        }
        EDGE_RETURN_IF_ERROR(kernels::rope(q, positions, B, s.heads, hd, rot_dim, inv_freq, true,
                                           rope_mscale, stream));
        EDGE_RETURN_IF_ERROR(kernels::rope(k, positions, B, s.kv_heads, hd, rot_dim, inv_freq,
                                           true, rope_mscale, stream));
        EDGE_RETURN_IF_ERROR(kernels::paged_kv_write(kv, li, k, v, seq_ids, positions, B,
                                                     block_table, max_blocks, pool, stream));
        EDGE_RETURN_IF_ERROR(kernels::paged_attention(kv, li, q, B, s.heads, seq_ids, positions,
                                                      block_table, max_blocks, pool, scale, attn,
                                                      stream));
        EDGE_RETURN_IF_ERROR(dense(L.o, attn, o));
        return kernels::add_inplace(x, o, B * H, stream);
    }

    // kMla attention of layer li over `rows` rows: x += o(kernels::mla_attention_layer(norm(x))).
    Status mla_attention(int32_t li, int64_t rows) {
        const Layer& L = layers[li];
        EDGE_RETURN_IF_ERROR(kernels::rms_norm(x, L.in_norm, rows, s.hidden, eps, h, stream));
        EDGE_RETURN_IF_ERROR(kernels::mla_attention_layer(
            L.mla, mla, mla_kv, li, h, rows, step_offsets, seq_ids, positions, block_table,
            max_blocks, inv_freq, pool, mla_scratch, mla_out, stream));
        EDGE_RETURN_IF_ERROR(dense(L.o, mla_out, o));
        return kernels::add_inplace(x, o, rows * s.hidden, stream);
    }

    // Enqueues one step of `rows` rows on `stream` (also what a graph captures); `offsets` is
    // {0, rows} on the device. `feed_back`: the final norm and LM head run on every row, the
    // argmax becomes the next input token and every position advances (the fixed batch); else
    // (serving) they run only on the `logit_rows` rows gathered by logit_idx (none when 0;
    // `logit_offs` is {0, logit_rows} on the device) and the compact logits are left for the
    // caller.
    Status enqueue_step(int64_t rows, const int32_t* offsets, bool feed_back, int64_t logit_rows,
                        const int32_t* logit_offs) {
        const int64_t H = s.hidden, B = rows, K = s.top_k, I = s.moe_inter;
        step_offsets = offsets;
        EDGE_RETURN_IF_ERROR(kernels::embedding(embed, tokens, B, x, stream));
        for (int32_t li = 0; li < s.layers; ++li) {
            const Layer& L = layers[li];
            switch (attention) {
                case AttentionKind::kGqa:
                    EDGE_RETURN_IF_ERROR(gqa_attention(li, B));
                    break;
                case AttentionKind::kMla:
                    EDGE_RETURN_IF_ERROR(mla_attention(li, B));
                    break;
            }
            EDGE_RETURN_IF_ERROR(kernels::rms_norm(x, L.post_norm, B, H, eps, h, stream));
            if (!L.moe) {
                EDGE_RETURN_IF_ERROR(mlp(L.dense, B));
                continue;
            }
            if (L.shared.present()) {
                EDGE_RETURN_IF_ERROR(mlp(L.shared, B));
            }
            EDGE_RETURN_IF_ERROR(dense(L.router, h, router_logits));
            EDGE_RETURN_IF_ERROR(kernels::route(router_logits, L.router_bias, router_params(), B,
                                                topk_idx, topk_w, stream));
            EDGE_RETURN_IF_ERROR(kernels::permute(topk_idx, B, s.top_k, s.experts, h, H,
                                                  L.offsets, row_of, permuted, stream));
            EDGE_RETURN_IF_ERROR(
                kernels::grouped_matmul(L.gate, L.offsets, permuted, gate, stream, B * K));
            EDGE_RETURN_IF_ERROR(
                kernels::grouped_matmul(L.up, L.offsets, permuted, up, stream, B * K));
            EDGE_RETURN_IF_ERROR(kernels::silu_mul(gate, up, B * K * I, act, stream));
            EDGE_RETURN_IF_ERROR(
                kernels::grouped_matmul(L.down, L.offsets, act, down, stream, B * K));
            EDGE_RETURN_IF_ERROR(
                kernels::unpermute(down, row_of, topk_w, B, s.top_k, H, true, x, stream));
        }
        if (!feed_back) {
            if (logit_rows == 0) {
                return ok_status();
            }
            EDGE_RETURN_IF_ERROR(kernels::gather_rows(x, logit_idx, logit_rows, H, o, stream));
            EDGE_RETURN_IF_ERROR(kernels::rms_norm(o, final_norm, logit_rows, H, eps, h, stream));
            step_offsets = logit_offs;
            return dense(lm_head, h, logits);
        }
        EDGE_RETURN_IF_ERROR(kernels::rms_norm(x, final_norm, B, H, eps, h, stream));
        EDGE_RETURN_IF_ERROR(dense(lm_head, h, logits));
        EDGE_RETURN_IF_ERROR(kernels::argmax(logits, B, s.vocab, tokens, stream));
        advance_kernel<<<static_cast<unsigned>((B + 255) / 256), 256, 0, stream>>>(
            positions, static_cast<int32_t>(B));
        EDGE_CUDA_RETURN_IF_LAUNCH_FAILED("advance");
        return ok_status();
    }

    // Bytes one step reads: dense weights, the experts the last step touched, and the KV cache.
    Result<int64_t> bytes_per_step() {
        const int64_t H = s.hidden, E = s.experts;
        const int64_t kvd = s.kv_heads * s.head_dim;
        int64_t bytes = dense_bytes + 4 * H * (2 * s.layers + 1);
        const int64_t expert = quant::weight_data_bytes(s.expert_format, s.moe_inter, H) * 3 +
                               quant::weight_scale_count(s.expert_format, s.moe_inter, H) * 12;
        std::vector<int32_t> offsets(E + 1);
        for (const Layer& L : layers) {
            if (!L.moe) {
                continue;  // A dense layer's MLP is in dense_bytes.
            }
            EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(offsets.data(), L.offsets,
                                                      (E + 1) * sizeof(int32_t),
                                                      cudaMemcpyDeviceToHost, stream));
            EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
            for (int64_t e = 0; e < E; ++e) {
                bytes += offsets[e + 1] > offsets[e] ? expert : 0;
            }
        }
        bytes += static_cast<int64_t>(s.batch) * s.layers * 2 * kvd * 4 * (position + 1);
        return bytes;
    }
};

DecoderShape bench_preset_shape(int32_t batch, WeightFormat expert_format) {
    DecoderShape s;  // The defaults are the bench preset.
    s.batch = batch;
    s.expert_format = expert_format;
    return s;
}

DeviceDecoder::DeviceDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceDecoder::~DeviceDecoder() = default;

Result<std::unique_ptr<DeviceDecoder>> DeviceDecoder::create(const DecoderShape& shape,
                                                             const DeviceMemoryConfig& memory,
                                                             uint64_t seed) {
    if (shape.batch <= 0 || shape.layers <= 0 || shape.top_k > shape.experts ||
        shape.heads % shape.kv_heads != 0 || shape.context >= shape.max_context ||
        shape.context < 0) {
        return invalid_argument_error("device decoder: inconsistent shape");
    }
    EDGE_RETURN_IF_ERROR(cuda_device_health());
    auto impl = std::make_unique<Impl>();
    impl->s = shape;
    impl->seed = seed;
    int device = 0;
    EDGE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    EDGE_ASSIGN_OR_RETURN(impl->alloc, DeviceAllocator::create(memory, device));
    EDGE_RETURN_IF_ERROR(impl->build());
    return std::unique_ptr<DeviceDecoder>(new DeviceDecoder(std::move(impl)));
}

Result<std::unique_ptr<DeviceDecoder>> DeviceDecoder::create_from_checkpoint(
    const std::string& dir, const CheckpointDecoderOptions& options,
    const DeviceMemoryConfig& memory) {
    EDGE_ASSIGN_OR_RETURN(CheckpointModel m, read_checkpoint_model(dir, options.quantization));
    return create_from_model(m, options, memory);
}

Result<std::unique_ptr<DeviceDecoder>> DeviceDecoder::create_from_model(
    const CheckpointModel& m, const CheckpointDecoderOptions& options,
    const DeviceMemoryConfig& memory) {
    if (options.batch <= 0 || options.context < 0 || options.context >= options.max_context ||
        options.max_context > m.max_position) {
        return invalid_argument_error(
            "device decoder: batch " + std::to_string(options.batch) + ", context " +
            std::to_string(options.context) + " and max_context " +
            std::to_string(options.max_context) + " must satisfy batch > 0 and 0 <= context < "
            "max_context <= max_position_embeddings (" + std::to_string(m.max_position) + ")");
    }
    EDGE_RETURN_IF_ERROR(cuda_device_health());
    auto impl = std::make_unique<Impl>();
    impl->take_model_shape(m, options.batch, options.context, options.max_context);
    int device = 0;
    EDGE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    EDGE_ASSIGN_OR_RETURN(impl->alloc, DeviceAllocator::create(memory, device));
    EDGE_RETURN_IF_ERROR(impl->upload_model(m));
    return std::unique_ptr<DeviceDecoder>(new DeviceDecoder(std::move(impl)));
}

Result<std::unique_ptr<DeviceDecoder>> DeviceDecoder::create_for_serving(
    const CheckpointModel& m, const ServingDecoderOptions& options,
    const DeviceMemoryConfig& memory) {
    if (options.max_rows <= 0 || options.kv_blocks <= 0 || options.max_blocks_per_seq <= 0 ||
        int64_t{options.max_blocks_per_seq} * kKvBlockTokens > int64_t{1} << 30 ||
        options.max_logit_rows <= 0 || options.max_logit_rows > options.max_rows) {
        return invalid_argument_error(
            "device decoder: serving needs max_rows, kv_blocks and max_blocks_per_seq > 0 and "
            "max_logit_rows in 1..max_rows (got " +
            std::to_string(options.max_rows) + ", " + std::to_string(options.kv_blocks) + ", " +
            std::to_string(options.max_blocks_per_seq) + ", " +
            std::to_string(options.max_logit_rows) + ")");
    }
    EDGE_RETURN_IF_ERROR(cuda_device_health());
    auto impl = std::make_unique<Impl>();
    impl->take_model_shape(m, options.max_rows, 0, options.max_blocks_per_seq * kKvBlockTokens);
    impl->serving = true;
    impl->serve = options;
    int device = 0;
    EDGE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    EDGE_ASSIGN_OR_RETURN(impl->alloc, DeviceAllocator::create(memory, device));
    EDGE_RETURN_IF_ERROR(impl->upload_model(m));
    return std::unique_ptr<DeviceDecoder>(new DeviceDecoder(std::move(impl)));
}

Status DeviceDecoder::copy_kv_blocks(std::span<const BlockMove> moves) {
    Impl& m = *impl_;
    if (!m.serving) {
        return failed_precondition_error("device decoder: copy_kv_blocks is for serving");
    }
    if (moves.empty()) {
        return ok_status();
    }
    EDGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.alloc->device()));
    const int64_t bytes = m.kv.block_floats() * static_cast<int64_t>(sizeof(float));
    for (const BlockMove& mv : moves) {
        if (mv.from < 0 || mv.from >= m.serve.kv_blocks || mv.to < 0 ||
            mv.to >= m.serve.kv_blocks) {
            return invalid_argument_error("device decoder: KV block move " +
                                          std::to_string(mv.from) + " -> " +
                                          std::to_string(mv.to) + " outside the pool's " +
                                          std::to_string(m.serve.kv_blocks) + " blocks");
        }
        for (int32_t l = 0; l < m.s.layers; ++l) {
            if (m.attention == AttentionKind::kMla) {
                // One latent row block per layer (the same bytes as a K and a V block).
                EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                    m.pool + m.mla_kv.row_offset(l, mv.to, 0),
                    m.pool + m.mla_kv.row_offset(l, mv.from, 0),
                    static_cast<size_t>(m.mla_kv.block_floats()) * sizeof(float),
                    cudaMemcpyDeviceToDevice, m.stream));
                continue;
            }
            for (int32_t which = 0; which < 2; ++which) {
                float* plane = m.pool + m.kv.plane_offset(l, which);
                EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                    plane + m.kv.row_offset(mv.to, 0, 0), plane + m.kv.row_offset(mv.from, 0, 0),
                    static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, m.stream));
            }
        }
    }
    return ok_status();
}

Status DeviceDecoder::run_rows(int32_t bucket, int32_t logit_bucket,
                              std::span<const int32_t> staging) {
    Impl& m = *impl_;
    if (!m.serving) {
        return failed_precondition_error("device decoder: run_rows is for serving");
    }
    EDGE_RETURN_IF_ERROR(cuda_device_health());
    // The scheduler's thread drives serving, not the one that loaded it.
    EDGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(m.alloc->device()));
    const auto it = std::find(m.buckets.begin(), m.buckets.end(), bucket);
    if (it == m.buckets.end()) {
        return invalid_argument_error("device decoder: " + std::to_string(bucket) +
                                      " rows is not a bucket");
    }
    size_t j = 0;  // 0: no logits; else 1 + the logit bucket's index.
    if (logit_bucket != 0) {
        const auto lit = std::find(m.logit_buckets.begin(), m.logit_buckets.end(), logit_bucket);
        if (lit == m.logit_buckets.end()) {
            return invalid_argument_error("device decoder: " + std::to_string(logit_bucket) +
                                          " logits rows is not a logit bucket");
        }
        j = 1 + static_cast<size_t>(lit - m.logit_buckets.begin());
    }
    EDGE_RETURN_IF_ERROR(
        check_staging(m.layout, staging, bucket, logit_bucket, m.s.vocab, m.kv.num_blocks));
    const size_t b = static_cast<size_t>(it - m.buckets.begin());
    const size_t g = b * (m.logit_buckets.size() + 1) + j;
    EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.staging, staging.data(), staging.size_bytes(),
                                              cudaMemcpyHostToDevice, m.stream));
    m.last_logit_rows = 0;
    if (m.bucket_execs[g] == nullptr) {
        EDGE_RETURN_IF_ERROR(m.capture_step(bucket, m.bucket_offsets + 2 * b, false, logit_bucket,
                                            j == 0 ? nullptr : m.logit_offsets + 2 * (j - 1),
                                            &m.bucket_graphs[g], &m.bucket_execs[g]));
    }
    EDGE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(m.bucket_execs[g], m.stream));
    m.last_logit_rows = logit_bucket;
    return ok_status();
}

Status DeviceDecoder::copy_logits(std::span<const RowRun> runs, float* out) {
    Impl& m = *impl_;
    const int64_t V = m.s.vocab;
    for (const RowRun& r : runs) {
        if (r.first_row < 0 || r.rows <= 0 || r.first_row + r.rows > m.last_logit_rows ||
            r.out_row < 0) {
            return invalid_argument_error("device decoder: logits rows " +
                                          std::to_string(r.first_row) + ".." +
                                          std::to_string(r.first_row + r.rows - 1) +
                                          " outside the last step's " +
                                          std::to_string(m.last_logit_rows) + " logits rows");
        }
        EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
            out + r.out_row * V, m.logits + int64_t{r.first_row} * V,
            static_cast<size_t>(int64_t{r.rows} * V) * sizeof(float), cudaMemcpyDeviceToHost,
            m.stream));
    }
    EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.stream));
    return ok_status();
}

const DecoderShape& DeviceDecoder::shape() const { return impl_->s; }

Status DeviceDecoder::set_tokens(std::span<const int32_t> tokens) {
    Impl& m = *impl_;
    if (m.serving) {
        return failed_precondition_error("device decoder: a serving decoder runs run_rows()");
    }
    if (tokens.size() != static_cast<size_t>(m.s.batch)) {
        return invalid_argument_error("device decoder: " + std::to_string(tokens.size()) +
                                      " tokens for a batch of " + std::to_string(m.s.batch));
    }
    for (int32_t t : tokens) {
        if (t < 0 || t >= m.s.vocab) {
            return invalid_argument_error("device decoder: token " + std::to_string(t) +
                                          " is outside the vocabulary of " +
                                          std::to_string(m.s.vocab));
        }
    }
    EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.tokens, tokens.data(), tokens.size_bytes(),
                                              cudaMemcpyHostToDevice, m.stream));
    EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.stream));
    return ok_status();
}

Status DeviceDecoder::step() {
    Impl& m = *impl_;
    if (m.serving) {
        return failed_precondition_error("device decoder: a serving decoder runs run_rows()");
    }
    if (m.position + 1 >= m.s.max_context) {
        return out_of_range_error("device decoder: sequences are at max_context");
    }
    EDGE_RETURN_IF_ERROR(m.enqueue_step(m.s.batch, m.dense_offsets, true, 0, nullptr));
    EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.stream));
    ++m.position;
    return ok_status();
}

Result<DecodeStepStats> DeviceDecoder::run_graph(int32_t steps) {
    Impl& m = *impl_;
    if (m.serving) {
        return failed_precondition_error("device decoder: a serving decoder runs run_rows()");
    }
    if (steps <= 0 || m.position + steps >= m.s.max_context) {
        return out_of_range_error("device decoder: " + std::to_string(steps) +
                                  " steps from position " + std::to_string(m.position) +
                                  " pass max_context " + std::to_string(m.s.max_context));
    }
    if (m.exec == nullptr) {
        EDGE_RETURN_IF_ERROR(
            m.capture_step(m.s.batch, m.dense_offsets, true, 0, nullptr, &m.graph, &m.exec));
    }
    cudaEvent_t start = nullptr, stop = nullptr;
    Status st;
    // Records the first failure; later calls are skipped once one failed.
    auto check = [&st](cudaError_t e, const char* call) {
        if (st.ok() && e != cudaSuccess) {
            st = cuda_error_status(e, call, __FILE__, __LINE__);
        }
        return st.ok();
    };
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    std::vector<double> times;
    for (int32_t i = 0; i < steps && st.ok(); ++i) {
        float ms = 0.0f;
        if (check(cudaEventRecord(start, m.stream), "cudaEventRecord") &&
            check(cudaGraphLaunch(m.exec, m.stream), "cudaGraphLaunch") &&
            check(cudaEventRecord(stop, m.stream), "cudaEventRecord") &&
            check(cudaEventSynchronize(stop), "cudaEventSynchronize") &&
            check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime")) {
            ++m.position;
            times.push_back(ms / 1000.0);
        }
    }
    if (start != nullptr) {
        check_cleanup(cudaEventDestroy(start), "cudaEventDestroy");
    }
    if (stop != nullptr) {
        check_cleanup(cudaEventDestroy(stop), "cudaEventDestroy");
    }
    EDGE_RETURN_IF_ERROR(st);
    std::sort(times.begin(), times.end());
    DecodeStepStats stats;
    stats.seconds_per_step = times[times.size() / 2];
    EDGE_ASSIGN_OR_RETURN(stats.bytes_per_step, m.bytes_per_step());
    return stats;
}

Result<std::vector<int32_t>> DeviceDecoder::last_tokens() {
    Impl& m = *impl_;
    std::vector<int32_t> out(m.s.batch);
    EDGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), m.tokens, out.size() * sizeof(int32_t),
                                              cudaMemcpyDeviceToHost, m.stream));
    EDGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.stream));
    return out;
}

Result<double> DeviceDecoder::measure_copy_bandwidth(int64_t bytes, int32_t repeats) {
    if (bytes <= 0 || repeats <= 0) {
        return invalid_argument_error("copy bandwidth: bytes and repeats must be > 0");
    }
    void* a = nullptr;
    void* b = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    Status st;
    auto check = [&st](cudaError_t e, const char* call) {
        if (st.ok() && e != cudaSuccess) {
            st = cuda_error_status(e, call, __FILE__, __LINE__);
        }
        return st.ok();
    };
    check(cudaMalloc(&a, static_cast<size_t>(bytes)), "cudaMalloc");
    check(cudaMalloc(&b, static_cast<size_t>(bytes)), "cudaMalloc");
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    std::vector<double> times;
    for (int32_t i = 0; i < repeats + 1 && st.ok(); ++i) {
        float ms = 0.0f;
        if (check(cudaEventRecord(start), "cudaEventRecord") &&
            check(cudaMemcpyAsync(b, a, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice),
                  "cudaMemcpyAsync") &&
            check(cudaEventRecord(stop), "cudaEventRecord") &&
            check(cudaEventSynchronize(stop), "cudaEventSynchronize") &&
            check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime") && i > 0) {
            times.push_back(ms / 1000.0);  // The first copy only warms up.
        }
    }
    for (cudaEvent_t e : {start, stop}) {
        if (e != nullptr) {
            check_cleanup(cudaEventDestroy(e), "cudaEventDestroy");
        }
    }
    for (void* p : {a, b}) {
        if (p != nullptr) {
            check_cleanup(cudaFree(p), "cudaFree");
        }
    }
    EDGE_RETURN_IF_ERROR(st);
    std::sort(times.begin(), times.end());
    return 2.0 * static_cast<double>(bytes) / times[times.size() / 2];
}

}  // namespace edge::engine::cuda
