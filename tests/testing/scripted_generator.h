#pragma once

// ScriptedGenerator is a Generator for API tests: it serves a configured model list, tokenizes
// prompts as a test says (prompt_token_ids), fails submit() with a configured Status, and
// otherwise records each request so the test thread can emit deltas and finish it whenever it
// likes (the test drives the timing). cancel() is recorded and wakes waiters. Thread-safe: every
// method locks one mutex; sink callbacks run on the thread calling emit()/finish().

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "engine/generator.h"

namespace edge::testing {

class ScriptedGenerator final : public engine::Generator {
public:
    struct Call {
        engine::GenerateRequest request;
        std::shared_ptr<engine::GenerationSink> sink;
        bool cancelled = false;
        bool finished = false;
        size_t emitted_bytes = 0;  // Text sent so far (the logprobs' text_offset).
    };

    explicit ScriptedGenerator(std::vector<std::string> model_names = {"test-model"});

    std::vector<engine::ModelInfo> models() const override;
    bool has_model(std::string_view name) const override;
    Result<std::shared_ptr<engine::GenerationHandle>> submit(
        engine::GenerateRequest request, std::shared_ptr<engine::GenerationSink> sink) override;
    bool ready() const override { return ready_; }
    // The load set by set_load() (tests of routing and gossip publish it).
    std::vector<engine::ModelLoad> load() const override;
    void set_load(std::vector<engine::ModelLoad> load);
    // The serving figures set by set_serving_stats() (metrics tests render them).
    std::vector<engine::ServingStats> serving_stats() const override {
        std::lock_guard<std::mutex> lock(mu_);
        return serving_;
    }
    void set_serving_stats(std::vector<engine::ServingStats> stats) {
        std::lock_guard<std::mutex> lock(mu_);
        serving_ = std::move(stats);
    }

    // What later submit() calls report as the prompt's length (0 by default): to the sink
    // (on_prompt_tokens, unless 0) and from the handle.
    void set_prompt_tokens(int64_t n) {
        std::lock_guard<std::mutex> lock(mu_);
        prompt_tokens_ = n;
    }
    using Tokenize =
        std::function<Result<std::vector<engine::TokenId>>(const engine::GenerateRequest&)>;
    // What prompt_token_ids() answers from now on (a text prompt's ids, or an error); unset, the
    // default: kUnimplemented, as a generator that tokenizes only in submit().
    void set_tokenize(Tokenize tokenize) {
        std::lock_guard<std::mutex> lock(mu_);
        tokenize_ = std::move(tokenize);
    }
    Result<std::vector<engine::TokenId>> prompt_token_ids(
        const engine::GenerateRequest& request) const override;
    // The next submit() fails with `status` (once).
    void fail_next_submit(Status status);
    // The submit() that would record request number `index` fails with `status` (once).
    void fail_submit_at(size_t index, Status status);
    // The same with the status `refusal` makes of that request (an error naming its
    // prompt_field, as the engine's do).
    void fail_submit_at(size_t index,
                        std::function<Status(const engine::GenerateRequest&)> refusal);
    // `hook` runs inside the submit() that records request number `index`, after recording it,
    // without the generator's lock (it may emit() to earlier requests: an engine generating for
    // them on another thread while this one is submitted).
    void on_submit_at(size_t index, std::function<void()> hook);
    // Request number `index` ends with kError and `status` inside its submit(), before the
    // handle is returned (an engine whose prefill fails at once, on another thread).
    void error_in_submit_at(size_t index, Status status);
    void set_ready(bool ready) { ready_ = ready; }
    // models() reports `format` as `model`'s tool-call format ("hermes", "glm4_5", "kimi_k2").
    void set_tool_call_format(const std::string& model, std::string format);
    // models() reports `model` as thinking (ModelInfo::thinks); with `prompt_opens_thought`,
    // submit() tells the sink of each of its chat requests that the prompt opened the thought.
    void set_thinks(const std::string& model, bool prompt_opens_thought = false);
    // models() reports `defaults` as `model`'s generation_config.json sampling defaults.
    void set_sampling_defaults(const std::string& model, engine::SamplingDefaults defaults);
    // models() reports `most` as every model's ModelInfo::max_request_sequences (its queue bound).
    void set_max_request_sequences(int32_t most);

    // Blocks until request number `index` (0-based) was submitted; false on timeout.
    bool wait_for_request(size_t index, int timeout_ms = 5000);
    bool wait_cancelled(size_t index, int timeout_ms = 5000);
    // Copies of what was submitted.
    engine::GenerateRequest request(size_t index) const;
    bool cancelled(size_t index) const;

    void emit(size_t index, std::string text);
    // Sends request `index`'s prompt back as these tokens' bytes (an echo), each with logprob -1.
    void emit_prompt(size_t index, const std::vector<std::string>& tokens);
    void finish(size_t index, engine::FinishReason reason, engine::Usage usage,
                Status error = Status());

private:
    class Handle;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::string> names_;
    std::vector<std::string> tool_formats_;  // By index of names_; "" by default.
    std::vector<int> thinks_;                // By index of names_: 0 no, 1 yes, 2 opened.
    std::vector<engine::SamplingDefaults> sampling_defaults_;  // By index of names_.
    std::vector<std::shared_ptr<Call>> calls_;
    std::optional<Status> fail_next_;
    std::optional<std::pair<size_t, std::function<Status(const engine::GenerateRequest&)>>>
        fail_at_;
    std::optional<std::pair<size_t, Status>> error_at_;
    std::optional<std::pair<size_t, std::function<void()>>> submit_hook_;
    bool ready_ = true;
    int32_t max_request_sequences_ = 0;
    int64_t prompt_tokens_ = 0;
    Tokenize tokenize_;
    std::vector<engine::ModelLoad> load_;
    std::vector<engine::ServingStats> serving_;
};

}  // namespace edge::testing
