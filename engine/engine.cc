#include "engine/engine.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include "common/clock.h"
#include "common/log.h"
#include "engine/backend.h"
#if defined(EDGE_HAVE_CUDA)
#include "engine/cuda/device_causal_lm.h"
#include "engine/cuda/host/serving_plan.h"
#endif
#include "engine/model/loader.h"
#include "engine/model/model_config.h"
#include "engine/sched/local_generator.h"
#include "engine/tokenizer/tiktoken.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_config.h"

namespace edge::engine {

namespace {

// The model on the backend: with "cuda", every op of a step on the device
// (engine/cuda/device_causal_lm.h) when the device forward runs the model, else (logged) the
// engine's own forward with the CUDA backend's matmuls. `*cuda_arena_held`: an earlier model
// runs the engine's forward on the CUDA backend, whose device arena (shared by every CUDA
// backend of the process, cuda_backend.h) it holds while it lives; set when this one does too.
Result<std::unique_ptr<CausalLM>> load_causal_lm(const ModelConfig& mc, const LoadOptions& options,
                                                 bool* cuda_arena_held) {
#if defined(EDGE_HAVE_CUDA)
    if (options.backend == "cuda") {
        auto device = cuda::load_device_causal_lm(mc.path, options);
        switch (cuda::serving_path_after(device.status())) {
            case cuda::ServingPath::kDevice:
                log::info("engine.device_forward", {{"model", mc.name}, {"path", mc.path}});
                return std::move(device).value();
            case cuda::ServingPath::kFallback:
                log::warn("engine.device_forward_fallback",
                          {{"model", mc.name},
                           {"path", mc.path},
                           {"reason", device.status().message()},
                           {"running", "the engine's forward with the cuda backend's matmuls"}});
                break;
            case cuda::ServingPath::kFail:
                return cuda::device_load_failure(device.status(), *cuda_arena_held);
        }
    }
#endif
    auto model = load_model(mc.path, options);
    if (model.ok() && options.backend == "cuda") {
        *cuda_arena_held = true;
    }
    return model;
}

// `row_tiles` false: quantized matrices stay mapped as stored (no copy into CPU row tiles).
Result<sched::ServedModel> load_served_model(const ModelConfig& mc, const EngineConfig& config,
                                             const std::string& backend, bool* cuda_arena_held,
                                             bool row_tiles = true) {
    sched::ServedModel m;
    m.config = mc;
    std::error_code ec;
    if (!std::filesystem::is_directory(mc.path, ec)) {
        return not_found_error(mc.path + ": not a directory (a checkpoint is a directory with "
                                         "config.json, *.safetensors and a tokenizer)");
    }
    if (!std::filesystem::exists(mc.path + "/config.json", ec)) {
        // Before the tokenizer, whose absence would otherwise be reported first.
        return not_found_error(mc.path + "/config.json: cannot open (not a checkpoint, or one "
                                         "whose writing was interrupted)");
    }
    EDGE_ASSIGN_OR_RETURN(m.tokenizer, tokenizer::load_checkpoint_tokenizer(mc.path));
    EDGE_ASSIGN_OR_RETURN(m.tokenizer_config, tokenizer::load_tokenizer_config(mc.path));
    LoadOptions options;
    options.threads = config.threads;
    options.backend = backend;
    options.activation_precision = config.activation_precision;
    options.cpu_kernels = config.cpu_kernels;
    options.max_slots = config.max_batch_sequences;
    options.max_context = static_cast<int32_t>(std::max<int64_t>(mc.max_context, 0));
    options.kv_cache_bytes = config.kv_cache_bytes;
    options.kv_block_tokens = config.kv_block_tokens;
    options.quantization = mc.quantization;
    options.row_tiles = row_tiles;
    options.sharding = config.sharding;
    EDGE_ASSIGN_OR_RETURN(m.model, load_causal_lm(mc, options, cuda_arena_held));
    if (m.model->spec().vocab_size < m.tokenizer->vocab_size()) {
        return invalid_argument_error(
            "tokenizer.json has " + std::to_string(m.tokenizer->vocab_size()) +
            " tokens but the model's vocab_size is " + std::to_string(m.model->spec().vocab_size));
    }
    m.created_unix = SystemClock::instance().wall_now_us() / 1'000'000;
    return m;
}

}  // namespace

Status check_checkpoint_loads(const std::string& dir) {
    ModelConfig mc;
    mc.name = "check";
    mc.path = dir;
    // A small context keeps the check's KV cache small; never past the model's own positions,
    // which would be refused (a tiny test model may have fewer than 16).
    mc.max_context = 16;
    if (Result<ConfigJson> json = ConfigJson::read(dir); json.ok()) {
        if (Result<int64_t> positions = json->get_int("max_position_embeddings", 16);
            positions.ok() && *positions > 0) {
            mc.max_context = std::min<int64_t>(mc.max_context, *positions);
        }
    }
    EngineConfig config;
    config.threads = 1;
    config.max_batch_sequences = 1;
    // Mapped as stored: the check costs no copy of a model that may be larger than this
    // machine's memory.
    bool cuda_arena_held = false;
    return load_served_model(mc, config, "cpu", &cuda_arena_held, false).status();
}

Result<std::unique_ptr<Generator>> create_engine(const EngineConfig& config) {
    EDGE_ASSIGN_OR_RETURN(const std::string backend, resolve_backend(config.backend));
    std::vector<sched::ServedModel> served;
    // The models loaded so far live in `served` until the engine goes, and with them any CUDA
    // backend's arena.
    bool cuda_arena_held = false;
    for (const ModelConfig& mc : config.models) {
        auto m = load_served_model(mc, config, backend, &cuda_arena_held);
        if (!m.ok()) {
            return m.status().with_context("model \"" + mc.name + "\" (" + mc.path + ")");
        }
        served.push_back(std::move(m).value());
    }
    // Requests without a seed draw theirs from this generator; its seed is the only entropy.
    std::random_device entropy;
    const uint64_t seed = (static_cast<uint64_t>(entropy()) << 32) | entropy();
    EDGE_ASSIGN_OR_RETURN(auto generator,
                          sched::LocalGenerator::create(std::move(served), config, seed));
    return std::unique_ptr<Generator>(std::move(generator));
}

}  // namespace edge::engine
