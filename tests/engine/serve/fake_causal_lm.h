#pragma once

// FakeCausalLM: a deterministic stand-in for a loaded model, so the scheduler can be tested
// without weights. The next token is a function of the whole token history of a slot (default:
// a hash mapped to printable ASCII), so feeding wrong positions or mixing sequences up changes
// the output. It enforces the CausalLM contract (start_pos equals the slot length, ids in range,
// context limit) and a KV budget in tokens over all slots (kResourceExhausted, nothing changed).
// Every forward() is recorded in a shared log the test keeps after the scheduler owns the model.
//
// Threading: like CausalLM, driven by one thread; the log has its own mutex.

#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "engine/model/causal_lm.h"

namespace edge::engine::testing {

using NextToken = std::function<TokenId(std::span<const TokenId> history)>;

inline uint64_t hash_history(std::span<const TokenId> history) {
    uint64_t h = 1469598103934665603ull;
    for (TokenId t : history) {
        h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
    }
    return h ^ (h >> 29);
}

inline TokenId default_next(std::span<const TokenId> history) {
    return static_cast<TokenId>(32 + hash_history(history) % 95);
}

struct FakeOptions {
    int32_t vocab_size = 512;
    int32_t max_context = 256;
    int32_t slots = 8;
    int64_t kv_tokens = 1 << 20;  // Tokens all slots together may hold.
    std::vector<TokenId> eos = {509};
    NextToken next = default_next;
    int fail_call = -1;  // forward() call (0-based) that fails with kInternal; -1: none.
};

struct ForwardCall {
    std::vector<std::pair<int32_t, int32_t>> chunks;  // (slot, tokens) in batch order.
    bool ok = true;
};

struct FakeLog {
    std::mutex mu;
    std::vector<ForwardCall> calls;
    int32_t slots_in_use = 0;

    std::vector<ForwardCall> snapshot() {
        std::lock_guard<std::mutex> lock(mu);
        return calls;
    }
};

class FakeCausalLM final : public CausalLM {
public:
    explicit FakeCausalLM(FakeOptions options, std::shared_ptr<FakeLog> log = nullptr)
        : options_(std::move(options)), log_(log ? log : std::make_shared<FakeLog>()) {
        spec_.architecture = "FakeForCausalLM";
        spec_.vocab_size = options_.vocab_size;
        spec_.max_context = options_.max_context;
        spec_.eos_token_ids = options_.eos;
        spec_.version = "fake";
        slots_.resize(static_cast<size_t>(options_.slots));
        used_.assign(static_cast<size_t>(options_.slots), false);
    }

    const ModelSpec& spec() const override { return spec_; }

    Result<int32_t> acquire_slot() override {
        for (size_t i = 0; i < used_.size(); ++i) {
            if (!used_[i]) {
                used_[i] = true;
                slots_[i].clear();
                set_in_use(+1);
                return static_cast<int32_t>(i);
            }
        }
        return resource_exhausted_error("no free slot");
    }
    void release_slot(int32_t slot) override {
        if (used_.at(slot)) {
            used_[slot] = false;
            slots_[slot].clear();
            set_in_use(-1);
        }
    }
    void truncate_slot(int32_t slot, int32_t length) override {
        if (static_cast<size_t>(length) < slots_.at(slot).size()) {
            slots_[slot].resize(static_cast<size_t>(length));
        }
    }
    int32_t slot_length(int32_t slot) const override {
        return static_cast<int32_t>(slots_.at(slot).size());
    }
    double kv_use() const override {
        int64_t held = 0;
        for (const auto& s : slots_) {
            held += static_cast<int64_t>(s.size());
        }
        return options_.kv_tokens > 0 ? static_cast<double>(held) / options_.kv_tokens : 0.0;
    }

    Status forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) override {
        ForwardCall call;
        if (calls_++ == options_.fail_call) {
            return record(call, internal_error("injected failure"));
        }
        int64_t added = 0;
        for (const SequenceChunk& c : batch) {
            call.chunks.emplace_back(c.slot, static_cast<int32_t>(c.tokens.size()));
            if (c.slot < 0 || c.slot >= options_.slots || !used_[c.slot]) {
                return record(call, invalid_argument_error("bad slot"));
            }
            if (c.start_pos != slot_length(c.slot) || c.tokens.empty()) {
                return record(call, invalid_argument_error("bad start_pos"));
            }
            if (c.start_pos + static_cast<int64_t>(c.tokens.size()) > options_.max_context) {
                return record(call, invalid_argument_error("context overflow"));
            }
            for (TokenId t : c.tokens) {
                if (t < 0 || t >= options_.vocab_size) {
                    return record(call, invalid_argument_error("token out of range"));
                }
            }
            added += static_cast<int64_t>(c.tokens.size());
        }
        int64_t held = 0;
        for (const auto& s : slots_) {
            held += static_cast<int64_t>(s.size());
        }
        if (held + added > options_.kv_tokens) {
            return record(call, resource_exhausted_error("KV cache full"));
        }
        for (const SequenceChunk& c : batch) {
            auto& history = slots_[c.slot];
            history.insert(history.end(), c.tokens.begin(), c.tokens.end());
            const TokenId next = options_.next(history);
            const uint64_t h = hash_history(history);
            for (int32_t v = 0; v < options_.vocab_size; ++v) {
                // Small distinct noise below the chosen token's 10.
                logits->push_back(static_cast<float>((h >> (v % 48)) % 1000) / 1000.0f);
            }
            logits->at(logits->size() - options_.vocab_size + next) = 10.0f;
        }
        return record(call, ok_status());
    }

    // The tokens the fake produces greedily after `prompt`, `n` of them.
    static std::vector<TokenId> expected(const FakeOptions& options, std::vector<TokenId> prompt,
                                         int n) {
        std::vector<TokenId> out;
        for (int i = 0; i < n; ++i) {
            const TokenId t = options.next(prompt);
            out.push_back(t);
            prompt.push_back(t);
        }
        return out;
    }

private:
    Status record(ForwardCall call, Status st) {
        call.ok = st.ok();
        std::lock_guard<std::mutex> lock(log_->mu);
        log_->calls.push_back(std::move(call));
        return st;
    }
    void set_in_use(int delta) {
        std::lock_guard<std::mutex> lock(log_->mu);
        log_->slots_in_use += delta;
    }

    FakeOptions options_;
    std::shared_ptr<FakeLog> log_;
    ModelSpec spec_;
    std::vector<std::vector<TokenId>> slots_;
    std::vector<bool> used_;
    int calls_ = 0;
};

}  // namespace edge::engine::testing
