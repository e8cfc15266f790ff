#pragma once

// DeviceCausalLM is the CausalLM the engine serves when engine.backend is "cuda" and the model is
// one the whole-step device forward runs (engine/cuda/host/checkpoint_model.h: all-MoE Qwen3,
// GLM-4.5 and DeepSeek-V3 / Kimi K2 with MLA, one expert format; host/serving_plan.h: one GPU,
// 16-token KV blocks). Every op of a step runs on the device (DeviceDecoder in serving mode): the
// scheduler's chunks become device rows (one token each, prefill and decode alike, several steps
// when a batch has more than max_rows tokens), each step replays the CUDA graph of its batch-size
// bucket with padded rows masked, and the logits the batch asks for are copied back for the
// engine's own sampler. Slots, lengths and the prefix cache are the host KvCache's (PagedCausalLM);
// its block ids are the device pool's block ids, and a block the host cache copies on write is
// copied on the device too. This header includes no CUDA header; it exists only in builds with
// EDGE_HAVE_CUDA.
//
// Errors: every CUDA call is checked; a sticky device error fails forward() and stays in
// cuda_device_health() (so the engine is marked unhealthy, as with the CUDA backend).
//
// Threading: as CausalLM (one driving thread).

#include <memory>
#include <string>

#include "common/result.h"
#include "engine/model/causal_lm.h"
#include "engine/model/loader.h"

namespace edge::engine::cuda {

// The model in `dir` served on the current CUDA device with `options` (threads and backend are
// not used). kUnimplemented, naming why, for a model or configuration the device forward does
// not run (the caller falls back to load_model()); other errors as load_model's.
Result<std::unique_ptr<CausalLM>> load_device_causal_lm(const std::string& dir,
                                                        const LoadOptions& options);

}  // namespace edge::engine::cuda
