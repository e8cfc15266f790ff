#include "engine/sched/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "common/log.h"
#include "engine/backend.h"
#include "engine/sched/prefix_hash.h"

namespace edge::engine::sched {

Scheduler::Scheduler(std::unique_ptr<CausalLM> model, const tokenizer::Tokenizer* tokenizer,
                     SchedulerConfig config)
    : model_(std::move(model)),
      tokenizer_(tokenizer),
      config_(std::move(config)),
      clock_(config_.clock != nullptr ? config_.clock : &SystemClock::instance()),
      waiting_(config_.fair_quantum_tokens) {
    config_.max_batch_sequences = std::max(config_.max_batch_sequences, 1);
    config_.max_batch_tokens = std::max(config_.max_batch_tokens, 1);
    // A step budget no larger than the batch would go to decodes in admission order, every
    // step, and newer sequences would never prefill: then the tenants' weights pick half the
    // budget's decoders and the rest is left for prefill (daemon config refuses such budgets).
    if (config_.max_decode_sequences <= 0 &&
        config_.max_batch_tokens <= config_.max_batch_sequences) {
        config_.max_decode_sequences = std::max(config_.max_batch_tokens / 2, 1);
    }
    if (config_.prefix_secret.empty()) {
        std::random_device entropy;
        for (int i = 0; i < 8; ++i) {
            const uint32_t r = entropy();
            config_.prefix_secret.append(reinterpret_cast<const char*>(&r), sizeof(r));
        }
    }
    serving_.model = config_.model_name;
    // The cache's size is known from the start; the gauges need not wait for the first step.
    const KvCacheStats kv = model_->kv_stats();
    serving_.kv_blocks_total = kv.blocks_total;
    serving_.kv_budget_bytes = kv.budget_bytes;
}

Scheduler::~Scheduler() { stop(); }

Result<std::shared_ptr<GenerationHandle>> Scheduler::submit(SequenceRequest request) {
    auto seq = std::make_unique<Sequence>(std::move(request), tokenizer_);
    seq->sampler.set_context(std::span<const TokenId>(seq->tokens).first(
                                 static_cast<size_t>(seq->prompt_len)),
                             config_.eos_token_ids);
    seq->submitted_at = clock_->now();
    auto handle = std::make_shared<RequestHandle>(
        seq->control, static_cast<int64_t>(seq->prompt_len));
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) {
            return unavailable_error("the model is shutting down");
        }
        const std::string tenant = seq->tenant;
        // The tenant's own backlog: its sequences preempted for lack of KV room (or for another
        // tenant's fair share) wait for the server, not for its rate, and do not count. They do
        // count in max_queue below: work queued ahead of new requests, answered 503.
        if (config_.max_queue_per_tenant > 0 &&
            waiting_.tenant_new_size(tenant) >= static_cast<size_t>(config_.max_queue_per_tenant)) {
            std::lock_guard<std::mutex> stats_lock(stats_mu_);
            ++tenant_stats(tenant).rejected_queue_full;
            return resource_exhausted_error(
                "tenant '" + tenant + "' already has " +
                std::to_string(config_.max_queue_per_tenant) +
                " requests waiting for this model (its queue limit)");
        }
        if (waiting_.size() >= static_cast<size_t>(std::max(config_.max_queue, 0))) {
            std::lock_guard<std::mutex> stats_lock(stats_mu_);
            ++tenant_stats(tenant).rejected_model_queue_full;
            return unavailable_error("the model's queue is full (" +
                                     std::to_string(config_.max_queue) +
                                     " requests waiting); retry later");
        }
        const double rate = prefill_rate_.load(std::memory_order_relaxed) +
                            decode_rate_.load(std::memory_order_relaxed);
        if (config_.max_queue_wait.count() > 0 && rate > 0.0 && !waiting_.empty()) {
            const double wait_s =
                static_cast<double>(waiting_.queued_cost() + FairQueue::cost(*seq)) / rate;
            const double limit_s = static_cast<double>(config_.max_queue_wait.count()) / 1000.0;
            if (wait_s > limit_s) {
                std::lock_guard<std::mutex> stats_lock(stats_mu_);
                ++tenant_stats(tenant).rejected_queue_wait;
                return unavailable_error(
                    "the model is overloaded: the estimated queue wait of " +
                    std::to_string(std::llround(wait_s * 1000)) +
                    " ms exceeds the limit of " + std::to_string(config_.max_queue_wait.count()) +
                    " ms; retry later");
            }
        }
        waiting_.push_back(std::move(seq));
        std::lock_guard<std::mutex> stats_lock(stats_mu_);
        ++tenant_stats(tenant).queued;
    }
    cv_.notify_one();
    return std::shared_ptr<GenerationHandle>(std::move(handle));
}

void Scheduler::start() {
    thread_ = std::thread([this] { run(); });
}

void Scheduler::stop() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
    // Whatever is left (also when driven by step() without a thread) ends as cancelled.
    for (auto& seq : running_) {
        if (!seq->finished) {
            finish(seq.get(), FinishReason::kCancelled);
        }
    }
    running_.clear();
    std::vector<std::unique_ptr<Sequence>> left;
    {
        std::lock_guard<std::mutex> lock(mu_);
        left = waiting_.take_if([](const Sequence&) { return true; });
    }
    for (auto& seq : left) {
        finish(seq.get(), FinishReason::kCancelled);
    }
}

void Scheduler::run() {
    while (true) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
            if (stopping_) {
                return;
            }
        }
        step();
    }
}

bool Scheduler::step() {
    sweep_cancelled();
    remove_finished();
    const bool stuck = admit();
    stats_.max_running = std::max(stats_.max_running, static_cast<int32_t>(running_.size()));
    if (running_.empty()) {
        const bool progressed = stuck && fail_unadmittable();
        // Idle now (the last sequences finished or were cancelled): the advertised load says so.
        publish_load(0, 0, {});
        return progressed;
    }
    // The batch about to run, before its forward: a watchdog that reads batch_sequences 0
    // (published when the scheduler last went idle) takes a stalled first step after a quiet
    // spell for an idle engine (daemon/liveness.cc), and its layers_run never moves.
    publish_batch();
    std::vector<BatchEntry> batch = plan_batch();
    std::vector<float>& logits = logits_;
    const TimePoint started = clock_->now();
    if (!forward_with_preemption(&batch, &logits)) {
        remove_finished();
        publish_load(0, 0, {});
        return true;
    }
    const auto elapsed = clock_->now() - started;
    ++stats_.steps;
    const size_t vocab = static_cast<size_t>(model_->spec().vocab_size);
    int64_t prefill_tokens = 0;
    int64_t decode_tokens = 0;
    size_t row = 0;  // The batch entry's first row of logits.
    for (size_t i = 0; i < batch.size(); ++i) {
        Sequence* seq = batch[i].seq;
        const size_t rows = wants_all_logits(*seq) ? static_cast<size_t>(batch[i].count) : 1;
        if (wants_all_logits(*seq)) {
            record_prompt_logprobs(seq, std::span<const float>(logits.data() + row * vocab,
                                                               rows * vocab));
        }
        const int32_t before = seq->computed;
        seq->computed += batch[i].count;
        add_service(seq);
        seq->mark_computed(before, seq->computed);  // Not cached, even if attached before.
        // A chunk of one token after the prompt is a decode step; anything else is prefill,
        // also a chunk that recomputes generated tokens after a preemption: counted as decode
        // tokens, it would inflate the decode rate that routing and max_queue_wait read just
        // when the KV cache thrashes.
        const bool decoding = batch[i].count == 1 && before >= seq->prompt_len;
        (decoding ? decode_tokens : prefill_tokens) += batch[i].count;
        // Positions below the most this sequence ever held were computed before and dropped
        // by a preemption without a saved copy (what the prefix cache still held was attached
        // instead, and never reaches a chunk).
        stats_.recompute_tokens +=
            std::max(0, std::min(seq->computed, seq->computed_most) - before);
        seq->computed_most = std::max(seq->computed_most, seq->computed);
        publish_prefix(seq);
        row += rows;
        if (seq->pending() == 0) {
            Emission e;
            e.seq = seq;
            e.logits = std::span<float>(logits.data() + (row - 1) * vocab, vocab);
            emissions_.push_back(std::move(e));
        }
    }
    // Sampling costs a few passes over the vocabulary per sequence (0.2 ms at 150k ids with
    // top-p): the sequences of a step are sampled in parallel, then emitted in batch order.
    model_->for_each_host_task(static_cast<int64_t>(emissions_.size()),
                               [this](int64_t i) { sample_token(&emissions_[i]); });
    for (Emission& e : emissions_) {
        emit_token(e);
    }
    emissions_.clear();
    if (logits_.capacity() > static_cast<size_t>(std::max(config_.max_batch_sequences, 1)) * vocab) {
        std::vector<float>().swap(logits_);  // Grown by a step with a prompt's every row.
    }
    account_decodes(batch);
    remove_finished();
    publish_load(prefill_tokens, decode_tokens, elapsed);
    return true;
}

void Scheduler::publish_batch() {
    size_t queued = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        queued = waiting_.size();
    }
    std::lock_guard<std::mutex> lock(stats_mu_);
    serving_.batch_sequences = static_cast<int64_t>(running_.size());
    serving_.queued = static_cast<int64_t>(queued);
}

void Scheduler::publish_load(int64_t prefill_tokens, int64_t decode_tokens,
                             std::chrono::steady_clock::duration elapsed) {
    running_count_.store(static_cast<uint32_t>(running_.size()), std::memory_order_relaxed);
    kv_use_.store(model_->kv_use(), std::memory_order_relaxed);
    publish_batch();
    {
        const KvCacheStats kv = model_->kv_stats();
        std::optional<shard::ShardStats> shard = model_->shard_stats();
        std::lock_guard<std::mutex> lock(stats_mu_);
        if (shard) {
            serving_.expert_tokens = std::move(shard->expert_tokens);
        }
        serving_.kv_use = model_->kv_use();
        serving_.kv_blocks_total = kv.blocks_total;
        serving_.kv_blocks_used = kv.blocks_used;
        serving_.kv_blocks_cached = kv.blocks_cached;
        serving_.kv_budget_bytes = kv.budget_bytes;
        serving_.kv_swap_bytes = swap_use_->load();
        serving_.preempt_recompute_tokens = stats_.recompute_tokens;
        serving_.steps = stats_.steps;
    }
    const double seconds = std::chrono::duration<double>(elapsed).count();
    if (seconds <= 0.0) {
        return;
    }
    // Each rate moves a quarter of the way to the latest step's rate, only when the step did
    // that kind of work (a pure decode step says nothing about prefill speed).
    auto moved = [seconds](double old, int64_t tokens) {
        const double now = static_cast<double>(tokens) / seconds;
        return old == 0.0 ? now : old + 0.25 * (now - old);
    };
    auto update = [&](std::atomic<double>& rate, int64_t tokens) {
        if (tokens != 0) {
            rate.store(moved(rate.load(std::memory_order_relaxed), tokens),
                       std::memory_order_relaxed);
        }
    };
    update(prefill_rate_, prefill_tokens);
    update(decode_rate_, decode_tokens);
    // The speeds routing costs a request at (gossiped). Rates of whole steps cannot give them:
    // a step that also decoded, or computed a few uncached tokens of a cached prompt, divides a
    // handful of prompt tokens by the whole step's time (a GPU pool that prefills at 20000
    // tokens/s advertised 1000 and was routed away from), and its decode tokens by time spent on
    // prefill. Steps that only prefilled, enough to time, give a prefill speed, but under
    // sustained mixed load there are none and it went stale: the step cost fit tells both apart
    // from mixed steps.
    if (decode_tokens == 0 && prefill_tokens >= kPrefillSpeedSample) {
        sampled_prefill_speed_ = moved(sampled_prefill_speed_, prefill_tokens);
    }
    step_cost_.observe(prefill_tokens, decode_tokens, seconds);
    if (decode_tokens > 0) {
        decode_batch_ = decode_tokens;
    }
    const double prefill = step_cost_.prefill_tokens_per_s();
    prefill_speed_.store(prefill > 0.0 ? prefill : sampled_prefill_speed_,
                         std::memory_order_relaxed);
    const double decode = step_cost_.decode_tokens_per_s(decode_batch_);
    decode_speed_.store(decode > 0.0 ? decode : decode_rate_.load(std::memory_order_relaxed),
                        std::memory_order_relaxed);
}

ServingStats Scheduler::serving_stats() const {
    ServingStats s;
    {
        std::lock_guard<std::mutex> lock(stats_mu_);
        s = serving_;
    }
    // Read now, not at the last step's end: it moves while a step runs.
    s.layers_run = model_->layers_run();
    return s;
}

TenantServingStats& Scheduler::tenant_stats(const std::string& tenant) {
    return serving_.tenants[tenant];
}

ModelLoad Scheduler::load() const {
    ModelLoad load;
    {
        std::lock_guard<std::mutex> lock(mu_);
        load.queue_depth = static_cast<uint32_t>(waiting_.size());
    }
    load.running = running_count_.load(std::memory_order_relaxed);
    load.capacity = static_cast<uint32_t>(config_.max_batch_sequences);
    load.kv_use = kv_use_.load(std::memory_order_relaxed);
    load.prefill_tokens_per_s = prefill_speed_.load(std::memory_order_relaxed);
    load.decode_tokens_per_s = decode_speed_.load(std::memory_order_relaxed);
    load.max_queue = static_cast<uint32_t>(std::max(config_.max_queue, 0));
    return load;
}

void Scheduler::sweep_cancelled() {
    for (auto& seq : running_) {
        if (!seq->finished && seq->control->cancelled.load(std::memory_order_relaxed)) {
            finish(seq.get(), FinishReason::kCancelled);
        }
    }
    std::vector<std::unique_ptr<Sequence>> cancelled;
    {
        std::lock_guard<std::mutex> lock(mu_);
        cancelled = waiting_.take_if([](const Sequence& seq) {
            return seq.control->cancelled.load(std::memory_order_relaxed);
        });
    }
    for (auto& seq : cancelled) {
        finish(seq.get(), FinishReason::kCancelled);
    }
}

std::vector<Scheduler::BatchEntry> Scheduler::plan_batch() {
    std::vector<BatchEntry> batch;
    decode_backlogged_.clear();  // Only this plan's picks count (a re-plan replaces them).
    int32_t budget = config_.max_batch_tokens;
    // Decode steps first: they keep latency low for requests already streaming. With
    // max_decode_sequences set and more ready than it, the tenants' weights pick which.
    std::vector<Sequence*> ready;
    for (const auto& seq : running_) {
        if (seq->pending() == 1) {
            ready.push_back(seq.get());
        }
    }
    const int32_t limit = config_.max_decode_sequences;
    const int32_t take = limit > 0 ? std::min(budget, limit) : budget;
    if (limit > 0 && static_cast<int32_t>(ready.size()) > take) {
        pick_decoders(std::move(ready), take, &batch);
    } else {
        for (size_t i = 0; i < ready.size() && static_cast<int32_t>(i) < take; ++i) {
            batch.push_back({ready[i], 1});
        }
    }
    budget -= static_cast<int32_t>(batch.size());
    // Then prefill chunks, oldest admission first (running_ is in admission order). The first
    // of the sequences sharing a prompt block computes it; the others wait for it (even when the
    // budget leaves the first none this step), so none of them waits on one that waits.
    computing_.clear();
    for (const auto& seq : running_) {
        if (seq->pending() <= 1 || awaits_shared_prefix(seq.get(), computing_)) {
            continue;
        }
        computing_.push_back(seq.get());
        if (budget > 0) {
            const int32_t n = std::min(seq->pending(), budget);
            batch.push_back({seq.get(), n});
            budget -= n;
        }
    }
    return batch;
}

double Scheduler::least_decode_pass() const {
    double least = 0.0;
    bool any = false;
    for (const auto& [tenant, pass] : decode_pass_) {
        least = any ? std::min(least, pass) : pass;
        any = true;
    }
    return least;
}

void Scheduler::pick_decoders(std::vector<Sequence*> ready, int32_t limit,
                              std::vector<BatchEntry>* batch) {
    // Per tenant, its ready sequences least recently decoded first (then oldest admission).
    std::stable_sort(ready.begin(), ready.end(), [](const Sequence* a, const Sequence* b) {
        if (a->tenant != b->tenant) {
            return a->tenant < b->tenant;
        }
        return a->last_decode_step < b->last_decode_step;
    });
    struct Turn {
        size_t next;  // Index into ready of the tenant's next sequence.
        size_t end;
        double pass;
        double stride;
    };
    std::vector<Turn> turns;
    const double floor = least_decode_pass();
    for (size_t i = 0; i < ready.size();) {
        size_t j = i;
        while (j < ready.size() && ready[j]->tenant == ready[i]->tenant) {
            ++j;
        }
        const auto it = decode_pass_.find(ready[i]->tenant);
        turns.push_back({i, j, it != decode_pass_.end() ? it->second : floor,
                         1.0 / static_cast<double>(std::max(ready[i]->tenant_weight, 1))});
        i = j;
    }
    for (int32_t n = 0; n < limit; ++n) {
        Turn* best = nullptr;
        for (Turn& t : turns) {
            if (t.next < t.end && (best == nullptr || t.pass < best->pass)) {
                best = &t;
            }
        }
        if (best == nullptr) {
            break;
        }
        batch->push_back({ready[best->next++], 1});
        best->pass += best->stride;
    }
    decode_backlogged_.clear();
    for (const Turn& t : turns) {
        if (t.next < t.end) {
            decode_backlogged_.push_back(ready[t.next]->tenant);
        }
    }
}

void Scheduler::account_decodes(const std::vector<BatchEntry>& batch) {
    if (config_.max_decode_sequences <= 0) {
        return;
    }
    // Tenants that joined start at the smallest pass of those already running.
    const double floor = least_decode_pass();
    for (const BatchEntry& e : batch) {
        if (e.count != 1 || e.seq->computed <= e.seq->prompt_len) {
            continue;  // Prefill.
        }
        auto [it, inserted] = decode_pass_.try_emplace(e.seq->tenant, floor);
        it->second += 1.0 / static_cast<double>(std::max(e.seq->tenant_weight, 1));
        e.seq->last_decode_step = static_cast<uint64_t>(stats_.steps);
    }
    // A tenant that had fewer sequences ready than its share keeps no credit for the slots it
    // could not use: its pass is raised to one token (of weight 1) below the least pass of the
    // tenants the limit held back. Otherwise, once its sequences are ready again, it would take
    // every slot it can until the others' passes are caught up, and a light tenant that took
    // the spare slots meanwhile would get none for many steps (bench_tenancy --batch 64
    // --decode 36: the weight-1 tenant's inter-token latency p99 was 8.5x its median).
    if (!decode_backlogged_.empty()) {
        double held = 0.0;
        bool found = false;
        for (const std::string& tenant : decode_backlogged_) {
            const auto it = decode_pass_.find(tenant);
            const double p = it != decode_pass_.end() ? it->second : floor;
            held = found ? std::min(held, p) : p;
            found = true;
        }
        for (auto& [tenant, pass] : decode_pass_) {
            pass = std::max(pass, held - 1.0);
        }
        decode_backlogged_.clear();
    }
    // Forget tenants with nothing running (they rejoin at the floor, without a backlog of
    // credit); rebase the passes so they stay small.
    std::erase_if(decode_pass_, [&](const auto& entry) {
        for (const auto& seq : running_) {
            if (!seq->finished && seq->tenant == entry.first) {
                return false;
            }
        }
        return true;
    });
    const double low = least_decode_pass();
    for (auto& [tenant, pass] : decode_pass_) {
        pass -= low;
    }
}

bool Scheduler::forward_with_preemption(std::vector<BatchEntry>* batch,
                                        std::vector<float>* logits) {
    while (true) {
        std::vector<SequenceChunk> chunks;
        chunks.reserve(batch->size());
        size_t rows = 0;
        for (const BatchEntry& e : *batch) {
            const bool all = wants_all_logits(*e.seq);
            chunks.push_back(
                SequenceChunk{e.seq->slot, e.seq->computed,
                              std::span<const TokenId>(e.seq->tokens.data() + e.seq->computed,
                                                       static_cast<size_t>(e.count)),
                              all});
            rows += all ? static_cast<size_t>(e.count) : 1;
        }
        logits->clear();
        Status st = model_->forward(chunks, logits);
        if (st.ok()) {
            // A lost device (sticky CUDA error) may have left garbage in the logits: the batch
            // ends with the device's error instead of sampling from them.
            st = device_health();
        }
        const size_t want = rows * static_cast<size_t>(model_->spec().vocab_size);
        if (st.ok() && logits->size() == want) {
            return true;
        }
        if (st.ok()) {
            st = internal_error("forward returned " + std::to_string(logits->size()) +
                                " logits for a batch that needs " + std::to_string(want));
        }
        if (st.code() == StatusCode::kResourceExhausted && running_.size() > 1) {
            preempt_victim();
            *batch = plan_batch();
            continue;
        }
        // The cache cannot hold even one sequence alone, or the model failed: the sequences of
        // this batch end with the error; others stay. A full cache is the server's capacity,
        // not the client's rate: unavailable (503), which the API does not answer as a 429.
        if (st.code() == StatusCode::kResourceExhausted) {
            st = unavailable_error(st.message());
        }
        for (const BatchEntry& e : *batch) {
            finish(e.seq, FinishReason::kError, st);
        }
        return false;
    }
}

bool Scheduler::wants_all_logits(const Sequence& seq) {
    // Until the prompt went out: a sequence recomputed after a preemption needs them no more.
    return seq.prompt_logprobs && !seq.prompt_sent && seq.computed < seq.prompt_len;
}

void Scheduler::record_prompt_logprobs(Sequence* seq, std::span<const float> logits) {
    const size_t vocab = static_cast<size_t>(model_->spec().vocab_size);
    // A pass over the vocabulary per row (0.3 ms at 150k ids), thousands of rows in a chunk:
    // rows in parallel on the host threads, as sampling is, each writing its own position.
    model_->for_each_host_task(
        static_cast<int64_t>(logits.size() / vocab), [&](int64_t task) {
            const size_t j = static_cast<size_t>(task);
            // Row j predicts the token after position computed + j.
            const size_t next = static_cast<size_t>(seq->computed) + j + 1;
            if (next >= static_cast<size_t>(seq->prompt_len) ||
                !std::isnan(seq->prompt_lp[next].logprob)) {
                return;  // Past the prompt, or known from before a preemption.
            }
            thread_local std::vector<float> lp;  // A row's, reused by the thread.
            sampling::log_softmax(logits.subspan(j * vocab, vocab), &lp);
            TokenLogprob& out = seq->prompt_lp[next];
            out.logprob = lp[static_cast<size_t>(seq->tokens[next])];
            out.top.clear();
            for (TokenId id : sampling::top_n(lp, seq->params.top_logprobs)) {
                out.top.push_back(
                    TopLogprob{std::string(tokenizer_->token_bytes(id)), id, lp[id]});
            }
        });
}

void Scheduler::send_prompt(Sequence* seq) {
    seq->prompt_sent = true;
    size_t offset = 0;
    for (size_t p = 0; p < seq->prompt_lp.size(); ++p) {
        TokenLogprob& t = seq->prompt_lp[p];
        t.id = seq->tokens[p];
        t.token = std::string(tokenizer_->token_bytes(t.id));
        t.text_offset = offset;
        offset += t.token.size();
    }
    seq->sink->on_prompt(std::move(seq->prompt_lp));
    seq->prompt_lp.clear();
}

bool Scheduler::is_eos(TokenId id) const {
    return std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), id) !=
           config_.eos_token_ids.end();
}

void Scheduler::sample_token(Emission* e) const {
    Sequence* seq = e->seq;
    // NaN weights in a checkpoint (or a numeric fault) would otherwise pick token 0 forever;
    // +inf (an overflow) is the same fault. -inf is a logit masked out.
    if (std::any_of(e->logits.begin(), e->logits.end(), [](float x) {
            return std::isnan(x) || x == std::numeric_limits<float>::infinity();
        })) {
        e->nan = true;
        return;
    }
    sampling::TokenFilter json_filter;
    if (seq->json) {
        // Tokens that keep the output a valid JSON document's beginning; no special token inside
        // the document (the end of sequence included: the reply ends when it closes), while the
        // model's markers may spell a head or tail (a forced tool call's), and GLM-4.5's markers
        // around argument pairs.
        json_filter = [&, check = sampling::JsonTokenCheck(*seq->json)](TokenId id) mutable {
            const std::string_view bytes = tokenizer_->token_bytes(id);
            return tokenizer_->is_special(id) ? seq->json->accepts_marker(bytes) : check(bytes);
        };
    } else if (!seq->params.json.trigger.empty()) {
        // Free text until the trigger (a tool call's opening); a token that completes it and
        // goes on must go on as one of the heads does.
        json_filter = [&](TokenId id) {
            const std::string_view bytes = tokenizer_->token_bytes(id);
            const size_t at = seq->trigger_end(bytes);
            return at == std::string::npos ||
                   sampling::JsonPrefix(seq->params.json).accepts(bytes.substr(at));
        };
    }
    e->token = seq->sampler.sample(e->logits, json_filter ? &json_filter : nullptr);
}

void Scheduler::emit_token(Emission& e) {
    Sequence* seq = e.seq;
    if (e.nan) {
        finish(seq, FinishReason::kError,
               internal_error("the model produced NaN or infinite logits at generated token " +
                              std::to_string(seq->generated()) +
                              " (NaN or Inf in the checkpoint's weights?)"));
        return;
    }
    if (seq->echo_prompt && !seq->prompt_sent) {
        send_prompt(seq);
    }
    const sampling::SampledToken& sampled = e.token;
    if (sampled.id < 0) {
        finish(seq, FinishReason::kError,
               internal_error(std::string(seq->json ? "no token of the vocabulary continues the "
                                                      "JSON reply"
                                                    : "every logit is -inf") +
                              " at generated token " + std::to_string(seq->generated())));
        return;
    }
    seq->follow_json(tokenizer_->token_bytes(sampled.id));  // The filter let it through.
    seq->tokens.push_back(sampled.id);
    {
        const TimePoint now = clock_->now();
        std::lock_guard<std::mutex> lock(stats_mu_);
        TenantServingStats& t = tenant_stats(seq->tenant);
        ++t.generated_tokens;
        if (seq->generated() == 1) {
            t.ttft.observe(std::chrono::duration<double>(now - seq->submitted_at).count());
        } else {
            t.inter_token.observe(std::chrono::duration<double>(now - seq->last_token_at).count());
        }
        seq->last_token_at = now;
    }

    TokenDelta delta;
    delta.token_ids.push_back(sampled.id);
    const size_t token_start = seq->decoded_bytes;
    // Decoded text goes through the stop matcher; what it lets through is shown.
    auto show = [&](std::string text) {
        seq->decoded_bytes += text.size();
        // Stop strings count from the token after min_tokens (as vLLM's), like the end of
        // sequence.
        std::string shown = seq->stop.push(text, seq->generated() > seq->params.min_tokens);
        seq->shown_bytes += shown.size();
        delta.text += shown;
    };
    std::optional<FinishReason> reason;
    const bool ends_at_eos = !seq->params.ignore_eos && is_eos(sampled.id);
    const std::vector<TokenId>& stop_ids = seq->params.stop_token_ids;
    if (ends_at_eos) {
        // The end-of-sequence token is counted and its id reported, but it has no text.
        show(seq->decoder.flush());
        reason = FinishReason::kStop;
    } else {
        show(seq->decoder.push(sampled.id));
        if (seq->stop.stopped()) {
            reason = FinishReason::kStop;
        } else if (std::find(stop_ids.begin(), stop_ids.end(), sampled.id) != stop_ids.end() ||
                   (seq->json && seq->json->complete())) {
            // A stop token id ends the reply with its text (none for a special token); so does
            // the token that closes a JSON answer (response_format; a forced tool call, whose
            // prefix stays; a triggered one's is dropped and the reply goes on).
            show(seq->decoder.flush());
            reason = FinishReason::kStop;
        } else if (seq->generated() >= seq->params.max_tokens) {
            show(seq->decoder.flush());
            reason = seq->stop.stopped() ? FinishReason::kStop : FinishReason::kLength;
        }
    }
    if (reason && !seq->stop.stopped()) {
        std::string rest = seq->stop.flush();
        seq->shown_bytes += rest.size();
        delta.text += rest;
    }
    if (seq->params.logprobs || seq->params.top_logprobs > 0) {
        // As OpenAI's, the logprobs' tokens join to the content: a skipped special token's is
        // empty, and the one that ends the reply without text (the end of sequence, a special
        // stop token id) has none.
        const bool shows = seq->decoder.shows(sampled.id);
        if (!ends_at_eos && !(reason == FinishReason::kStop && !shows)) {
            TokenLogprob lp;
            lp.id = sampled.id;
            lp.token = shows ? std::string(tokenizer_->token_bytes(sampled.id)) : std::string();
            lp.logprob = sampled.logprob;
            lp.text_offset = token_start;
            for (const auto& [id, value] : sampled.top) {
                lp.top.push_back(TopLogprob{std::string(tokenizer_->token_bytes(id)), id, value});
            }
            seq->held_logprobs.push_back(std::move(lp));
        }
        // A logprob goes out once some of its token's text is shown, or once nothing is held
        // (by the stop matcher, or by the decoder as part of a character, which a stop string
        // may still take); those still held when a stop string ends the sequence belong to text
        // never shown.
        const bool nothing_held = seq->stop.held_bytes() == 0 &&
                                  seq->decoder.pending_bytes() == 0 && !seq->stop.stopped();
        while (!seq->held_logprobs.empty() &&
               (nothing_held || seq->held_logprobs.front().text_offset < seq->shown_bytes)) {
            delta.logprobs.push_back(std::move(seq->held_logprobs.front()));
            seq->held_logprobs.pop_front();
        }
    }
    seq->sink->on_delta(std::move(delta));
    if (reason) {
        finish(seq, *reason);
    }
}

void Scheduler::finish(Sequence* seq, FinishReason reason, Status error) {
    // Prefix hits are counted once the sequence ends, when it is known which attached positions
    // it never computed (Sequence::cached_tokens), so the counters agree with its usage.
    const int32_t cached = seq->cached_tokens();
    stats_.prefix_hit_tokens += cached;
    {
        std::lock_guard<std::mutex> lock(stats_mu_);
        TenantServingStats& t = tenant_stats(seq->tenant);
        --(seq->slot >= 0 ? t.running : t.queued);
        t.prompt_tokens += seq->prompt_len;
        t.prefix_hit_tokens += cached;
        t.end_to_end.observe(
            std::chrono::duration<double>(clock_->now() - seq->submitted_at).count());
    }
    if (seq->slot >= 0) {
        model_->release_slot(seq->slot);
        seq->slot = -1;
        // Admission charged max_tokens; what it did not use goes back to its tenant.
        std::lock_guard<std::mutex> lock(mu_);
        waiting_.refund(*seq, int64_t{seq->params.max_tokens} - seq->generated());
        // Its KV blocks are free: admission, closed by a KV preemption, may try again. (A
        // request that never ran frees none: reopening then would preempt again at once.)
        admission_blocked_ = false;
    }
    seq->finished = true;
    Finish f;
    f.reason = reason;
    f.usage.prompt_tokens = seq->prompt_len;
    f.usage.completion_tokens = seq->generated();
    f.usage.cached_tokens = cached;
    f.error = std::move(error);
    seq->sink->on_finish(std::move(f));
}

void Scheduler::remove_finished() {
    std::erase_if(running_, [](const auto& seq) { return seq->finished; });
}

}  // namespace edge::engine::sched
