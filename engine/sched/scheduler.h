#pragma once

// Scheduler runs one model's requests with continuous batching at iteration level. Each step it
// admits waiting requests while the model has free slots (and the batch has room), choosing
// between tenants by their places in the batch per weight, then by deficit round robin on tokens
// weighted by tenant_weight, first come first served within a tenant (FairQueue), then runs one
// CausalLM::forward over every running sequence: a decode token for each sequence that is
// generating and prefill chunks for new ones, within max_batch_tokens (chunked prefill, decode
// first). Each sequence whose tokens are all in the cache samples its next token and streams it
// to its sink (text through the incremental decoder and stop-string holdback, ids, logprobs);
// a finished sequence leaves the batch at once. When forward reports kResourceExhausted (KV blocks
// run out), the lowest-priority sequence is preempted (slot and blocks released, requeued first
// in its tenant's queue; its KV copied to host memory and put back when it is admitted again,
// within swap_bytes, else recomputed later from its tokens; prompt blocks it shares with other
// sequences through the prefix cache are not copied but attached again), so every request still
// completes; among equal priorities, one of the tenant holding the most places per weight, its
// most recently admitted. cancel() takes effect at the next step (finish kCancelled).
//
// Fair places in the batch: a tenant's level is its running sequences over its weight. A free
// place goes to the waiting tenants whose level with it would be lowest, by DRR among them (so
// DRR alone decides between tenants at the same level); except that it is time-shared to another
// waiting tenant, provided that no tenant is owed a place once it took it (nor one already owed:
// the place is that one's), when that tenant is further behind in tokens served
// per weight (served_: computed, or prompt tokens taken from the prefix cache) than each of the
// lowest ones. Without that, a tenant whose weight share of
// the batch is under one place (a weight below another's over max_batch_sequences) would get no
// place while the other has requests waiting, and a fraction of a place over a whole one would be
// rounded down for good; with it, such a tenant gets its weight's share of the tokens over time,
// at places that free (not by preemption). A waiting tenant is owed a place when,
// with one more, its level would still be no higher than another running tenant's level with one
// fewer; admitting as above leaves none owed, but a tenant that starts sending may be. When no
// place is free (max_batch_sequences or the model's slots taken, or a KV preemption since the
// last finish), the owed tenant furthest behind takes one: of the sequences of tenants that stay at
// or above its level without them, of no higher priority than its waiting request and running for
// at least fair_preempt_min_steps, the lowest priority, of the tenant with the highest level, the
// most recently admitted, is preempted as above, and the owed request is admitted in the same
// step (unless that request's saved KV would not fit even with the victim's blocks: then nothing
// is preempted and it waits for a sequence to finish). So a tenant with a few requests no longer
// waits for a tenant that holds every place to finish one. Each such move lowers
// sum(running^2 / weight), so places do not swap back and forth; a tenant with nothing waiting
// claims nothing, and what it leaves goes to the others.
//
// Prefix cache (models with a paged KV cache): at admission the prompt's full blocks are hashed as
// a chain salted per tenant (prefix_hash.h) and the longest cached run is attached to the slot, so
// prefill starts after it (Usage::cached_tokens: the prompt positions a request took from the cache
// at any of its admissions and never computed itself); as prefill completes prompt blocks they are
// published for later requests of the same tenant. A prefilling sequence whose next prompt block an
// earlier running sequence is computing (the same blocks: n choices of one request, or prompts
// arriving together with one system prompt) computes nothing until that block is published, then
// attaches it and goes on, so shared blocks are computed once. Admission control: a tenant with
// max_queue_per_tenant requests waiting for their first admission gets kResourceExhausted (429; its
// preempted sequences, requeued for the server's lack of room, do not count), a model with
// max_queue waiting (preempted ones included), or an estimated wait past max_queue_wait, gets
// kUnavailable (503). serving_stats() gives per-tenant counts and latency histograms.
//
// Threading: submit() is thread-safe. After start() one internal thread drives the model and calls
// the sinks; stop() (also run by the destructor) cancels every request and joins it. Without
// start(), tests may drive it with step() from one thread. The tokenizer must outlive it.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "engine/generator.h"
#include "engine/model/causal_lm.h"
#include "engine/sched/fair_queue.h"
#include "engine/sched/sequence.h"
#include "engine/sched/step_cost.h"
#include "engine/serving_stats.h"
#include "engine/tokenizer/tokenizer.h"

namespace edge::engine::sched {

struct SchedulerConfig {
    int32_t max_batch_sequences = 64;  // Sequences running at once at most.
    int32_t max_batch_tokens = 2048;   // Tokens per forward() (decode + prefill chunks).
    int32_t max_queue = 1024;          // Waiting requests (all tenants, preempted ones
                                       // included) before kUnavailable.
    int32_t max_queue_per_tenant = 0;  // Requests of one tenant waiting for their first
                                       // admission (not preempted ones) before
                                       // kResourceExhausted; 0: only max_queue applies.
    // Estimated queue wait beyond which submit() answers kUnavailable, so the queue sheds load
    // before it breaks latency targets: the tokens already queued (prompt + max_tokens each)
    // over the recent token rate. 0: off (also while no rate is measured yet).
    std::chrono::milliseconds max_queue_wait{0};
    int64_t fair_quantum_tokens = 512; // Tokens a weight-1 tenant may be admitted per DRR turn.
    // Sequences that decode one token in a step, at most; 0: every running sequence that is
    // decoding. When more are ready, tenants' weights pick them (stride order: each token a
    // tenant decodes advances its pass by 1 / weight, the smallest pass goes next), least
    // recently decoded first within a tenant. With max_batch_sequences above this, more
    // sequences stay admitted than decode per step, and the weights hold even when every
    // tenant's streams are all admitted. 0 with max_batch_tokens <= max_batch_sequences is taken
    // as max_batch_tokens / 2 (at least 1), so that (from a budget of 2) prefill still runs
    // while the batch decodes, and the weights pick the decoders.
    int32_t max_decode_sequences = 0;
    // Steps a sequence runs after its admission before it may be preempted for a tenant below
    // its fair share (so that a recomputed sequence makes progress before it can go again).
    int32_t fair_preempt_min_steps = 8;
    std::vector<TokenId> eos_token_ids;  // Tokens that end generation (unless ignore_eos).
    bool prefix_cache = true;          // Reuse cached prompt blocks (paged models only).
    // Host memory for the KV of preempted sequences, bytes: a preempted sequence's cached
    // positions are copied out and put back when it is admitted again, so it continues from the
    // same numbers (CausalLM::save_slot). One that does not fit, or a model whose cache is not in
    // host memory, is recomputed from its tokens instead. 0: always recompute.
    int64_t swap_bytes = 0;
    std::string prefix_secret;         // Server secret mixed into tenant salts; "": random.
    const Clock* clock = nullptr;      // Time for the latency histograms; null: SystemClock.
    std::string model_name;            // Name in serving_stats().
};

struct SchedulerStats {
    int64_t steps = 0;        // forward() calls that succeeded.
    int64_t preemptions = 0;  // Sequences evicted (for lack of KV space or for a fair share).
    int64_t fair_preemptions = 0;  // Of those, evicted for a tenant below its fair share.
    int64_t swapped_preemptions = 0;  // Of those, with their KV saved (swap_bytes).
    // Positions computed again because a preemption dropped them without saving them (or the
    // saved copy's shared prefix was evicted before the restore); those the prefix cache still
    // held at the next admission are attached, not computed, and not counted (nor are those of
    // a sequence that ends before it runs again).
    int64_t recompute_tokens = 0;
    int32_t max_running = 0;  // Largest batch seen, in sequences.
    int64_t prefix_query_tokens = 0;  // Prompt tokens looked up in the prefix cache.
    // Of those, the tokens taken from there and never computed by their request (a hit that
    // a preemption dropped and the request computed again is none), counted as requests end.
    int64_t prefix_hit_tokens = 0;
};

class Scheduler {
public:
    Scheduler(std::unique_ptr<CausalLM> model, const tokenizer::Tokenizer* tokenizer,
              SchedulerConfig config);
    ~Scheduler();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    const ModelSpec& spec() const { return model_->spec(); }

    // Queues a request; kResourceExhausted when its tenant has max_queue_per_tenant requests
    // waiting for their first admission (preempted ones are not counted), kUnavailable when
    // max_queue requests wait (preempted ones included) or the scheduler is stopping.
    Result<std::shared_ptr<GenerationHandle>> submit(SequenceRequest request);

    void start();
    // Cancels everything still queued or running (finish kCancelled) and joins the thread.
    void stop();

    // One iteration on the calling thread (only when not started). False when there was
    // nothing to do.
    bool step();

    // Counters; read from the driving thread (or after stop()).
    const SchedulerStats& stats() const { return stats_; }
    // Bytes the logits buffer kept between steps holds; read from the driving thread.
    size_t logits_buffer_bytes() const { return logits_.capacity() * sizeof(float); }

    // Live load (everything but the name); thread-safe, cheap.
    ModelLoad load() const;
    // Per-tenant counts and histograms; thread-safe.
    ServingStats serving_stats() const;
    // For tests: `tenant`'s tokens served per weight (see the top of this file), rebased at each
    // step's admission so that the least count of the tenants running or waiting is 0; read
    // from the driving thread.
    double served_for_test(const std::string& tenant) const;

private:
    struct BatchEntry {
        Sequence* seq;
        int32_t count;  // Tokens fed this step.
    };

    // A tenant's part in the batch: sequences running and waiting, and its weight.
    struct TenantLoad {
        int32_t running = 0;
        int64_t waiting = 0;
        int32_t weight = 1;
        // Places per weight with `delta` places more (or fewer).
        double level(int32_t delta) const {
            return static_cast<double>(running + delta) / static_cast<double>(weight);
        }
    };
    // A waiting tenant owed a place: its level with that place, and its next request's priority;
    // when that request was preempted with its KV saved, the KV blocks its restore takes.
    struct Claim {
        std::string tenant;
        double level = 0.0;
        int32_t priority = 0;
        int32_t restore_blocks = 0;  // Private blocks for the saved copy (past saved.shared).
        int32_t restore_shared = 0;  // Shared prefix blocks attached again first.
    };

    void run();
    // Fails the first waiting request: called when admit() found no free slot with nothing
    // running, which would otherwise spin the loop forever.
    bool fail_unadmittable();
    void sweep_cancelled();
    // Moves waiting requests into the running batch while places are free. True when requests
    // wait that no slot could take although nothing runs (every slot should then be free); a
    // request submitted after admit() looked at the queue is not that, and waits for the next
    // step.
    bool admit();
    // The next step's chunks (pick_decoders records which tenants it held back).
    std::vector<BatchEntry> plan_batch();
    // plan_batch's decoders when more than max_decode_sequences are ready (see SchedulerConfig).
    void pick_decoders(std::vector<Sequence*> ready, int32_t limit,
                       std::vector<BatchEntry>* batch);
    // Advances the decoding tenants' passes after a step; drops tenants no longer running.
    void account_decodes(const std::vector<BatchEntry>& batch);
    // The smallest of the running tenants' decode passes (0 when none).
    double least_decode_pass() const;
    // Runs forward, preempting on KV exhaustion; false when the step failed (sequences errored).
    bool forward_with_preemption(std::vector<BatchEntry>* batch, std::vector<float>* logits);
    // Preempts the lowest-priority running sequence: of those, one of the tenant with the most
    // places per weight, the most recently admitted.
    void preempt_victim();
    // Every tenant with sequences running or waiting.
    std::map<std::string, TenantLoad> tenant_loads(
        const std::vector<FairQueue::Backlog>& backlog) const;
    // Keeps served_ to the tenants with sequences running or waiting: one that came joins at the
    // least of the others' counts, one with neither is dropped.
    void track_service(const std::map<std::string, TenantLoad>& loads);
    // served_'s count for `tenant` (the least count when it has none yet).
    double served(const std::string& tenant) const;
    // Adds `seq`'s positions computed (or attached) past Sequence::served_most to its tenant's
    // count in served_, over its weight.
    void add_service(Sequence* seq);
    // The waiting tenant that a free place is time-shared to (see the top of this file), or ""
    // when it goes by places per weight; `least` is the lowest level with the place.
    std::string time_share_claim(const std::vector<FairQueue::Backlog>& backlog,
                                 const std::map<std::string, TenantLoad>& loads,
                                 double least) const;
    // The waiting tenants owed a place (see the top of this file), the furthest behind first.
    std::vector<Claim> owed_claims(const std::map<std::string, TenantLoad>& loads) const;
    // Preempts a sequence to make room for `claim` (see the top of this file); false when no
    // sequence may go, or when the claim's saved KV could not be restored even with the blocks
    // the victim frees.
    bool preempt_for_fairness(const Claim& claim, const std::map<std::string, TenantLoad>& loads);
    // Whether the claim's saved KV surely fits once `victim` is preempted: a lower bound on the
    // blocks free then against an upper bound on those restore_kv takes (kv_stats()).
    bool restore_fits(const Claim& claim, const Sequence& victim) const;
    // Releases the sequence's slot and requeues it first in its tenant's queue.
    void preempt(std::vector<std::unique_ptr<Sequence>>::iterator victim, bool for_fairness);
    // Copies a sequence's KV out before its slot is released, within swap_bytes; false when it
    // is to be recomputed instead.
    bool save_kv(Sequence* seq);
    // Puts a newly admitted sequence's saved KV into its slot, its shared prefix (not saved)
    // attached again from the prefix cache first; false when the cache cannot hold it while
    // others run (it must wait). A restore that fails otherwise, or a shared prefix evicted
    // meanwhile, means recomputing.
    bool restore_kv(Sequence* seq);
    // Attaches what the prefix cache holds of the sequence's prompt (when may_attach_prefix),
    // counting its prompt as a query at its first admission.
    void attach_prefix(Sequence* seq);
    void publish_prefix(Sequence* seq);
    // Whether the sequence's prompt may be taken from the prefix cache now: the cache is on, and
    // the prompt's logprobs, when asked for, are all known.
    bool may_attach_prefix(const Sequence& seq) const;
    // Leading blocks of the sequence's prefix chain it may take from the cache now.
    size_t attachable_blocks(const Sequence& seq) const;
    // In-batch prefix sharing, for a sequence that has computed whole blocks of its prompt:
    // attaches what the cache has gained since, then true when the next block it needs is one
    // that a sequence of `computing` (prefilling this step, admitted before it) is to compute,
    // so it waits for that block instead of computing it again.
    bool awaits_shared_prefix(Sequence* seq, std::span<Sequence* const> computing);
    TenantServingStats& tenant_stats(const std::string& tenant);  // stats_mu_ held.
    // A prompt whose logprobs are asked for takes logits for every position while it prefills.
    static bool wants_all_logits(const Sequence& seq);
    // The logprobs of the prompt tokens that rows of `logits` (from position seq->computed on)
    // predict, each recorded once.
    void record_prompt_logprobs(Sequence* seq, std::span<const float> logits);
    // GenerateRequest::echo_prompt: the prompt's tokens to the sink (once, before the first
    // delta).
    void send_prompt(Sequence* seq);
    // A token for a sequence from its row of logits: sampled first, for every sequence of the
    // step at once on the model's host threads (sample_token touches nothing but the sequence and
    // its row), then emitted in turn.
    struct Emission {
        Sequence* seq = nullptr;
        std::span<float> logits;
        bool nan = false;  // The row holds NaN: nothing was sampled.
        sampling::SampledToken token;
    };
    void sample_token(Emission* e) const;
    void emit_token(Emission& e);
    void finish(Sequence* seq, FinishReason reason, Status error = ok_status());
    void remove_finished();
    bool is_eos(TokenId id) const;
    // Publishes the running batch's size and the queue's (ServingStats batch_sequences, queued).
    void publish_batch();
    // Publishes running count, KV use and token rates after a step that computed
    // `prefill_tokens` prompt tokens and `decode_tokens` generated ones in `elapsed`
    // (publish_batch() included).
    void publish_load(int64_t prefill_tokens, int64_t decode_tokens,
                      std::chrono::steady_clock::duration elapsed);

    std::unique_ptr<CausalLM> model_;
    const tokenizer::Tokenizer* tokenizer_;
    std::vector<Emission> emissions_;  // This step's; kept to reuse its storage.
    SchedulerConfig config_;
    const Clock* clock_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    FairQueue waiting_;                              // Guarded by mu_.
    bool stopping_ = false;                          // Guarded by mu_.

    // Scheduler-thread state.
    std::vector<std::unique_ptr<Sequence>> running_;
    std::vector<Sequence*> computing_;  // plan_batch's prefilling sequences (awaits_shared_prefix).
    uint64_t next_admission_ = 1;
    bool admission_blocked_ = false;  // After a KV preemption, until a sequence finishes.
    // Bytes of SwappedKv held by preempted sequences (shared: a sequence may outlive a step).
    std::shared_ptr<std::atomic<int64_t>> swap_use_ = std::make_shared<std::atomic<int64_t>>(0);
    SchedulerStats stats_;
    // The last step's logits, kept so that a step reuses the buffer (batch x vocab floats, 4 MiB
    // at 32 x 32000) instead of allocating and faulting in a fresh one; not kept past one row per
    // sequence the batch may hold (a step with every prompt position's logits, for echoed prompt
    // logprobs, may need a chunk's rows: 1.2 GB for 2048 positions of a 152k vocabulary).
    std::vector<float> logits_;
    // Tokens served per weight for each tenant with sequences running or waiting (offset so that
    // a tenant joins at the least count), for time-shared places (see the top of this file):
    // those computed, and prompt tokens taken from the prefix cache at a first admission.
    std::map<std::string, double> served_;
    // max_decode_sequences: each running tenant's pass (decode tokens / weight, offset so that
    // a tenant joins at the smallest pass of those running).
    std::map<std::string, double> decode_pass_;
    // The tenants the last pick_decoders left ready sequences of (the limit, not their own
    // readiness, held them back).
    std::vector<std::string> decode_backlogged_;
    std::thread thread_;

    // The speeds advertised (ModelLoad) come from a fit of each step's time to its prefill and
    // decode tokens (StepCost), which stays current under mixed load; until it can tell them,
    // from the figures below. Scheduler-thread state.
    StepCost step_cost_;
    int64_t decode_batch_ = 0;  // Sequences the last step that decoded decoded.
    // Prompt tokens/s of steps that computed kPrefillSpeedSample or more prompt tokens and no
    // decode, exponentially weighted (0 until such a step ran): the prefill speed advertised
    // until the fit knows one.
    static constexpr int64_t kPrefillSpeedSample = 128;
    double sampled_prefill_speed_ = 0.0;

    // Published load (written by the scheduler thread, read by load() and submit()).
    std::atomic<uint32_t> running_count_{0};
    std::atomic<double> kv_use_{0.0};
    // Prompt and generated tokens per second of the steps that computed them (each step's tokens
    // over its whole time), exponentially weighted: together, how fast the queue drains
    // (max_queue_wait).
    std::atomic<double> prefill_rate_{0.0};
    std::atomic<double> decode_rate_{0.0};
    // ModelLoad::prefill_tokens_per_s: how fast this pool prefills a prompt, which routing costs
    // a prompt at (prompt_tokens / it): the marginal cost of a prompt token (StepCost), or
    // sampled_prefill_speed_ until the fit tells it.
    std::atomic<double> prefill_speed_{0.0};
    // ModelLoad::decode_tokens_per_s: the tokens per second, all sequences together, that a step
    // decoding decode_batch_ sequences and prefilling nothing would give (StepCost), or
    // decode_rate_ while the fit cannot tell. Routing divides the output tokens of the requests
    // ahead of a new one by it (how soon a slot frees on a busy pool), so it is the pool's decode
    // speed at its present batch, not lowered by the prefill chunks that shared its steps.
    std::atomic<double> decode_speed_{0.0};

    // Serving figures for metrics; guarded by stats_mu_ (taken after mu_, never before).
    mutable std::mutex stats_mu_;
    ServingStats serving_;
};

}  // namespace edge::engine::sched
