#pragma once

// CollectingSink records what a request streams (text, ids, logprobs, the finish) and lets a test
// wait for the finish with a bounded wait. Thread-safe.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/generator.h"

namespace edge::engine::testing {

class CollectingSink final : public GenerationSink {
public:
    void on_thought_opened() override {
        std::lock_guard<std::mutex> lock(mu_);
        thought_opened_ = true;
        thought_opened_late_ = deltas_ > 0 || finish_.has_value();
    }
    // on_thought_opened() came, and before any delta or finish.
    bool thought_opened() {
        std::lock_guard<std::mutex> lock(mu_);
        return thought_opened_ && !thought_opened_late_;
    }
    void on_prompt(std::vector<TokenLogprob> tokens) override {
        std::lock_guard<std::mutex> lock(mu_);
        prompt_late_ = prompts_ > 0 || deltas_ > 0 || finish_.has_value();
        ++prompts_;
        prompt_ = std::move(tokens);
    }
    // What on_prompt() gave (echo_prompt).
    std::vector<TokenLogprob> prompt() {
        std::lock_guard<std::mutex> lock(mu_);
        return prompt_;
    }
    void on_delta(TokenDelta delta) override {
        std::lock_guard<std::mutex> lock(mu_);
        text_ += delta.text;
        ids_.insert(ids_.end(), delta.token_ids.begin(), delta.token_ids.end());
        for (auto& lp : delta.logprobs) {
            logprob_ahead_of_text_ |= lp.text_offset > text_.size();
            logprobs_.push_back(std::move(lp));
        }
        ++deltas_;
        if (finish_) {
            delta_after_finish_ = true;
        }
    }
    void on_finish(Finish finish) override {
        std::lock_guard<std::mutex> lock(mu_);
        if (finish_) {
            second_finish_ = true;
        }
        finish_ = std::move(finish);
        cv_.notify_all();
    }

    // The finish, waiting up to 30 s for it (a generous bound: a hang fails the test).
    std::optional<Finish> wait() {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::seconds(30), [&] { return finish_.has_value(); });
        return finish_;
    }
    bool finished() {
        std::lock_guard<std::mutex> lock(mu_);
        return finish_.has_value();
    }
    std::string text() {
        std::lock_guard<std::mutex> lock(mu_);
        return text_;
    }
    std::vector<TokenId> ids() {
        std::lock_guard<std::mutex> lock(mu_);
        return ids_;
    }
    std::vector<TokenLogprob> logprobs() {
        std::lock_guard<std::mutex> lock(mu_);
        return logprobs_;
    }
    // True when the Generator contract was broken: a callback after on_finish, a logprob sent
    // before any of its token's text, or on_prompt() twice or after a delta.
    bool protocol_violated() {
        std::lock_guard<std::mutex> lock(mu_);
        return delta_after_finish_ || second_finish_ || logprob_ahead_of_text_ || prompt_late_;
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::string text_;
    std::vector<TokenId> ids_;
    std::vector<TokenLogprob> logprobs_;
    std::vector<TokenLogprob> prompt_;
    int prompts_ = 0;
    bool prompt_late_ = false;
    int deltas_ = 0;
    std::optional<Finish> finish_;
    bool delta_after_finish_ = false;
    bool second_finish_ = false;
    bool logprob_ahead_of_text_ = false;
    bool thought_opened_ = false;
    bool thought_opened_late_ = false;  // After a delta or the finish.
};

}  // namespace edge::engine::testing
