#pragma once

// Scheduler runs one model's requests with continuous batching at iteration level. Each step it
// admits waiting requests while the model has free slots (and the batch has room), choosing
// between tenants by deficit round robin on tokens weighted by tenant_weight and first come first
// served within a tenant (FairQueue), then runs one
// CausalLM::forward over every running sequence: a decode token for each sequence that is
// generating and prefill chunks for new ones, within max_batch_tokens (chunked prefill, decode
// first). Each sequence whose tokens are all in the cache samples its next token and streams it
// to its sink (text through the incremental decoder and stop-string holdback, ids, logprobs);
// a finished sequence leaves the batch at once. When forward reports kResourceExhausted (KV cache
// full), the most recently admitted sequence is preempted (slot released, requeued at the front,
// recomputed later from its tokens), so every request still completes with the same tokens.
// cancel() takes effect at the next step (finish kCancelled).
//
// Threading: submit() is thread-safe. After start() one internal thread drives the model and calls
// the sinks; stop() (also run by the destructor) cancels every request and joins it. Without
// start(), tests may drive it with step() from one thread. The tokenizer must outlive it.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"
#include "engine/model/causal_lm.h"
#include "engine/sched/fair_queue.h"
#include "engine/sched/sequence.h"
#include "engine/tokenizer/tokenizer.h"

namespace edge::engine::sched {

struct SchedulerConfig {
    int32_t max_batch_sequences = 64;  // Sequences running at once at most.
    int32_t max_batch_tokens = 2048;   // Tokens per forward() (decode + prefill chunks).
    int32_t max_queue = 1024;          // Waiting requests before submit() says kResourceExhausted.
    int64_t fair_quantum_tokens = 512; // Tokens a weight-1 tenant may be admitted per DRR turn.
    std::vector<TokenId> eos_token_ids;  // Tokens that end generation (unless ignore_eos).
};

struct SchedulerStats {
    int64_t steps = 0;        // forward() calls that succeeded.
    int64_t preemptions = 0;  // Sequences evicted for lack of KV space.
    int32_t max_running = 0;  // Largest batch seen, in sequences.
};

class Scheduler {
public:
    Scheduler(std::unique_ptr<CausalLM> model, const tokenizer::Tokenizer* tokenizer,
              SchedulerConfig config);
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    const ModelSpec& spec() const { return model_->spec(); }

    // Queues a request; kResourceExhausted when max_queue requests are already waiting.
    Result<std::shared_ptr<GenerationHandle>> submit(SequenceRequest request);

    void start();
    // Cancels everything still queued or running (finish kCancelled) and joins the thread.
    void stop();

    // One iteration on the calling thread (only when not started). False when there was
    // nothing to do.
    bool step();

    // Counters; read from the driving thread (or after stop()).
    const SchedulerStats& stats() const { return stats_; }

    // Live load (everything but the name); thread-safe, cheap.
    ModelLoad load() const;

private:
    struct BatchEntry {
        Sequence* seq;
        int32_t count;  // Tokens fed this step.
    };

    void run();
    bool fail_unadmittable();
    void sweep_cancelled();
    void admit();
    std::vector<BatchEntry> plan_batch() const;
    // Runs forward, preempting on KV exhaustion; false when the step failed (sequences errored).
    bool forward_with_preemption(std::vector<BatchEntry>* batch, std::vector<float>* logits);
    void preempt_newest();
    void emit_token(Sequence* seq, std::span<float> logits);
    void finish(Sequence* seq, FinishReason reason, Status error = ok_status());
    void remove_finished();
    bool is_eos(TokenId id) const;
    // Publishes running count, KV use and token rates after a step that computed
    // `prefill_tokens` prompt tokens and `decode_tokens` generated ones in `elapsed`.
    void publish_load(int64_t prefill_tokens, int64_t decode_tokens,
                      std::chrono::steady_clock::duration elapsed);

    std::unique_ptr<CausalLM> model_;
    const tokenizer::Tokenizer* tokenizer_;
    SchedulerConfig config_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    FairQueue waiting_;                              // Guarded by mu_.
    bool stopping_ = false;                          // Guarded by mu_.

    // Scheduler-thread state.
    std::vector<std::unique_ptr<Sequence>> running_;
    uint64_t next_admission_ = 1;
    bool admission_blocked_ = false;  // After a preemption, until a sequence finishes.
    SchedulerStats stats_;
    std::thread thread_;

    // Published load (written by the scheduler thread, read by load()).
    std::atomic<uint32_t> running_count_{0};
    std::atomic<double> kv_use_{0.0};
    std::atomic<double> prefill_rate_{0.0};  // Tokens/s, exponentially weighted.
    std::atomic<double> decode_rate_{0.0};
};

}  // namespace edge::engine::sched
