// GPU serving benchmark: decode through the engine's CausalLM on the device
// (engine/cuda/device_causal_lm.h), what `engine.backend: cuda` serves, against the bare
// whole-step decoder (engine/cuda/device_decoder.h: one CUDA graph per step, argmax fed back on
// the device) on the same checkpoint in the same run. The serving path adds per step: the host
// KV bookkeeping and row planning, one staging upload, the bucket's graph, the logits copied back
// and the argmax on the host (the engine's sampler sees the logits). Its figure is the ratio of
// its decode tokens/s to the bare decoder's (1.0: no overhead), single-stream and 64 streams,
// each after a prefill of --context tokens per stream (which runs through the device's prefill
// rows, several steps per batch).
//
// Usage: bench_gpu_serving --model DIR [--steps N] [--context N] [--quantization POLICY]
// DIR: any checkpoint the whole-step device forward runs (engine/cuda/host/checkpoint_model.h:
// Qwen3-MoE, GLM-4.5).
// Prints a table, then one JSON line. Without a CUDA build, a GPU or --model it says so and
// exits 2.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_cli.h"

#if defined(EDGE_HAVE_CUDA)
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/device_causal_lm.h"
#include "engine/cuda/device_decoder.h"
#include "engine/cuda/host/checkpoint_model.h"
#include "engine/model/loader.h"
#endif

int main(int argc, char** argv) {
    int steps = 32;
    int context = 256;
    std::string model_dir;
    std::string quantization = "none";
    edge::bench::parse_flags(
        argc, argv,
        {edge::bench::Flag::string("--model", &model_dir,
                                   "Qwen3-MoE or GLM-4.5 checkpoint (required)"),
         edge::bench::Flag::integer("--steps", &steps, 4, "timed decode steps"),
         edge::bench::Flag::integer("--context", &context, 1, "prompt tokens per stream"),
         edge::bench::Flag::string("--quantization", &quantization,
                                   "quantize-on-load policy (engine/quant/policy.h)")},
        "bench_gpu_serving: decode through the device CausalLM vs the bare graph decoder");
#if !defined(EDGE_HAVE_CUDA)
    (void)steps;
    (void)context;
    std::printf("bench_gpu_serving: built without CUDA (no nvcc at configure time)\n");
    std::printf("{\"bench\":\"gpu_serving\",\"skipped\":\"built without CUDA\"}\n");
    return 2;
#else
    namespace ec = edge::engine::cuda;
    using edge::engine::SequenceChunk;
    using edge::engine::TokenId;
    if (ec::cuda_device_count() == 0 || model_dir.empty()) {
        const char* why = model_dir.empty() ? "no --model" : "no CUDA device";
        std::printf("bench_gpu_serving: %s\n", why);
        std::printf("{\"bench\":\"gpu_serving\",\"skipped\":\"%s\"}\n", why);
        return 2;
    }
    auto model = ec::read_checkpoint_model(model_dir, quantization);
    if (!model.ok()) {
        std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
        return 1;
    }
    const int32_t vocab = model->vocab;
    struct Row {
        int streams;
        double serving_tps, graph_tps;
    };
    std::vector<Row> rows;
    for (int streams : {1, 64}) {
        // The limit: the bare decoder, its graph replayed with the argmax fed back on the device.
        double graph_tps = 0.0;
        {
            ec::CheckpointDecoderOptions o;
            o.batch = streams;
            o.context = context;
            o.max_context = context + 2 * steps + 64;
            ec::DeviceMemoryConfig memory;
            memory.free_fraction = 0.5;
            auto dec = ec::DeviceDecoder::create_from_model(*model, o, memory);
            if (!dec.ok()) {
                std::fprintf(stderr, "%s\n", dec.status().to_string().c_str());
                return 1;
            }
            auto stats = (*dec)->run_graph(steps / 2);  // Capture, then warm caches and clocks.
            if (stats.ok()) {
                stats = (*dec)->run_graph(steps);
            }
            if (!stats.ok()) {
                std::fprintf(stderr, "%s\n", stats.status().to_string().c_str());
                return 1;
            }
            graph_tps = streams / stats->seconds_per_step;
        }
        edge::engine::LoadOptions lo;
        lo.backend = "cuda";
        lo.max_slots = streams;
        lo.max_context = context + 2 * steps + 64;
        lo.kv_cache_bytes = 0;  // Every slot's whole context.
        lo.quantization = quantization;
        auto lm = ec::load_device_causal_lm(model_dir, lo);
        if (!lm.ok()) {
            std::fprintf(stderr, "%s\n", lm.status().to_string().c_str());
            return 1;
        }
        edge::engine::CausalLM& m = **lm;
        std::vector<int32_t> slots;
        std::vector<std::vector<TokenId> > prompts(static_cast<size_t>(streams));
        std::vector<SequenceChunk> batch;
        for (int s = 0; s < streams; ++s) {
            slots.push_back(*m.acquire_slot());
            for (int i = 0; i < context; ++i) {
                prompts[static_cast<size_t>(s)].push_back((s * 131 + i * 7 + 1) % vocab);
            }
            batch.push_back(SequenceChunk{slots.back(), 0, prompts[static_cast<size_t>(s)], false});
        }
        std::vector<float> logits;
        edge::Status st = m.forward(batch, &logits);
        std::vector<std::vector<TokenId> > next(static_cast<size_t>(streams));
        std::vector<double> times;
        for (int step = 0; st.ok() && step < steps + steps / 2; ++step) {
            // The host argmax over the last logits is part of the serving path (see the header),
            // so the step's time starts before it, not at the forward.
            const auto t0 = std::chrono::steady_clock::now();
            batch.clear();
            for (int s = 0; s < streams; ++s) {
                const auto row = logits.begin() + static_cast<int64_t>(s) * vocab;
                next[static_cast<size_t>(s)] = {
                    static_cast<TokenId>(std::max_element(row, row + vocab) - row)};
                batch.push_back(SequenceChunk{slots[static_cast<size_t>(s)],
                                              m.slot_length(slots[static_cast<size_t>(s)]),
                                              next[static_cast<size_t>(s)], false});
            }
            st = m.forward(batch, &logits);
            const auto t1 = std::chrono::steady_clock::now();
            if (step >= steps / 2) {  // The first half captures the graph and warms up.
                times.push_back(std::chrono::duration<double>(t1 - t0).count());
            }
        }
        if (!st.ok()) {
            std::fprintf(stderr, "%s\n", st.to_string().c_str());
            return 1;
        }
        std::sort(times.begin(), times.end());
        rows.push_back({streams, streams / times[times.size() / 2], graph_tps});
    }
    std::printf("checkpoint %s, quantization %s, context %d, %d timed steps (medians)\n",
                model_dir.c_str(), quantization.c_str(), context, steps);
    std::printf("%8s %16s %16s %10s\n", "streams", "serving tok/s", "graph tok/s", "ratio");
    std::string json = "{\"bench\":\"gpu_serving\",\"quantization\":\"" + quantization +
                       "\",\"context\":" + std::to_string(context) +
                       ",\"steps\":" + std::to_string(steps);
    for (const Row& r : rows) {
        std::printf("%8d %16.1f %16.1f %10.3f\n", r.streams, r.serving_tps, r.graph_tps,
                    r.serving_tps / r.graph_tps);
        const std::string key = "streams_" + std::to_string(r.streams);
        json += ",\"" + key + "_serving_tps\":" + std::to_string(r.serving_tps) + ",\"" + key +
                "_graph_tps\":" + std::to_string(r.graph_tps) + ",\"" + key +
                "_ratio\":" + std::to_string(r.serving_tps / r.graph_tps);
    }
    json += "}";
    std::printf("%s\n", json.c_str());
    return 0;
#endif
}
