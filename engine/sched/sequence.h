#pragma once

// Sequence is one request as the scheduler runs it: its tokens (prompt, then generated), where
// it lives in the model (slot, tokens already in the KV cache), and the per-request streaming
// state (sampler, incremental decoder, stop matcher, sink). RequestHandle is what submit()
// returns; cancel() only sets a flag that the scheduler reads at its next step.
//
// Threading: a Sequence is owned and touched only by its scheduler's thread once submitted;
// SequenceControl is shared with the handle and is atomic.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "engine/generator.h"
#include "engine/model/block_pool.h"
#include "engine/model/kv_cache.h"
#include "engine/sampling/json_prefix.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/stop_matcher.h"
#include "engine/tokenizer/incremental_decoder.h"

namespace edge::engine::sched {

struct SequenceControl {
    std::atomic<bool> cancelled{false};
};

class RequestHandle final : public GenerationHandle {
public:
    RequestHandle(std::shared_ptr<SequenceControl> control, int64_t prompt_tokens)
        : control_(std::move(control)), prompt_tokens_(prompt_tokens) {}
    void cancel() override { control_->cancelled.store(true, std::memory_order_relaxed); }
    int64_t prompt_tokens() const override { return prompt_tokens_; }

private:
    std::shared_ptr<SequenceControl> control_;
    int64_t prompt_tokens_;
};

// What the scheduler needs to start a request (prompt already tokenized and validated).
struct SequenceRequest {
    std::string request_id;                // For logs.
    std::vector<TokenId> prompt;           // Non-empty, ids within the vocabulary.
    SamplingParams sampling;               // Validated.
    uint64_t seed = 0;                     // Seed for the sampler.
    std::shared_ptr<GenerationSink> sink;  // Receives deltas and the finish.
    std::string tenant = {};               // Fair-share key ("" is a tenant like any other).
    std::string cache_scope = {};          // Prefix-cache salt key; "": the tenant.
    int32_t tenant_weight = 1;             // The tenant's fair-share weight (>= 1).
    int32_t priority = 0;                  // Higher is preempted later.
    std::vector<TokenId> kept_special = {};  // Special tokens decoded anyway (tool markers).
    bool echo_prompt = false;                // GenerateRequest::echo_prompt.
};

// The KV of a preempted sequence kept in host memory (CausalLM::save_slot), counted in its
// scheduler's swap use while it lives.
class SwappedKv {
public:
    SwappedKv(SavedSlot saved, std::shared_ptr<std::atomic<int64_t>> use)
        : saved_(std::move(saved)), use_(std::move(use)) {
        use_->fetch_add(saved_.bytes());
    }
    ~SwappedKv() { use_->fetch_sub(saved_.bytes()); }
    SwappedKv(const SwappedKv&) = delete;
    SwappedKv& operator=(const SwappedKv&) = delete;

    const SavedSlot& saved() const { return saved_; }

private:
    SavedSlot saved_;
    std::shared_ptr<std::atomic<int64_t>> use_;
};

struct Sequence {
    Sequence(SequenceRequest request, const tokenizer::Tokenizer* tokenizer)
        : request_id(std::move(request.request_id)),
          tokens(std::move(request.prompt)),
          prompt_len(static_cast<int32_t>(tokens.size())),
          params(std::move(request.sampling)),
          sampler(params, request.seed),
          decoder(tokenizer, /*skip_special_tokens=*/true),
          stop(params.stop),
          sink(std::move(request.sink)),
          control(std::make_shared<SequenceControl>()),
          tenant(std::move(request.tenant)),
          cache_scope(request.cache_scope.empty() ? tenant : std::move(request.cache_scope)),
          tenant_weight(std::max(request.tenant_weight, 1)),
          priority(request.priority),
          echo_prompt(request.echo_prompt),
          prompt_logprobs(request.echo_prompt &&
                          (params.logprobs || params.top_logprobs > 0)) {
        decoder.keep_special(std::move(request.kept_special));
        prompt_computed.resize(static_cast<size_t>(prompt_len));
        // json views params' schema, heads and tail: params outlives it (declared before it),
        // and a Sequence stays where it was built (not copied or moved; held by unique_ptr).
        if (params.json.from_start()) {
            json.emplace(params.json);
        }
        if (echo_prompt) {
            prompt_lp.resize(static_cast<size_t>(prompt_len));
            for (TokenLogprob& lp : prompt_lp) {
                lp.logprob = std::numeric_limits<float>::quiet_NaN();  // Not computed yet.
            }
        }
    }
    Sequence(const Sequence&) = delete;
    Sequence& operator=(const Sequence&) = delete;

    // JsonReply::trigger: where in `bytes`, the next token's, the trigger is complete
    // (the offset after it), or npos when it is not.
    size_t trigger_end(std::string_view bytes) const {
        const std::string& trigger = params.json.trigger;
        if (bytes.find(trigger.back()) == std::string_view::npos) {
            return std::string::npos;  // Most tokens, without building the window below.
        }
        const std::string seen = trigger_seen + std::string(bytes);
        const size_t at = seen.find(trigger);
        return at == std::string::npos ? at : at + trigger.size() - trigger_seen.size();
    }
    // Follows the next token's bytes with the JSON prefix: false when it refuses them. With a
    // trigger the prefix is started where the trigger completes (or at once, held_at_start), and
    // dropped once complete when the reply goes on (again).
    bool follow_json(std::string_view bytes) {
        if (params.json.trigger.empty() || json) {
            if (json && !json->feed(bytes)) {
                return false;
            }
            if (json && json->complete() && params.json.again) {
                json.reset();
                trigger_seen.clear();
            }
            return true;
        }
        const size_t at = trigger_end(bytes);
        if (at == std::string::npos) {
            trigger_seen += bytes;
            const size_t keep = params.json.trigger.size() - 1;
            if (trigger_seen.size() > keep) {
                trigger_seen.erase(0, trigger_seen.size() - keep);
            }
            return true;
        }
        json.emplace(params.json);
        return follow_json(bytes.substr(at));
    }

    int32_t generated() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
    // Tokens not yet in the KV cache (1 while decoding).
    int32_t pending() const { return static_cast<int32_t>(tokens.size()) - computed; }

    std::string request_id;
    std::vector<TokenId> tokens;  // Prompt, then generated tokens.
    int32_t prompt_len = 0;
    SamplingParams params;
    sampling::Sampler sampler;
    tokenizer::IncrementalDecoder decoder;
    sampling::StopMatcher stop;
    // Logprobs of tokens whose text the stop matcher still holds, and the byte counts of the text
    // decoded and shown so far (see TokenDelta).
    std::deque<TokenLogprob> held_logprobs;
    size_t decoded_bytes = 0;
    size_t shown_bytes = 0;
    std::shared_ptr<GenerationSink> sink;
    std::shared_ptr<SequenceControl> control;
    std::string tenant;
    std::string cache_scope;  // Whose prefix-cache entries it may hit (prefix_hash.h salt).
    int32_t tenant_weight = 1;
    int32_t priority = 0;
    // echo_prompt: the prompt goes to the sink before the first delta (prompt_sent), from
    // prompt_lp (a token each; logprob NaN until known). With prompt_logprobs each logprob is
    // filled from the prefill's logits of every position (never from the prefix cache, which has
    // none), each once.
    const bool echo_prompt = false;
    const bool prompt_logprobs = false;
    bool prompt_sent = false;
    std::vector<TokenLogprob> prompt_lp;
    // SamplingParams::json, while it holds the reply: the output so far, as the beginning of a
    // valid text.
    std::optional<sampling::JsonPrefix> json;
    // JsonReply::trigger, while json is not started: the output's last bytes, fewer than the
    // trigger's.
    std::string trigger_seen;

    int32_t slot = -1;         // Model slot while admitted, else -1.
    int32_t computed = 0;      // Tokens of `tokens` already in the slot's KV cache.
    // The most positions it has computed: a chunk below this recomputes what a preemption
    // dropped (SchedulerStats::recompute_tokens).
    int32_t computed_most = 0;
    // Positions charged to its tenant's tokens served (Scheduler's served_): a position
    // recomputed after a preemption, or attached again, is not charged twice.
    int32_t served_most = 0;
    uint64_t admitted_at = 0;  // Admission order; the newest is preempted first.
    int64_t admitted_step = 0;  // Scheduler steps run before its latest admission.
    int32_t preemptions = 0;   // Times this sequence was evicted and requeued.
    uint64_t charged_flow = 0;  // FairQueue: the tenant backlog its admission was charged to.
    std::unique_ptr<SwappedKv> swapped;  // Its KV while preempted, when it was saved.
    bool finished = false;     // on_finish() was sent; the sequence leaves at the step end.
    uint64_t last_decode_step = 0;  // Step of its last decode token (round robin in a tenant).

    // Prefix cache: chain hashes of the prompt's full blocks (computed at first admission) and
    // how many of them are published.
    std::vector<BlockHash> prefix_chain;
    bool chain_ready = false;
    int32_t published_blocks = 0;
    // Where its prompt positions came from, over every admission (Usage::cached_tokens): the
    // prefix cache attached [0, attached_most) at one admission or another, and prompt_computed
    // marks those it computed itself at any time (before a preemption, or again after one whose
    // dropped blocks were evicted). A KV copy put back after a preemption (swapped) holds
    // positions it had computed or attached before, so it changes neither.
    int32_t attached_most = 0;
    std::vector<bool> prompt_computed;  // prompt_len flags.

    // Records positions [from, to) as computed by this sequence (those of the prompt matter).
    void mark_computed(int32_t from, int32_t to) {
        for (int32_t p = std::max(from, 0); p < std::min(to, prompt_len); ++p) {
            prompt_computed[static_cast<size_t>(p)] = true;
        }
    }
    // Prompt positions taken from the prefix cache and never computed by this sequence: a
    // position attached and computed again after a preemption is not one, nor one it attached
    // back after computing it (its own published block).
    int32_t cached_tokens() const {
        int32_t n = 0;
        for (int32_t p = 0; p < std::min(attached_most, prompt_len); ++p) {
            n += prompt_computed[static_cast<size_t>(p)] ? 0 : 1;
        }
        return n;
    }

    // Timing for the latency histograms (the scheduler's clock).
    TimePoint submitted_at{};
    TimePoint last_token_at{};
    bool admitted_once = false;
};

}  // namespace edge::engine::sched
