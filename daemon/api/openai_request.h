#pragma once

// Parsing and validation of OpenAI request bodies (POST /v1/chat/completions and
// /v1/completions) into an engine::GenerateRequest plus the response options (stream, usage).
// Every field of the public schema is recognised: supported ones are type- and range-checked,
// unsupported features (images, audio, best_of > 1, legacy `functions`, ...) are refused
// with a 400 naming the field, unknown fields are refused too. Chat requests may carry OpenAI
// `tools` (function tools), `tool_choice` and assistant `tool_calls` / tool `tool_call_id` in
// the history. Pure functions over untrusted bytes; thread-safe.

#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "daemon/api/api_error.h"
#include "engine/generator.h"

namespace edge::daemon::api {

enum class Endpoint { kChatCompletions, kCompletions };

// The most choices (`n`) one request may ask for.
inline constexpr int32_t kMaxChoices = 16;
// The most choices one /v1/completions request may ask for over all its prompts (n for each,
// a list of prompts being OpenAI's batch): each is a sequence of its own in the engine.
inline constexpr int32_t kMaxBatchChoices = 64;

// OpenAI `tool_choice`.
enum class ToolChoice {
    kNone,      // "none": tools are not offered (dropped from the request).
    kAuto,      // "auto" (the default with tools): the model may call tools or answer.
    kRequired,  // "required": the reply starts with a tool call.
    kFunction,  // {"type": "function", "function": {"name": N}}: the reply calls N.
};

struct ParsedRequest {
    Endpoint endpoint = Endpoint::kChatCompletions;
    engine::GenerateRequest generate;  // request_id and tenant are left for the caller.
    bool stream = false;               // Answer as server-sent events.
    // Choices to generate (OpenAI `n`, 1..kMaxChoices): each runs as its own sequence on the
    // same prompt, with seed + i as its seed when a seed is set.
    int32_t n = 1;
    // A /v1/completions list of prompts (OpenAI's and vLLM's batch): the prompts after the
    // first, which is generate.prompt; empty for one prompt. Each prompt gets n choices, choice
    // `prompt * n + i` being its i-th (seed + i when a seed is set).
    std::vector<decltype(engine::GenerateRequest::prompt)> more_prompts;
    // The request's prompts, and its choices over them all (n for each, <= kMaxBatchChoices).
    int32_t prompts() const { return 1 + static_cast<int32_t>(more_prompts.size()); }
    int32_t choices() const { return n * prompts(); }
    // /v1/completions' `prompt` was a list of prompts, even of one (["text"], [[1, 2]]).
    bool prompt_list = false;
    // The request field that holds prompt `prompt` (0-based), as errors name it: "messages",
    // "prompt", or "prompt[i]" for an element of a list.
    std::string prompt_field(int32_t prompt) const;
    bool include_usage = false;        // stream_options.include_usage: a final usage chunk.
    // stream_options.continuous_usage_stats (vLLM's): every streamed chunk with a choice also
    // carries `usage`, that choice's prompt and its tokens generated so far (as vLLM counts;
    // vLLM also wants include_usage for it, here it is enough alone).
    bool continuous_usage = false;
    // "return_token_ids": true: each choice (each streamed chunk) also carries `token_ids`, the
    // generated token ids (as vLLM answers), tokens past a stop string included.
    bool return_token_ids = false;
    // Set by the router, never parsed: a stream forwarded by another site ends with the usage
    // report comment (kUsageReportComment) that the forwarding site reads and does not relay.
    bool report_usage = false;
    // The field that set generate.sampling.max_tokens ("max_completion_tokens" or "max_tokens");
    // empty when the client set neither and the default applies.
    std::string max_tokens_param;
    // Sampling fields the client set (not null): the others take the model's
    // generation_config.json defaults (engine::ModelInfo::sampling_defaults) when it has them.
    bool temperature_set = false;
    bool top_p_set = false;
    bool top_k_set = false;
    // How the tools in generate.tools may be used; kNone leaves generate.tools empty.
    ToolChoice tool_choice = ToolChoice::kNone;
    std::string tool_choice_function;  // kFunction: the function to call (one of the tools).
    // OpenAI's parallel_tool_calls: false, the reply holds one call at most (where the format
    // writes calls as JSON; docs/tool_calls.md).
    bool parallel_tool_calls = true;
};

std::variant<ParsedRequest, ApiError> parse_openai_request(Endpoint endpoint,
                                                           std::string_view body);

}  // namespace edge::daemon::api
