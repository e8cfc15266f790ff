#include "tests/testing/scripted_generator.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace edge::testing {

class ScriptedGenerator::Handle final : public engine::GenerationHandle {
public:
    Handle(ScriptedGenerator& owner, std::shared_ptr<Call> call, int64_t prompt_tokens)
        : owner_(owner), call_(std::move(call)), prompt_tokens_(prompt_tokens) {}
    int64_t prompt_tokens() const override { return prompt_tokens_; }
    void cancel() override {
        std::shared_ptr<engine::GenerationSink> sink;
        {
            std::lock_guard lock(owner_.mu_);
            if (call_->finished || call_->cancelled) {
                return;
            }
            call_->cancelled = true;
            call_->finished = true;
            sink = std::move(call_->sink);  // Let go after on_finish, as the engine does.
        }
        owner_.cv_.notify_all();
        engine::Finish finish;
        finish.reason = engine::FinishReason::kCancelled;
        sink->on_finish(finish);
    }

private:
    ScriptedGenerator& owner_;
    std::shared_ptr<Call> call_;
    int64_t prompt_tokens_;
};

ScriptedGenerator::ScriptedGenerator(std::vector<std::string> model_names)
    : names_(std::move(model_names)),
      tool_formats_(names_.size()),
      thinks_(names_.size()),
      sampling_defaults_(names_.size()) {}

std::vector<engine::ModelInfo> ScriptedGenerator::models() const {
    std::lock_guard lock(mu_);
    std::vector<engine::ModelInfo> out;
    for (size_t i = 0; i < names_.size(); ++i) {
        out.push_back(engine::ModelInfo{names_[i], "v1", "Scripted", 4096, 1700000000,
                                        tool_formats_[i], thinks_[i] > 0,
                                        sampling_defaults_[i], max_request_sequences_});
    }
    return out;
}

bool ScriptedGenerator::has_model(std::string_view name) const {
    std::lock_guard lock(mu_);
    return std::find(names_.begin(), names_.end(), name) != names_.end();
}

Result<std::shared_ptr<engine::GenerationHandle>> ScriptedGenerator::submit(
    engine::GenerateRequest request, std::shared_ptr<engine::GenerationSink> sink) {
    std::unique_lock lock(mu_);
    if (fail_next_) {
        Status s = *fail_next_;
        fail_next_.reset();
        if (prompt_tokens_ > 0) {
            sink->on_prompt_tokens(prompt_tokens_);  // Tokenized, then refused (as the engine).
        }
        return s;
    }
    if (fail_at_ && fail_at_->first == calls_.size()) {
        Status s = fail_at_->second(request);
        fail_at_.reset();
        return s;
    }
    const auto known = std::find(names_.begin(), names_.end(), request.model);
    if (known == names_.end()) {
        return not_found_error("unknown model " + request.model);
    }
    if (prompt_tokens_ > 0) {
        sink->on_prompt_tokens(prompt_tokens_);  // Tokenized, as the engine tells it.
    }
    if (thinks_[known - names_.begin()] == 2 &&
        std::holds_alternative<std::vector<engine::ChatMessage>>(request.prompt)) {
        sink->on_thought_opened();
    }
    auto call = std::make_shared<Call>();
    call->request = std::move(request);
    call->sink = std::move(sink);
    calls_.push_back(call);
    cv_.notify_all();
    auto handle = std::shared_ptr<engine::GenerationHandle>(
        std::make_shared<Handle>(*this, call, prompt_tokens_));
    if (submit_hook_ && submit_hook_->first == calls_.size() - 1) {
        std::function<void()> hook = std::move(submit_hook_->second);
        submit_hook_.reset();
        lock.unlock();
        hook();
        lock.lock();
    }
    if (error_at_ && error_at_->first == calls_.size() - 1) {
        const size_t index = error_at_->first;
        Status error = std::move(error_at_->second);
        error_at_.reset();
        lock.unlock();
        finish(index, engine::FinishReason::kError, engine::Usage{}, std::move(error));
    }
    return handle;
}

void ScriptedGenerator::on_submit_at(size_t index, std::function<void()> hook) {
    std::lock_guard lock(mu_);
    submit_hook_.emplace(index, std::move(hook));
}

Result<std::vector<engine::TokenId>> ScriptedGenerator::prompt_token_ids(
    const engine::GenerateRequest& request) const {
    Tokenize tokenize;
    {
        std::lock_guard lock(mu_);
        tokenize = tokenize_;
    }
    return tokenize ? tokenize(request) : engine::Generator::prompt_token_ids(request);
}

void ScriptedGenerator::set_thinks(const std::string& model, bool prompt_opens_thought) {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < names_.size(); ++i) {
        if (names_[i] == model) {
            thinks_[i] = prompt_opens_thought ? 2 : 1;
        }
    }
}

void ScriptedGenerator::set_max_request_sequences(int32_t most) {
    std::lock_guard lock(mu_);
    max_request_sequences_ = most;
}

void ScriptedGenerator::set_sampling_defaults(const std::string& model,
                                              engine::SamplingDefaults defaults) {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < names_.size(); ++i) {
        if (names_[i] == model) {
            sampling_defaults_[i] = defaults;
        }
    }
}

std::vector<engine::ModelLoad> ScriptedGenerator::load() const {
    std::lock_guard lock(mu_);
    return load_;
}

void ScriptedGenerator::set_load(std::vector<engine::ModelLoad> load) {
    std::lock_guard lock(mu_);
    load_ = std::move(load);
}

void ScriptedGenerator::set_tool_call_format(const std::string& model, std::string format) {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < names_.size(); ++i) {
        if (names_[i] == model) {
            tool_formats_[i] = format;
        }
    }
}

void ScriptedGenerator::fail_next_submit(Status status) {
    std::lock_guard lock(mu_);
    fail_next_ = std::move(status);
}

void ScriptedGenerator::fail_submit_at(size_t index, Status status) {
    fail_submit_at(index, [status](const engine::GenerateRequest&) { return status; });
}

void ScriptedGenerator::fail_submit_at(
    size_t index, std::function<Status(const engine::GenerateRequest&)> refusal) {
    std::lock_guard lock(mu_);
    fail_at_ = std::pair(index, std::move(refusal));
}

void ScriptedGenerator::error_in_submit_at(size_t index, Status status) {
    std::lock_guard lock(mu_);
    error_at_ = std::pair(index, std::move(status));
}

bool ScriptedGenerator::wait_for_request(size_t index, int timeout_ms) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                        [&] { return calls_.size() > index; });
}

bool ScriptedGenerator::wait_cancelled(size_t index, int timeout_ms) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                        [&] { return calls_.size() > index && calls_[index]->cancelled; });
}

engine::GenerateRequest ScriptedGenerator::request(size_t index) const {
    std::lock_guard lock(mu_);
    return calls_.at(index)->request;
}

bool ScriptedGenerator::cancelled(size_t index) const {
    std::lock_guard lock(mu_);
    return calls_.at(index)->cancelled;
}

void ScriptedGenerator::emit(size_t index, std::string text) {
    std::shared_ptr<engine::GenerationSink> sink;
    size_t offset = 0;
    {
        std::lock_guard lock(mu_);
        if (calls_.at(index)->finished) {
            return;
        }
        sink = calls_.at(index)->sink;
        offset = std::exchange(calls_.at(index)->emitted_bytes,
                               calls_.at(index)->emitted_bytes + text.size());
    }
    engine::TokenDelta delta;
    delta.text = std::move(text);
    delta.token_ids = {1};
    engine::TokenLogprob lp;
    lp.token = delta.text;
    lp.id = 1;
    lp.logprob = -0.5f;
    lp.text_offset = offset;
    delta.logprobs.push_back(lp);
    sink->on_delta(std::move(delta));
}

void ScriptedGenerator::emit_prompt(size_t index, const std::vector<std::string>& tokens) {
    std::shared_ptr<engine::GenerationSink> sink;
    {
        std::lock_guard lock(mu_);
        sink = calls_.at(index)->sink;
    }
    std::vector<engine::TokenLogprob> prompt;
    size_t offset = 0;
    for (const std::string& t : tokens) {
        engine::TokenLogprob lp;
        lp.token = t;
        lp.id = static_cast<engine::TokenId>(prompt.size() + 1);
        lp.logprob = -1.0f;
        lp.text_offset = offset;
        offset += t.size();
        prompt.push_back(std::move(lp));
    }
    sink->on_prompt(std::move(prompt));
}

void ScriptedGenerator::finish(size_t index, engine::FinishReason reason, engine::Usage usage,
                               Status error) {
    std::shared_ptr<engine::GenerationSink> sink;
    {
        std::lock_guard lock(mu_);
        if (calls_.at(index)->finished) {
            return;
        }
        calls_.at(index)->finished = true;
        sink = std::move(calls_.at(index)->sink);  // Let go after on_finish, as the engine does.
    }
    engine::Finish finish;
    finish.reason = reason;
    finish.usage = usage;
    finish.error = std::move(error);
    sink->on_finish(std::move(finish));
    cv_.notify_all();
}

}  // namespace edge::testing
