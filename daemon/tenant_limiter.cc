#include "daemon/tenant_limiter.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace edge::daemon {

TokenBucket::TokenBucket(double rate, double capacity, TimePoint now)
    : rate_(rate), capacity_(capacity), level_(capacity), last_(now) {}

void TokenBucket::refill(TimePoint now) {
    if (now > last_) {
        level_ = std::min(capacity_, level_ + to_seconds(now - last_) * rate_);
        last_ = now;
    }
}

Duration TokenBucket::wait_for(double deficit) const {
    double ns = std::ceil(deficit / rate_ * 1e9);
    // Bounded: limits are at most 2^40 units and rates at least 1 per minute.
    return Duration(static_cast<int64_t>(std::min(ns, 1e18)));
}

std::optional<Duration> TokenBucket::try_take(double n, TimePoint now) {
    refill(now);
    if (level_ >= n) {
        level_ -= n;
        return std::nullopt;
    }
    return wait_for(n - level_);
}

void TokenBucket::charge(double n, TimePoint now) {
    refill(now);
    level_ = std::min(capacity_, level_ - n);
}

Duration TokenBucket::debt_wait(TimePoint now) { return wait_for_level(0.0, now); }

Duration TokenBucket::wait_for_level(double n, TimePoint now) {
    refill(now);
    return level_ >= n ? Duration(0) : wait_for(n - level_);
}

void TokenBucket::reconfigure(double rate, double capacity, TimePoint now) {
    refill(now);
    rate_ = rate;
    capacity_ = capacity;
    level_ = std::min(level_, capacity_);
}

double TokenBucket::level(TimePoint now) {
    refill(now);
    return level_;
}

const char* reject_reason_name(RejectReason r) {
    switch (r) {
        case RejectReason::kNone: return "none";
        case RejectReason::kRequestRate: return "requests_per_second";
        case RejectReason::kInputTokens: return "input_tokens_per_minute";
        case RejectReason::kOutputTokens: return "output_tokens_per_minute";
        case RejectReason::kConcurrency: return "max_concurrent";
    }
    return "none";
}

namespace {

void set_bucket(std::optional<TokenBucket>& bucket, double rate, double capacity, TimePoint now) {
    if (rate <= 0) {
        bucket.reset();
    } else if (bucket) {
        bucket->reconfigure(rate, capacity, now);
    } else {
        bucket.emplace(rate, capacity, now);
    }
}

}  // namespace

void TenantLimiter::State::apply(const TenantConfig& config) {
    TimePoint now = clock.now();
    limits = config;
    double rps = config.requests_per_second;
    // Without a burst, the rate's whole requests, and at least one (a rate below 1/s).
    double burst = config.burst > 0 ? static_cast<double>(config.burst)
                                    : std::max(1.0, std::floor(rps));
    set_bucket(requests, rps, burst, now);
    double in = static_cast<double>(config.input_tokens_per_minute);
    set_bucket(input_tokens, in / 60.0, in, now);
    double out = static_cast<double>(config.output_tokens_per_minute);
    set_bucket(output_tokens, out / 60.0, out, now);
}

void TenantLimiter::configure(const std::optional<std::vector<TenantConfig>>& tenants,
                              bool keep_others) {
    std::lock_guard lock(mu_);
    std::map<std::string, std::shared_ptr<State>> next;
    std::set<const State*> taken;  // A state serves one configured name.
    auto take = [&](const std::string& name, std::shared_ptr<State> state) {
        if (!state || !taken.insert(state.get()).second) {
            return false;
        }
        next[name] = std::move(state);
        return true;
    };
    const std::vector<TenantConfig> none;
    const std::vector<TenantConfig>& configured = tenants ? *tenants : none;
    std::set<std::string_view> names;  // A set: a reload of thousands of tenants stays n log n.
    for (const TenantConfig& t : configured) {
        names.insert(t.name);
    }
    // Each tenant's own state by name first, then a removed one's of that name (back while its
    // old requests run), then, for a name that has none, the state of a tenant this leaves out
    // that held one of its keys: a rename keeps the counters and the running requests, or it
    // would start with full buckets and free slots, over max_concurrent while the requests under
    // the old name still run.
    for (const TenantConfig& t : configured) {
        if (auto it = states_.find(t.name); it != states_.end()) {
            take(t.name, it->second);
        }
    }
    for (const TenantConfig& t : configured) {
        if (auto r = retired_.find(t.name); r != retired_.end() && !next.contains(t.name)) {
            take(t.name, r->second.state.lock());
        }
    }
    for (const TenantConfig& t : configured) {
        if (!next.contains(t.name) && !take(t.name, renamed_state(t, names, taken))) {
            take(t.name, std::make_shared<State>(clock_));
        }
    }
    for (const TenantConfig& t : configured) {
        State& state = *next.at(t.name);
        {
            std::lock_guard state_lock(state.mu);
            state.apply(t);
        }
        retired_.erase(t.name);
    }
    const TimePoint now = clock_.now();
    for (auto& [name, state] : states_) {
        if (!next.contains(name)) {
            if (keep_others) {
                next[name] = state;
            } else {
                retired_[name] = Retired{state, now, state};
            }
        }
    }
    for (auto& [name, r] : retired_) {
        if (now - r.at >= kRetiredGrace) {
            r.hold.reset();
        }
    }
    // A renamed tenant's old name goes after the grace, though its state lives on.
    std::erase_if(retired_, [&](const auto& entry) {
        const std::shared_ptr<State> state = entry.second.state.lock();
        return !state || (now - entry.second.at >= kRetiredGrace && taken.contains(state.get()));
    });
    std::erase_if(named_, [](const auto& entry) { return entry.second.expired(); });
    states_ = std::move(next);
}

std::shared_ptr<TenantLimiter::State> TenantLimiter::renamed_state(
    const TenantConfig& tenant, const std::set<std::string_view>& configured,
    const std::set<const State*>& taken) const {
    auto left_out = [&](const std::string& name) { return !configured.contains(name); };
    auto holds_key = [&](const State& state) {
        // `limits` changes only in configure(), under mu_ (held here).
        return std::any_of(state.limits.api_key_sha256.begin(), state.limits.api_key_sha256.end(),
                           [&](const std::string& hash) {
                               return std::find(tenant.api_key_sha256.begin(),
                                                tenant.api_key_sha256.end(),
                                                hash) != tenant.api_key_sha256.end();
                           });
    };
    for (const auto& [name, state] : states_) {
        if (left_out(name) && !taken.contains(state.get()) && holds_key(*state)) {
            return state;
        }
    }
    for (const auto& [name, r] : retired_) {
        std::shared_ptr<State> state = r.state.lock();
        if (state && left_out(name) && !taken.contains(state.get()) && holds_key(*state)) {
            return state;
        }
    }
    return nullptr;
}

std::shared_ptr<TenantLimiter::State> TenantLimiter::find(const std::string& tenant,
                                                          bool admission) const {
    std::lock_guard lock(mu_);
    if (auto it = states_.find(tenant); it != states_.end()) {
        return it->second;
    }
    auto it = retired_.find(tenant);
    if (it == retired_.end()) {
        return nullptr;
    }
    if (clock_.now() - it->second.at >= kRetiredGrace) {
        it->second.hold.reset();  // Over: only leases keep it now.
        if (admission) {
            return nullptr;
        }
    }
    return it->second.state.lock();
}

int64_t TenantLimiter::output_budget(const std::string& tenant) const {
    std::shared_ptr<State> state = find(tenant, /*admission=*/true);
    if (!state) {
        return 0;
    }
    std::lock_guard lock(state->mu);
    return state->output_tokens ? state->limits.output_tokens_per_minute : 0;
}

TenantLimiter::Decision TenantLimiter::refusals(State& state, double reserve, TimePoint now) {
    Decision d;
    // Every limit that blocks is checked, the request rate too, and the longest wait is the one
    // reported: the request passes only once all of them allow it, so a client following
    // Retry-After is not refused again by another limit in line. Nothing is taken here, so a
    // refusal spends no request.
    auto blocked = [&](RejectReason reason, Duration wait) {
        if (wait <= Duration(0)) {
            return;
        }
        d.blocking.push_back(reason);
        if (d.reason == RejectReason::kNone || wait > d.retry_after) {
            d.reason = reason;
            d.retry_after = wait;
        }
    };
    if (state.limits.max_concurrent > 0 && state.running >= state.limits.max_concurrent) {
        // One of `running` requests is likely done in mean / running (1 s before any ended).
        const double wait_s = std::clamp(state.mean_lease_s / static_cast<double>(state.running),
                                         to_seconds(kConcurrencyRetryMin),
                                         to_seconds(kConcurrencyRetryMax));
        blocked(RejectReason::kConcurrency,
                std::chrono::duration_cast<Duration>(std::chrono::duration<double>(wait_s)));
    }
    if (state.input_tokens) {
        blocked(RejectReason::kInputTokens, state.input_tokens->debt_wait(now));
    }
    if (state.output_tokens) {
        blocked(RejectReason::kOutputTokens, state.output_tokens->wait_for_level(reserve, now));
    }
    if (state.requests) {
        blocked(RejectReason::kRequestRate, state.requests->wait_for_level(1.0, now));
    }
    return d;
}

TenantLimiter::Decision TenantLimiter::would_refuse(const std::string& tenant) {
    std::shared_ptr<State> state = find(tenant, /*admission=*/true);
    if (!state) {
        return {};
    }
    std::lock_guard lock(state->mu);
    Decision d = refusals(*state, 0.0, clock_.now());
    // The output bucket waits until it holds the request's own reservation (its max_tokens, in
    // the body): alone it is admit()'s to answer, or the Retry-After given here would be short
    // and a client following it refused again. Beside a limit that refuses here, its debt (the
    // wait for any reservation) counts towards the one Retry-After.
    if (std::all_of(d.blocking.begin(), d.blocking.end(),
                    [](RejectReason r) { return r == RejectReason::kOutputTokens; })) {
        return {};
    }
    return d;
}

void TenantLimiter::charge_request(const std::string& tenant) {
    std::shared_ptr<State> state = find(tenant, /*admission=*/true);
    if (!state) {
        return;
    }
    std::lock_guard lock(state->mu);
    if (state->requests) {
        state->requests->charge(1.0, clock_.now());
    }
}

TenantLimiter::Decision TenantLimiter::admit(const std::string& tenant,
                                             int64_t max_output_tokens) {
    // Before the state's lock: name_leases() takes mu_, which configure() holds while it locks
    // a state.
    std::shared_ptr<NameLeases> named = name_leases(tenant);
    std::shared_ptr<State> state = find(tenant, /*admission=*/true);
    if (!state) {
        Decision d;
        d.lease = unlimited_lease(tenant, std::move(named));
        return d;
    }
    std::lock_guard lock(state->mu);
    TimePoint now = clock_.now();
    // The reservation: at most the bucket's capacity, so a wait always ends.
    const double reserve =
        state->output_tokens
            ? std::min(static_cast<double>(std::max<int64_t>(max_output_tokens, 0)),
                       state->output_tokens->capacity())
            : 0.0;
    Decision d = refusals(*state, reserve, now);
    if (d.reason != RejectReason::kNone) {
        return d;
    }
    if (state->requests) {
        state->requests->charge(1.0, now);
    }
    if (state->output_tokens) {
        state->output_tokens->charge(reserve, now);
    }
    ++state->running;
    d.lease = std::make_shared<Lease>(std::move(state), static_cast<int64_t>(reserve), now,
                                      std::move(named));
    return d;
}

std::shared_ptr<TenantLimiter::NameLeases> TenantLimiter::name_leases(const std::string& tenant) {
    std::lock_guard lock(mu_);
    std::weak_ptr<NameLeases>& kept = named_[tenant];
    std::shared_ptr<NameLeases> named = kept.lock();
    if (!named) {
        named = std::make_shared<NameLeases>();
        kept = named;
    }
    return named;
}

std::shared_ptr<TenantLimiter::Lease> TenantLimiter::unlimited_lease(
    const std::string& tenant, std::shared_ptr<NameLeases> named) {
    std::shared_ptr<State> state;
    {
        std::lock_guard lock(mu_);
        std::weak_ptr<State>& kept = unlimited_[tenant];
        state = kept.lock();
        if (!state) {
            // Its limits stay the defaults: no bucket, no max_concurrent.
            state = std::make_shared<State>(clock_);
            kept = state;
            // Names whose requests all ended: the map holds only those running.
            std::erase_if(unlimited_, [](const auto& entry) { return entry.second.expired(); });
        }
    }
    std::lock_guard lock(state->mu);
    ++state->running;
    const TimePoint now = clock_.now();
    return std::make_shared<Lease>(std::move(state), 0, now, std::move(named));
}

int64_t TenantLimiter::leases(const std::string& tenant) const {
    std::shared_ptr<NameLeases> named;
    {
        std::lock_guard lock(mu_);
        if (auto it = named_.find(tenant); it != named_.end()) {
            named = it->second.lock();
        }
    }
    return named ? named->alive.load() : 0;
}

int64_t TenantLimiter::running(const std::string& tenant) const {
    int64_t n = 0;
    if (std::shared_ptr<State> state = find(tenant, /*admission=*/false)) {
        std::lock_guard lock(state->mu);
        n += state->running;
    }
    std::shared_ptr<State> unlimited;
    {
        std::lock_guard lock(mu_);
        if (auto it = unlimited_.find(tenant); it != unlimited_.end()) {
            unlimited = it->second.lock();
        }
    }
    if (unlimited) {
        // Admitted while the name had no limits (before a reload configured it, say).
        std::lock_guard lock(unlimited->mu);
        n += unlimited->running;
    }
    return n;
}

void TenantLimiter::Lease::charge_prompt(int64_t prompt_tokens) {
    if (!state_ || prompt_tokens <= 0) {
        return;
    }
    std::lock_guard lock(state_->mu);
    if (finished_ || charged_prompt_ > 0) {
        return;
    }
    charged_prompt_ = prompt_tokens;
    if (state_->input_tokens) {
        state_->input_tokens->charge(static_cast<double>(prompt_tokens), state_->clock.now());
    }
}

void TenantLimiter::Lease::finish(int64_t prompt_tokens, int64_t completion_tokens) {
    settle(prompt_tokens, completion_tokens, End::kFinished);
}

void TenantLimiter::Lease::refuse(Refusal why, int64_t prompt_tokens) {
    settle(prompt_tokens, 0,
           why == Refusal::kCapacity ? End::kRefusedCapacity : End::kRefusedRequest);
}

void TenantLimiter::Lease::settle(int64_t prompt_tokens, int64_t completion_tokens, End end) {
    const bool refused = end != End::kFinished;
    const bool given_back = end == End::kRefusedCapacity;
    if (!state_) {
        return;
    }
    std::lock_guard lock(state_->mu);
    if (finished_) {
        return;
    }
    finished_ = true;
    TimePoint now = state_->clock.now();
    if (given_back && state_->requests) {
        state_->requests->charge(-1.0, now);  // Refused for capacity: the request is given back.
    }
    if (state_->input_tokens) {
        // What charge_prompt() did not take already (a destroyed lease's 0: nothing more); a
        // request refused for capacity gives back what it took, one refused for itself is
        // charged what the engine read (the prompt it tokenized before refusing it).
        const int64_t rest =
            given_back
                ? -charged_prompt_
                : std::max<int64_t>(std::max<int64_t>(prompt_tokens, 0) - charged_prompt_, 0);
        if (rest != 0) {
            state_->input_tokens->charge(static_cast<double>(rest), now);
        }
    }
    if (state_->output_tokens) {
        // Against the reservation: what was not generated goes back.
        state_->output_tokens->charge(
            static_cast<double>(std::max<int64_t>(completion_tokens, 0) - reserved_output_), now);
    }
    --state_->running;
    if (!refused) {  // A request that never ran says nothing of how long requests hold a slot.
        const double held_s = std::chrono::duration<double>(now - started_).count();
        state_->mean_lease_s = state_->mean_lease_s == 0.0
                                   ? held_s
                                   : 0.8 * state_->mean_lease_s + 0.2 * held_s;
    }
}

TenantLimiter::Lease::Lease(std::shared_ptr<State> state, int64_t reserved_output,
                            TimePoint started, std::shared_ptr<NameLeases> named)
    : state_(std::move(state)),
      named_(std::move(named)),
      reserved_output_(reserved_output),
      started_(started) {
    if (named_) {
        named_->alive.fetch_add(1);
    }
}

TenantLimiter::Lease::~Lease() {
    finish(0, 0);
    if (named_) {
        named_->alive.fetch_sub(1);
    }
}

}  // namespace edge::daemon
