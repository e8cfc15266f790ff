#pragma once

// TokenBucket is a rate limiter on an injected time axis: it refills at `rate` units per second up
// to `capacity`, and may be charged into debt (for costs known only afterwards, such as tokens).
// Not thread-safe; TenantLimiter guards its buckets with a mutex.
//
// TenantLimiter enforces the per-tenant limits of the config (requests/s with burst, input and
// output tokens per minute, concurrent requests). admit() either rejects with a reason and the
// time until a retry can succeed, or returns a Lease that holds one concurrency slot until it is
// finished or destroyed. Output tokens are reserved at admission (the request's max_tokens, as
// OpenAI counts them) and what generation did not use is refunded at finish(), so concurrent
// requests cannot overshoot the output budget. Prompt tokens are known only after tokenizing:
// they are charged then (Lease::charge_prompt(): when the engine here, or the peer's that runs a
// forwarded request, accepted it), and admission waits while that bucket is in debt. State is
// kept per tenant name, so configure() (SIGHUP reload) keeps the counters of tenants that keep
// their name, and of a tenant renamed (a new name holding one of a removed tenant's keys); a
// tenant the reload removed keeps its state while its running requests' leases hold it
// (admissions use it for a few seconds more, a name configured again takes it back).
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "daemon/config.h"

namespace edge::daemon {

class TokenBucket {
public:
    // Starts full. `rate` units per second (> 0), `capacity` units (> 0).
    TokenBucket(double rate, double capacity, TimePoint now);

    // Takes `n` units when the level allows it and returns nullopt; otherwise takes nothing and
    // returns the wait until it would (rounded up to whole nanoseconds).
    std::optional<Duration> try_take(double n, TimePoint now);
    // Takes `n` units, going into debt (negative level) when there are not enough; a negative
    // `n` gives units back (up to the capacity).
    void charge(double n, TimePoint now);
    double capacity() const { return capacity_; }
    // Zero when the level is not negative, else the wait until it is back to zero.
    Duration debt_wait(TimePoint now);
    // Zero when the level is at least `n`, else the wait until it is.
    Duration wait_for_level(double n, TimePoint now);
    // New rate and capacity; the level is kept (capped at the new capacity).
    void reconfigure(double rate, double capacity, TimePoint now);
    double level(TimePoint now);

private:
    void refill(TimePoint now);
    Duration wait_for(double deficit) const;

    double rate_;
    double capacity_;
    double level_;
    TimePoint last_;
};

enum class RejectReason { kNone, kRequestRate, kInputTokens, kOutputTokens, kConcurrency };
// "requests_per_second", "input_tokens_per_minute", ... (the config key; a metrics label).
const char* reject_reason_name(RejectReason r);

class TenantLimiter {
    struct State;
    struct NameLeases;

public:
    explicit TenantLimiter(Clock& clock) : clock_(clock) {}

    // Replaces the limits; tenants are matched by name, and a name new here by its keys (the
    // state of a tenant left out that held one of them: a rename). Absent `tenants`: no limits
    // at all. A tenant left out keeps its state while its requests run (their leases hold it): a
    // request authenticated just before the change is still limited (for a few seconds:
    // kRetiredGrace), and a name that comes back in a later reload continues its counters.
    // `keep_others`: leave out no one (a reload's first half, before the tenant table changes:
    // a new tenant is never briefly unlimited).
    void configure(const std::optional<std::vector<TenantConfig>>& tenants,
                   bool keep_others = false);

    // Releases its concurrency slot once: at finish() or when destroyed. Thread-safe.
    class Lease {
    public:
        // `named`: the count of leases alive under the name it was admitted under (leases()).
        Lease(std::shared_ptr<State> state, int64_t reserved_output, TimePoint started,
              std::shared_ptr<NameLeases> named);
        ~Lease();
        Lease(const Lease&) = delete;
        Lease& operator=(const Lease&) = delete;
        // Charges the prompt's tokens as soon as they are known (the engine tokenized it), so
        // the tenant's next request already waits on them. Once; nothing after finish().
        void charge_prompt(int64_t prompt_tokens);
        // Charges the request's tokens (the prompt's less what charge_prompt() took, the output
        // against what admission reserved) and releases the slot; later calls do nothing.
        // Destroyed unfinished: the output reservation is refunded, a charged prompt is not.
        void finish(int64_t prompt_tokens, int64_t completion_tokens);
        // Why a request admitted was refused before it generated.
        enum class Refusal {
            kCapacity,  // No pool or site could take it, a full queue, overloaded.
            kRequest,   // The request itself (a prompt beyond the context, one the engine
                        // cannot take): the engine read and tokenized it.
        };
        // The request was refused after admission and never generated: its output
        // reservation and slot go back. Refused for capacity, the request-rate token and a
        // prompt charged already go back too (the tenant did nothing wrong); refused for
        // itself, they stay spent, so a stream of refused requests is held to the tenant's
        // rate and input limits like any other. Every refusal after admission ends its lease
        // here; later calls (and finish()) do nothing.
        // `prompt_tokens`: the prompt's length when the engine tokenized it before refusing;
        // a request refused for itself is charged that against input_tokens_per_minute.
        void refuse(Refusal why = Refusal::kCapacity, int64_t prompt_tokens = 0);

      private:
        enum class End { kFinished, kRefusedCapacity, kRefusedRequest };
        void settle(int64_t prompt_tokens, int64_t completion_tokens, End end);

        std::shared_ptr<State> state_;
        std::shared_ptr<NameLeases> named_;
        int64_t reserved_output_;
        TimePoint started_;
        int64_t charged_prompt_ = 0;  // Guarded by state_->mu, as is finished_.
        bool finished_ = false;
    };

    // A max_concurrent refusal's wait: the mean time a request holds its slot over the
    // requests holding one, within these bounds (the lower one until a request has ended).
    // docs/config.md and docs/api.md state them.
    static constexpr Duration kConcurrencyRetryMin = std::chrono::seconds(1);
    static constexpr Duration kConcurrencyRetryMax = std::chrono::seconds(60);

    struct Decision {
        // When rejected: the limit with the longest wait (the error's code, the metric label).
        RejectReason reason = RejectReason::kNone;
        // When rejected: until every limit that refused would admit it, the longest of their
        // waits. A rate's is exact; max_concurrent's an estimate (kConcurrencyRetryMin..Max).
        Duration retry_after{0};
        // Every limit that refused, in the order checked (max_concurrent, input tokens,
        // output tokens, request rate).
        std::vector<RejectReason> blocking;
        std::shared_ptr<Lease> lease;  // Set when admitted.
    };
    // A tenant without a configured entry (e.g. "anonymous") is admitted without limits; its
    // lease still counts it, by name, in running().
    // `max_output_tokens` (the request's max_tokens) is reserved from the output bucket: a
    // request waits (kOutputTokens, 429) until the bucket holds it. One larger than the whole
    // bucket could never pass: the caller refuses it first (output_budget()).
    Decision admit(const std::string& tenant, int64_t max_output_tokens = 0);
    // Whether admit(tenant) would refuse now whatever the request, taking nothing (no request
    // token, no slot; the lease is never set): refused by max_concurrent, input tokens in debt
    // or requests_per_second, with admit()'s reason, blocking list and Retry-After for a request
    // that reserves no output (an output bucket in debt is named and waited for beside them;
    // alone it refuses nothing here, as the wait there depends on the request's max_tokens).
    // The API asks it before reading a body, so a refused tenant costs no parsing. Advisory:
    // another request may change the state before admit(), which decides; a request's own
    // output reservation may make admit() wait longer than this says.
    Decision would_refuse(const std::string& tenant);
    // Spends one of `tenant`'s requests_per_second (into debt when none is left) for a request
    // refused for itself after its body was read, without admission (a body that does not
    // parse, a model it may not use, max_tokens beyond its limits): the site parsed it and
    // compiled its schemas, so a stream of such requests is held to the rate as admitted ones
    // are. Takes no slot and no tokens.
    void charge_request(const std::string& tenant);
    // The tenant's output_tokens_per_minute (0: unlimited); the most one request may reserve.
    int64_t output_budget(const std::string& tenant) const;

    // Requests holding a slot of `tenant`'s state now (whatever name admitted them: a renamed
    // tenant's new name counts those of its old one), unlimited ones too. For tests.
    int64_t running(const std::string& tenant) const;
    // Leases admitted under the name `tenant` that are not yet destroyed, whatever state they
    // hold now (a renamed tenant's old name counts the requests it still runs, which running()
    // of that name stops seeing once the name is let go). A request keeps its lease until it
    // has recorded its last metrics under that name: while this is above 0, a reload that
    // removed the name keeps its series.
    int64_t leases(const std::string& tenant) const;

private:
    struct NameLeases {
        std::atomic<int64_t> alive{0};
    };
    struct State {
        explicit State(Clock& c) : clock(c) {}
        Clock& clock;
        std::mutex mu;
        TenantConfig limits;
        std::optional<TokenBucket> requests;
        std::optional<TokenBucket> input_tokens;
        std::optional<TokenBucket> output_tokens;
        int64_t running = 0;
        // Moving average of how long a lease is held (0 until one ends): a request refused
        // at max_concurrent is told to retry when one of the running ones is likely done.
        double mean_lease_s = 0.0;
        void apply(const TenantConfig& config);
    };

    // admit()'s verdict on `state` now for `reserve` output tokens, under state.mu: every limit
    // that blocks and the longest wait. Takes nothing.
    static Decision refusals(State& state, double reserve, TimePoint now);
    // The state of a tenant whose name is not in `configured` (current or retired) that held
    // one of `tenant`'s keys and that no name in `taken` uses: `tenant` renamed it (the first
    // name in the config that holds one of them takes it). Null when none.
    std::shared_ptr<State> renamed_state(const TenantConfig& tenant,
                                         const std::set<std::string_view>& configured,
                                         const std::set<const State*>& taken) const;
    // The state kept under `tenant`'s name, or null. A retired tenant's state is found while a
    // lease holds it; for `admission`, only within kRetiredGrace of its removal.
    std::shared_ptr<State> find(const std::string& tenant, bool admission) const;
    // A lease for `tenant` admitted without limits, counted under its name (unlimited_).
    std::shared_ptr<Lease> unlimited_lease(const std::string& tenant,
                                           std::shared_ptr<NameLeases> named);
    // The lease count of the name `tenant` (named_), created when none is alive.
    std::shared_ptr<NameLeases> name_leases(const std::string& tenant);

    Clock& clock_;
    mutable std::mutex mu_;
    std::map<std::string, std::shared_ptr<State>> states_;
    // Tenants configure() left out, while a lease still holds their state, and when. Admission
    // uses one for kRetiredGrace only (requests authenticated just before the reload): requests
    // forwarded by peers under that name would otherwise keep removed limits alive forever. A
    // name configured again takes its live state back whenever it returns.
    // `hold` keeps the state for the grace even when no lease does: a request that
    // authenticated before the reload may reach admit() after it, and must find its limits
    // (with only the weak pointer, a tenant with nothing running lost its state at the reload
    // and that request was admitted without limits). Dropped once the grace is over.
    struct Retired {
        std::weak_ptr<State> state;
        TimePoint at;
        std::shared_ptr<State> hold;
    };
    static constexpr Duration kRetiredGrace = std::chrono::seconds(10);
    mutable std::map<std::string, Retired> retired_;
    // The leases of tenants admitted without limits (no configured entry: "anonymous" while
    // authentication is off), by name, only to count them (running()): a state without limits,
    // kept while a lease holds it.
    std::map<std::string, std::weak_ptr<State>> unlimited_;
    // Per name admitted under, the count its leases share (leases()); an entry no lease holds
    // any more is dropped at the next configure().
    std::map<std::string, std::weak_ptr<NameLeases>> named_;
};

}  // namespace edge::daemon
