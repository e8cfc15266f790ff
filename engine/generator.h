#pragma once

// Generator is what the API layer calls to run a model: submit a request, receive its tokens as
// they are produced, cancel it. The engine implements it (engine/engine.h); tests use a scripted
// implementation. It is the only engine type the daemon's request path needs.
//
// Threading: submit() and GenerationHandle::cancel() may be called from any thread. The sink's
// callbacks run on an engine thread, in order, one at a time per request; they must not block (the
// daemon posts them to the connection's strand). After on_finish() no further callback comes for
// that request. cancel() after on_finish() is a no-op.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/result.h"
#include "engine/sampling/json_schema.h"
#include "engine/serving_stats.h"

namespace edge::engine {

using TokenId = int32_t;

// A tool call in an assistant message of the history (OpenAI `tool_calls[i]`).
struct ChatToolCall {
    std::string id;         // The call's id, as returned to the client.
    std::string name;       // Function name.
    std::string arguments;  // JSON object text.
};

struct ChatMessage {
    std::string role;                           // "system", "user", "assistant", "tool".
    std::string content;                        // Text parts already joined.
    std::string name;                           // Optional participant name.
    std::vector<ChatToolCall> tool_calls = {};  // Assistant messages: the calls it made.
    std::string tool_call_id = {};              // Tool messages: the call this answers.
    // Assistant messages of reasoning models (Qwen3, GLM-4.5): the reasoning, when the client
    // sends it apart (`reasoning_content`); else it is taken from <think>...</think> in content.
    std::optional<std::string> reasoning_content = {};
};

// One OpenAI tool definition (`tools[i].function`), rendered into chat prompts.
struct ToolSpec {
    std::string name;
    std::string description;
    std::string parameters_json;  // The JSON Schema object as text ("{}" when absent).
    // The tool is strict (OpenAI's `strict: true`): its parameters compiled, which the arguments
    // of its calls follow (SamplingParams::json). Null otherwise.
    std::shared_ptr<const sampling::JsonSchema> strict_schema = nullptr;
};

struct SamplingParams {
    float temperature = 1.0f;        // 0 means greedy.
    float top_p = 1.0f;              // Nucleus mass in (0, 1].
    int32_t top_k = 0;               // 0 means no top-k cut.
    std::optional<uint64_t> seed;    // Fixed seed for reproducible sampling.
    float presence_penalty = 0.0f;   // Subtracted once from logits of tokens already generated.
    float frequency_penalty = 0.0f;  // Subtracted per occurrence of a generated token.
    // vLLM's extensions. repetition_penalty (as Hugging Face's): the logits of tokens in the
    // prompt or already generated are divided by it when positive, multiplied when negative
    // (1: off). min_p: tokens less likely than min_p times the likeliest (after temperature) are
    // not drawn (0: off). min_tokens: end-of-sequence tokens cannot be chosen before this many
    // tokens are generated, and stop strings only end the reply from the token after them (as
    // vLLM's).
    float repetition_penalty = 1.0f;
    float min_p = 0.0f;
    int32_t min_tokens = 0;
    int32_t max_tokens = 256;        // Upper bound on generated tokens.
    std::vector<std::string> stop;   // Stop strings; the matched text is not returned.
    // vLLM's extension: generating one of these ids ends the reply (finish reason "stop"), its
    // text kept unless it is a special token; banned before min_tokens like end-of-sequence.
    std::vector<TokenId> stop_token_ids;
    // What the reply is held to: response_format (json_object, json_schema) and strict tool
    // calls (sampling/json_schema.h). Held, no special token is chosen inside the document.
    sampling::JsonReply json;
    bool logprobs = false;           // Return the chosen token's log-probability.
    int32_t top_logprobs = 0;        // Also return this many alternatives per position (0..20).
    bool ignore_eos = false;         // Keep generating past end-of-sequence tokens.
    // Added to these tokens' logits before sampling (OpenAI's logit_bias: -100 bans a token, 100
    // all but forces it); logprobs stay the model's own.
    std::vector<std::pair<TokenId, float>> logit_bias;
};

struct GenerateRequest {
    std::string request_id;  // For logs and metrics correlation; never a label.
    std::string tenant;      // Tenant name; keys fair share, and the prefix-cache salt...
    // ...unless this is set: the tenant's identity for the prefix cache (a name that came back
    // as another customer gets a new one, daemon/tenants.h), so requests of different scopes
    // never share cached prompt blocks.
    std::string cache_scope = {};
    std::string model;       // Model name as served (config `models[].name`).
    // The prompt: raw text, token ids, or chat messages (the model's chat template is applied).
    std::variant<std::string, std::vector<TokenId>, std::vector<ChatMessage>> prompt;
    SamplingParams sampling;
    // sampling.max_tokens is a default the client did not set: the engine lowers it to what the
    // context (and max_context_tokens) leaves after the prompt instead of refusing the request.
    bool max_tokens_is_default = false;
    // The request field that set max_tokens, for errors ("max_tokens" or "max_completion_tokens").
    std::string max_tokens_field = "max_tokens";
    // The request field that holds the prompt, for errors about it: the API's "prompt[2]" for
    // the third of a list of prompts, so that an error about the prompt's sixth token names
    // "prompt[2][5]". Empty: "messages" for chat messages, else "prompt".
    std::string prompt_field = {};
    // The sink hears the prompt's tokens (GenerationSink::on_prompt) before the first delta,
    // with their logprobs when sampling.logprobs is set (the completions API's `echo`).
    bool echo_prompt = false;
    // Tools offered to the model (chat prompts only), rendered in the model family's format.
    // Empty when tool_choice is "none" (the caller drops them then).
    std::vector<ToolSpec> tools;
    // Text the assistant's reply is forced to begin with (chat prompts only): rendered after the
    // assistant turn's opening with control markers as their ids, so the model continues from it.
    // Not returned in the deltas. The API uses it to force a tool call (tool_choice "required"
    // or a named function); see engine/chat/tool_call_parser.h forced_call_prefix().
    std::string assistant_prefix = {};
    // The chat template's thinking switch (chat prompts only; tokenizer/chat_template.h
    // ChatOptions): the API's chat_template_kwargs enable_thinking / thinking. Unset: default.
    std::optional<bool> thinking = {};
    // The tenant's cap on prompt + max_tokens, tokens; 0: only the model's context applies.
    int64_t max_context_tokens = 0;
    // The tenant's input_tokens_per_minute: a longer prompt could never fit its budget and is
    // refused (kInvalidArgument); 0: no such cap.
    int64_t max_prompt_tokens = 0;
    // The tenant's weight in the scheduler's fair share (deficit round robin on tokens); >= 1.
    int32_t tenant_weight = 1;
    // The tenant's priority (config, 0..100): when KV blocks run out, the lowest priority's most
    // recently admitted sequence is preempted first.
    int32_t priority = 0;
};

struct TopLogprob {
    std::string token;
    TokenId id = 0;
    float logprob = 0.0f;
};

struct TokenLogprob {
    std::string token;  // The token's bytes: may be part of a UTF-8 character (a byte token).
    TokenId id = 0;
    float logprob = 0.0f;
    std::vector<TopLogprob> top;
    size_t text_offset = 0;  // Byte offset of the token's text in the generated text.
};

// Text produced since the previous delta. `text` never ends inside a UTF-8 character and never
// contains a stop string; it may be empty while a possible stop string is held back. A token's
// logprob travels with the delta that shows the first of its text, so logprobs are held back with
// the text, and the logprobs of tokens that fall wholly inside or after a stop string are never
// sent (they still count in usage).
struct TokenDelta {
    std::string text;
    std::vector<TokenId> token_ids;  // Every token the delta stands for (always filled).
    std::vector<TokenLogprob> logprobs;
};

enum class FinishReason { kStop, kLength, kCancelled, kError };

struct Usage {
    int64_t prompt_tokens = 0;
    int64_t completion_tokens = 0;
    int64_t cached_tokens = 0;  // Prompt tokens served from the prefix cache.
    // Of completion_tokens, those of a thinking model's thought (its markers included): counted
    // by the API layer, which splits the thought off; the engine leaves it 0.
    int64_t reasoning_tokens = 0;
};

struct Finish {
    FinishReason reason = FinishReason::kStop;
    Usage usage;
    Status error;  // Set when reason is kError.
};

class GenerationSink {
  public:
    virtual ~GenerationSink() = default;
    // The prompt ended inside an open thought (its last tokens are <think> and whitespace: the
    // chat template opened it, as DeepSeek-V3.1's does with thinking on), so the output starts
    // in the thought. Called at most once, from submit(), before any other callback.
    virtual void on_thought_opened() {}
    // GenerateRequest::echo_prompt: the prompt's tokens as the model read them, once, before the
    // first on_delta. Each has its bytes (`token`), id and byte offset in the prompt; with
    // sampling.logprobs also the log-probability the model gave it after the tokens before it,
    // and `top` alternatives (the first token has none: logprob NaN, top empty).
    virtual void on_prompt(std::vector<TokenLogprob> tokens) { (void)tokens; }
    // The prompt's length in tokens, from submit() as soon as it is tokenized: before submit()
    // may still refuse the request for its prompt (beyond the context), so a caller can charge
    // a tenant for the tokenizing it caused even then.
    virtual void on_prompt_tokens(int64_t tokens) { (void)tokens; }
    virtual void on_delta(TokenDelta delta) = 0;
    virtual void on_finish(Finish finish) = 0;
};

class GenerationHandle {
  public:
    virtual ~GenerationHandle() = default;
    // Stops the request at the next engine step; on_finish(kCancelled) follows.
    virtual void cancel() = 0;
    // The prompt's length in tokens, known once submit() tokenized it; 0 where it is not (a
    // generator that tokenizes later). Lets a caller charge input quotas at admission.
    virtual int64_t prompt_tokens() const { return 0; }
};

// A checkpoint's recommended sampling (generation_config.json: temperature, top_p, top_k), which
// requests that leave a field unset get instead of OpenAI's defaults (1, 1, off), as vLLM applies
// them (`do_sample` is not read, as vLLM does not). Unset: no recommendation.
struct SamplingDefaults {
    std::optional<float> temperature;
    std::optional<float> top_p;
    std::optional<int32_t> top_k;
};

struct ModelInfo {
    std::string name;            // Served name.
    std::string version;         // Version digest of the loaded checkpoint.
    std::string architecture;    // e.g. "Qwen3MoeForCausalLM".
    int64_t context_length = 0;  // Max prompt + output tokens.
    int64_t created_unix = 0;    // When it was loaded.
    // The tool-call output format of the model's chat family ("hermes", "glm4_5", "kimi_k2");
    // empty when the model has no chat template, so tools cannot be offered to it.
    std::string tool_call_format = {};
    // The model has a chat template and its vocabulary holds <think> and </think>: a chat
    // answer's thought is returned apart (engine/chat/reasoning_parser.h).
    bool thinks = false;
    SamplingDefaults sampling_defaults = {};
    // The most sequences one request may queue: each choice (n for each prompt) waits as a
    // request of its own, so a request with more than the model's queue bounds (per tenant or
    // overall) could never be queued whole. 0: no bound.
    int32_t max_request_sequences = 0;
};

// Live load of one served model, published for routing (gossip) and metrics. Rates are
// exponentially weighted over recent engine steps; zero until measured.
struct ModelLoad {
    std::string name;                   // Served name.
    uint32_t queue_depth = 0;           // Requests waiting for admission.
    uint32_t running = 0;               // Requests in the running batch.
    uint32_t capacity = 0;              // Sequences the model runs at once at most.
    double kv_use = 0.0;                // Fraction of the KV-cache budget in use, 0..1.
    // The pool's prefill speed, which routing costs a prompt at: the marginal cost of a prompt
    // token in a fit of recent steps' times (mixed steps included), or, until the fit tells it,
    // the speed of steps that only prefilled 128 tokens or more; 0 until measured.
    double prefill_tokens_per_s = 0.0;
    // Tokens generated per second, all sequences together, by a step decoding the present batch
    // and prefilling nothing (from the same fit; recent steps' rate until it tells it).
    double decode_tokens_per_s = 0.0;
    // Waiting requests (all tenants) at which submit() refuses with kUnavailable
    // (engine.max_queue); 0: no bound. Routing counts a pool with this many queued as saturated.
    uint32_t max_queue = 0;
};

class Generator {
  public:
    virtual ~Generator() = default;

    virtual std::vector<ModelInfo> models() const = 0;

    // Whether `name` is one of models(): for callers that ask only that (once per request),
    // without a copy of every model's info. The default looks through models().
    virtual bool has_model(std::string_view name) const {
        const std::vector<ModelInfo> all = models();
        return std::any_of(all.begin(), all.end(),
                           [&](const ModelInfo& m) { return m.name == name; });
    }

    // Queues a request. Errors before anything runs: kNotFound (unknown model),
    // kInvalidArgument (bad prompt, prompt + max_tokens beyond the context, bad sampling values),
    // kResourceExhausted (the tenant's queue is full: 429), kUnavailable (the model's whole queue
    // is full or it is shutting down: 503). On success the sink receives deltas, then exactly one
    // on_finish.
    virtual Result<std::shared_ptr<GenerationHandle>> submit(
        GenerateRequest request, std::shared_ptr<GenerationSink> sink) = 0;

    // The token ids submit() would run for `request`'s prompt, tokenized as submit() does it (a
    // text prompt with the BOS the model adds), without queuing anything: a caller measures
    // prompts before submitting any, then submits these ids instead of the text, which runs the
    // same (echo, logprobs, errors). Errors as submit()'s about the model and the prompt alone:
    // kNotFound, kInvalidArgument naming request.prompt_field. kUnimplemented where the
    // generator tokenizes only inside submit() (the default): the caller learns the length
    // from GenerationHandle::prompt_tokens() instead.
    virtual Result<std::vector<TokenId>> prompt_token_ids(const GenerateRequest& request) const {
        (void)request;
        return unimplemented_error("prompt_token_ids: this generator tokenizes only in submit()");
    }

    // True once every configured model is loaded and able to serve.
    virtual bool ready() const = 0;

    // Current load of every served model. Thread-safe and cheap (atomics): called by the gossip
    // publisher and metrics a few times per second.
    virtual std::vector<ModelLoad> load() const = 0;

    // Per-model, per-tenant serving figures for metrics (engine/serving_stats.h). Thread-safe;
    // called at each metrics scrape. Empty when the implementation keeps none.
    virtual std::vector<ServingStats> serving_stats() const { return {}; }

    // Shutdown: cancels every queued and running request, each one's on_finish running before
    // this returns, and refuses later submits. For callers whose sinks' callbacks use state that
    // is torn down next (the daemon's metrics and limiter). Idempotent.
    virtual void stop() {}
};

}  // namespace edge::engine
