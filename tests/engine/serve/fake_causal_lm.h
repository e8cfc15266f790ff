#pragma once

// FakeCausalLM: a deterministic stand-in for a loaded model, so the scheduler can be tested
// without weights. The next token is a function of the whole token history of a slot (default:
// a hash mapped to printable ASCII), so feeding wrong positions or mixing sequences up changes
// the output. It runs on a real paged KvCache (PagedCausalLM) that stores each position's token
// id, and reads a slot's history back through its block table, so wrong block tables, a bad
// prefix-cache hit or a write into a shared block change the output. It enforces the CausalLM
// contract (start_pos equals the slot length, ids in range, context limit) and the KV budget
// (kResourceExhausted, nothing changed).
// Every forward() is recorded in a shared log the test keeps after the scheduler owns the model.
//
// Threading: like CausalLM, driven by one thread; the log has its own mutex.

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "engine/model/paged_attention.h"
#include "engine/model/paged_causal_lm.h"

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
    int64_t kv_tokens = 1 << 14;  // Tokens all slots together may hold (rounded up to blocks).
    int32_t block_tokens = 1;     // Positions per KV block.
    bool prefix_cache = true;     // Offer the prefix cache to the scheduler.
    std::vector<TokenId> eos = {509};
    NextToken next = default_next;
    int fail_call = -1;  // forward() call (0-based) that fails with kInternal; -1: none.
    int32_t nan_slot = -1;  // Slot whose logits are NaN from its second forward on; -1: none.
    // What nan_slot's faulty logits hold: NaN everywhere, or, when set, this value in one place
    // (+inf at the token after the chosen one, say).
    std::optional<float> fault_value;
    std::function<void()> on_forward;  // Called by each forward() (a test advances its clock).
    // Called by each forward() with its batch, before on_forward (a test charges its clock for
    // the batch's work).
    std::function<void(std::span<const SequenceChunk>)> on_batch;
    // for_each_host_task runs every task on a thread of its own, all at once (last first).
    bool host_threads = false;
};

struct ForwardCall {
    std::vector<std::pair<int32_t, int32_t>> chunks;  // (slot, tokens) in batch order.
    bool ok = true;
};

struct FakeLog {
    std::mutex mu;
    std::vector<ForwardCall> calls;
    int32_t slots_in_use = 0;
    int64_t most_host_tasks = 0;  // The largest for_each_host_task call.

    std::vector<ForwardCall> snapshot() {
        std::lock_guard<std::mutex> lock(mu);
        return calls;
    }
};

class FakeCausalLM final : public PagedCausalLM {
public:
    explicit FakeCausalLM(FakeOptions options, std::shared_ptr<FakeLog> log = nullptr)
        : options_(std::move(options)), log_(log ? log : std::make_shared<FakeLog>()) {
        spec_.architecture = "FakeForCausalLM";
        spec_.vocab_size = options_.vocab_size;
        spec_.max_context = options_.max_context;
        spec_.eos_token_ids = options_.eos;
        spec_.version = "fake";
        // One layer, one head of one value: the cache holds each position's token id, so the
        // history the next token depends on is read back through the block tables.
        const int64_t bt = options_.block_tokens;
        const int64_t blocks = (options_.kv_tokens + bt - 1) / bt;
        const Status st = create_kv_cache(1, 1, 1, options_.slots, options_.max_context,
                                          options_.block_tokens, blocks * bt * 2 * 4);
        if (!st.ok()) {
            std::abort();  // Test setup error.
        }
    }

    const ModelSpec& spec() const override { return spec_; }

    Result<int32_t> acquire_slot() override {
        auto slot = PagedCausalLM::acquire_slot();
        if (slot.ok()) {
            set_in_use(+1);
        }
        return slot;
    }
    void release_slot(int32_t slot) override {
        if (kv_->in_use(slot)) {
            PagedCausalLM::release_slot(slot);
            set_in_use(-1);
        }
    }
    int32_t kv_block_tokens() const override {
        return options_.prefix_cache ? kv_->block_tokens() : 0;
    }
    // Positions [0, length) of the slot as the cache holds them.
    std::vector<TokenId> history(int32_t slot, int32_t length) const {
        std::vector<float> rows(static_cast<size_t>(length));
        gather_keys(*kv_, slot, 0, 0, length, rows.data());
        return std::vector<TokenId>(rows.begin(), rows.end());
    }

    Status forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) override {
        ForwardCall call;
        for (const SequenceChunk& c : batch) {
            call.chunks.emplace_back(c.slot, static_cast<int32_t>(c.tokens.size()));
        }
        if (options_.on_batch) {
            options_.on_batch(batch);
        }
        if (options_.on_forward) {
            options_.on_forward();
        }
        if (calls_++ == options_.fail_call) {
            return record(call, internal_error("injected failure"));
        }
        int64_t n = 0;
        Status st = prepare_batch(batch, &n);
        if (!st.ok()) {
            return record(call, st);
        }
        for (const SequenceChunk& c : batch) {
            for (size_t j = 0; j < c.tokens.size(); ++j) {
                *kv_->key(c.slot, 0, 0, c.start_pos + static_cast<int32_t>(j)) =
                    static_cast<float>(c.tokens[j]);
            }
        }
        commit_batch(batch);
        for (const SequenceChunk& c : batch) {
            const int32_t len = static_cast<int32_t>(c.tokens.size());
            // A row per position with all_logits, else the last position's alone.
            for (int32_t j = c.all_logits ? 0 : len - 1; j < len; ++j) {
                const std::vector<TokenId> hist = history(c.slot, c.start_pos + j + 1);
                const TokenId next = options_.next(hist);
                const uint64_t h = hash_history(hist);
                for (int32_t v = 0; v < options_.vocab_size; ++v) {
                    // Small distinct noise below the chosen token's 10.
                    logits->push_back(static_cast<float>((h >> (v % 48)) % 1000) / 1000.0f);
                }
                logits->at(logits->size() - options_.vocab_size + next) = 10.0f;
                if (c.slot == options_.nan_slot && c.start_pos > 0 && options_.fault_value) {
                    logits->at(logits->size() - options_.vocab_size +
                               (next + 1) % options_.vocab_size) = *options_.fault_value;
                } else if (c.slot == options_.nan_slot && c.start_pos > 0) {
                    std::fill(logits->end() - options_.vocab_size, logits->end(),
                              std::numeric_limits<float>::quiet_NaN());
                }
            }
        }
        return record(call, ok_status());
    }

    void for_each_host_task(int64_t n, const std::function<void(int64_t)>& body) override {
        {
            std::lock_guard<std::mutex> lock(log_->mu);
            log_->most_host_tasks = std::max(log_->most_host_tasks, n);
        }
        if (!options_.host_threads) {
            PagedCausalLM::for_each_host_task(n, body);
            return;
        }
        std::vector<std::thread> threads;
        for (int64_t i = n - 1; i >= 0; --i) {
            threads.emplace_back([&body, i] { body(i); });
        }
        for (std::thread& t : threads) {
            t.join();
        }
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
    int calls_ = 0;
};

}  // namespace edge::engine::testing
