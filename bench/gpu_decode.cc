// GPU decode benchmark: whole decode steps on one GPU (engine/cuda/device_decoder.h), every op on
// the device, each step replayed as a CUDA graph, for BF16, FP8 block-128 and INT4 group-32
// experts, single-stream and 64 streams. With --model DIR (a checkpoint of make-model's `bench`
// preset: Qwen3-MoE, hidden 1024, 12 layers, 64 experts top-8, expert width 512, 16/4 heads of
// 64, vocab 32000) the real weights are read once per format (FP8 and INT4 quantized on load,
// as `engine.models[].quantization` would) and uploaded; without it, random weights of the same
// shape are generated on the device. The limit is the GPU's own memory bandwidth, measured in
// the same run with a device-to-device copy (bytes read + written per second); a step's figure is
// the weight and KV bytes it reads (only the experts it routed to) per second, as a fraction of
// that.
//
// Usage: bench_gpu_decode [--model DIR] [--steps N] [--context N] [--streams 1|64]
// Prints a table, then one JSON line. Without a CUDA build or a GPU it says so and exits 2.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_cli.h"

#if defined(EDGE_HAVE_CUDA)
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/device_decoder.h"
#include "engine/cuda/host/checkpoint_model.h"
#include "engine/quant/quantized_weight.h"
#endif

int main(int argc, char** argv) {
    int steps = 32;
    int context = 256;
    int only_streams = 0;
    std::string model_dir;
    edge::bench::parse_flags(
        argc, argv,
        {edge::bench::Flag::string("--model", &model_dir,
                                   "checkpoint of make-model's bench preset whose weights are "
                                   "timed (default: random weights of that shape)"),
         edge::bench::Flag::integer("--steps", &steps, 4, "replayed decode steps"),
         edge::bench::Flag::integer("--context", &context, 1, "positions each stream starts at"),
         edge::bench::Flag::integer("--streams", &only_streams, 0, 64,
                                    "run only this many streams, 1 or 64 (0: both; a profiler "
                                    "then sees one shape's kernels)")},
        "bench_gpu_decode: whole-step CUDA-graph decode against device copy bandwidth");
    if (only_streams != 0 && only_streams != 1 && only_streams != 64) {
        edge::bench::usage_error(argv[0], "--streams takes 1 or 64 (or 0 for both)");
    }
#if !defined(EDGE_HAVE_CUDA)
    (void)steps;
    (void)context;
    (void)only_streams;
    std::printf("bench_gpu_decode: built without CUDA (no nvcc at configure time)\n");
    std::printf("{\"bench\":\"gpu_decode\",\"skipped\":\"built without CUDA\"}\n");
    return 2;
#else
    namespace ec = edge::engine::cuda;
    using edge::engine::WeightFormat;
    if (ec::cuda_device_count() == 0) {
        std::printf("bench_gpu_decode: no CUDA device visible\n");
        std::printf("{\"bench\":\"gpu_decode\",\"skipped\":\"no CUDA device\"}\n");
        return 2;
    }
    auto copy_bw = ec::DeviceDecoder::measure_copy_bandwidth(int64_t{2} << 30, 10);
    if (!copy_bw.ok()) {
        std::fprintf(stderr, "%s\n", copy_bw.status().to_string().c_str());
        return 1;
    }
    struct Row {
        std::string format;
        int streams;
        double tps, gbps, fraction, ms;
        long long bytes;
    };
    std::vector<Row> rows;
    struct Variant {
        WeightFormat format;
        const char* policy;  // Quantize-on-load policy for the checkpoint's BF16 experts.
    };
    const Variant variants[] = {{WeightFormat::kBF16, "none"},
                                {WeightFormat::kFP8E4M3Block128, "routed_experts=fp8"},
                                {WeightFormat::kInt4G32, "experts-int4"}};
    // The three reads (FP8 and INT4 quantize every expert on the CPU) run at once, while the
    // GPU measures the first format.
    std::vector<std::future<edge::Result<ec::CheckpointModel>>> reads;
    if (!model_dir.empty()) {
        for (const Variant& v : variants) {
            reads.push_back(std::async(std::launch::async, [&model_dir, policy = v.policy] {
                return ec::read_checkpoint_model(model_dir, policy);
            }));
        }
    }
    for (size_t vi = 0; vi < std::size(variants); ++vi) {
        const Variant& v = variants[vi];
        std::optional<ec::CheckpointModel> model;
        if (!model_dir.empty()) {
            auto m = reads[vi].get();
            if (!m.ok()) {
                std::fprintf(stderr, "%s\n", m.status().to_string().c_str());
                return 1;
            }
            if (m->expert_format != v.format) {
                std::fprintf(stderr, "%s: experts are %s after policy %s, expected %s\n",
                             model_dir.c_str(),
                             edge::engine::quant::weight_format_name(m->expert_format), v.policy,
                             edge::engine::quant::weight_format_name(v.format));
                return 1;
            }
            model = std::move(m).value();
        }
        for (int streams : {1, 64}) {
            if (only_streams != 0 && streams != only_streams) {
                continue;
            }
            ec::DeviceMemoryConfig memory;
            memory.free_fraction = 0.6;
            edge::Result<std::unique_ptr<ec::DeviceDecoder>> dec =
                edge::not_found_error("no decoder");
            if (model) {
                ec::CheckpointDecoderOptions o;
                o.batch = streams;
                o.context = context;
                o.max_context = context + 2 * steps + 64;
                dec = ec::DeviceDecoder::create_from_model(*model, o, memory);
            } else {
                ec::DecoderShape shape = ec::bench_preset_shape(streams, v.format);
                shape.context = context;
                shape.max_context = context + 2 * steps + 64;
                dec = ec::DeviceDecoder::create(shape, memory, 1);
            }
            if (!dec.ok()) {
                std::fprintf(stderr, "%s\n", dec.status().to_string().c_str());
                return 1;
            }
            auto warm = (*dec)->run_graph(steps / 2);  // Capture, then warm caches and clocks.
            auto stats = warm.ok() ? (*dec)->run_graph(steps) : warm;
            if (!stats.ok()) {
                std::fprintf(stderr, "%s\n", stats.status().to_string().c_str());
                return 1;
            }
            const double s = stats->seconds_per_step;
            const double gbps = static_cast<double>(stats->bytes_per_step) / s;
            rows.push_back({edge::engine::quant::weight_format_name(v.format), streams,
                            streams / s, gbps / 1e9, gbps / *copy_bw, s * 1e3,
                            static_cast<long long>(stats->bytes_per_step)});
        }
    }
    std::printf("weights: %s\n", model_dir.empty() ? "random (bench preset shape)"
                                                   : ("checkpoint " + model_dir).c_str());
    std::printf("device-to-device copy bandwidth: %.1f GB/s (read + write)\n", *copy_bw / 1e9);
    std::printf("%-14s %8s %12s %10s %12s %10s %10s\n", "experts", "streams", "tokens/s",
                "ms/step", "MB/step", "GB/s", "of copy bw");
    for (const Row& r : rows) {
        std::printf("%-14s %8d %12.1f %10.3f %12.1f %10.1f %10.3f\n", r.format.c_str(), r.streams,
                    r.tps, r.ms, r.bytes / 1e6, r.gbps, r.fraction);
    }
    std::string json = "{\"bench\":\"gpu_decode\",\"copy_gbps\":" +
                       std::to_string(*copy_bw / 1e9) + ",\"steps\":" + std::to_string(steps) +
                       ",\"weights\":\"" + (model_dir.empty() ? "random" : "checkpoint") + "\"";
    for (const Row& r : rows) {
        const std::string key = r.format + "_" + std::to_string(r.streams);
        json += ",\"" + key + "_tps\":" + std::to_string(r.tps) + ",\"" + key +
                "_bw_fraction\":" + std::to_string(r.fraction);
    }
    json += "}";
    std::printf("%s\n", json.c_str());
    return 0;
#endif
}
