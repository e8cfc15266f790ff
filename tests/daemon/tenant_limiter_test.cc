// TokenBucket and TenantLimiter on a ManualClock: rates, bursts, token debt, concurrency slots and
// reconfiguration keeping counters.

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "common/clock.h"
#include "daemon/tenant_limiter.h"

using namespace edge;
using namespace edge::daemon;
using namespace std::chrono_literals;

namespace {

TenantConfig tenant(const std::string& name) {
    TenantConfig t;
    t.name = name;
    return t;
}

std::string source_file(const std::string& path) {
    std::ifstream in(std::string(EDGE_SOURCE_DIR) + "/" + path);
    REQUIRE_MESSAGE(in.good(), "cannot read " << path);
    std::stringstream text;
    text << in.rdbuf();
    // Lines joined: a sentence wrapped in the Markdown source reads as one.
    std::string joined = text.str();
    for (char& c : joined) {
        c = c == '\n' ? ' ' : c;
    }
    return joined;
}

// A limiter on a manual clock with tenant "a" at max_concurrent 2, both slots taken.
struct TwoRunning {
    TwoRunning() {
        TenantConfig a = tenant("a");
        a.max_concurrent = 2;
        limiter.configure(std::vector<TenantConfig>{a});
        one = limiter.admit("a");
        two = limiter.admit("a");
        REQUIRE(one.lease);
        REQUIRE(two.lease);
    }
    ManualClock clock;
    TenantLimiter limiter{clock};
    TenantLimiter::Decision one, two;
};

}  // namespace

TEST_CASE("token bucket: starts full, refills at the rate, caps at capacity, reports the wait") {
    ManualClock clock;
    TokenBucket b(2.0, 4.0, clock.now());  // 2 per second, 4 at most.
    for (int i = 0; i < 4; ++i) {
        CHECK_FALSE(b.try_take(1, clock.now()).has_value());
    }
    std::optional<Duration> wait = b.try_take(1, clock.now());
    REQUIRE(wait.has_value());
    CHECK(*wait == Duration(500ms));
    clock.advance(499ms);
    CHECK(b.try_take(1, clock.now()).has_value());
    clock.advance(1ms);
    CHECK_FALSE(b.try_take(1, clock.now()).has_value());
    clock.advance(1h);
    CHECK(b.level(clock.now()) == doctest::Approx(4.0));
    // Debt: charged beyond the level, repaid by time.
    b.charge(10, clock.now());
    CHECK(b.level(clock.now()) == doctest::Approx(-6.0));
    CHECK(b.debt_wait(clock.now()) == Duration(3s));
    clock.advance(3s);
    CHECK(b.debt_wait(clock.now()) == Duration(0));
    // Reconfigure keeps the level, capped.
    clock.advance(10s);
    b.reconfigure(1.0, 2.0, clock.now());
    CHECK(b.level(clock.now()) == doctest::Approx(2.0));
}

TEST_CASE("limiter: requests per second with burst, Retry-After time, other tenants unaffected") {
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.requests_per_second = 1;
    a.burst = 3;
    limiter.configure(std::vector<TenantConfig>{a, tenant("b")});
    for (int i = 0; i < 3; ++i) {
        TenantLimiter::Decision d = limiter.admit("a");
        CHECK(d.reason == RejectReason::kNone);
        REQUIRE(d.lease);
    }
    TenantLimiter::Decision over = limiter.admit("a");
    CHECK(over.reason == RejectReason::kRequestRate);
    CHECK(over.retry_after == Duration(1s));
    CHECK_FALSE(over.lease);
    for (int i = 0; i < 100; ++i) {
        CHECK(limiter.admit("b").reason == RejectReason::kNone);
    }
    CHECK(limiter.admit("anonymous").reason == RejectReason::kNone);  // Not configured.
    clock.advance(1s);
    CHECK(limiter.admit("a").reason == RejectReason::kNone);
    CHECK(limiter.admit("a").reason == RejectReason::kRequestRate);
}

TEST_CASE("limiter: a rate below one request per second admits one, then one per period") {
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.requests_per_second = 0.5;  // 30 a minute; no burst: one at a time.
    limiter.configure(std::vector<TenantConfig>{a});
    CHECK(limiter.admit("a").reason == RejectReason::kNone);
    TenantLimiter::Decision over = limiter.admit("a");
    CHECK(over.reason == RejectReason::kRequestRate);
    CHECK(over.retry_after == Duration(2s));
    clock.advance(2s);
    CHECK(limiter.admit("a").reason == RejectReason::kNone);
}

TEST_CASE("limiter: concurrency slots are released on finish and on destruction, once") {
    TwoRunning t;
    auto& [clock, limiter, one, two] = t;
    CHECK(limiter.running("a") == 2);
    TenantLimiter::Decision three = limiter.admit("a");
    CHECK(three.reason == RejectReason::kConcurrency);
    CHECK(three.retry_after > Duration(0));
    one.lease->finish(10, 10);
    one.lease->finish(10, 10);  // Twice: released once.
    CHECK(limiter.running("a") == 1);
    two.lease.reset();  // A cancelled request that never reported.
    CHECK(limiter.running("a") == 0);
    TenantLimiter::Decision four = limiter.admit("a");
    CHECK(four.reason == RejectReason::kNone);
    one.lease.reset();
    CHECK(limiter.running("a") == 1);
}

TEST_CASE("limiter: tokens per minute are charged at finish, in debt new requests wait") {
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.input_tokens_per_minute = 600;   // 10 per second.
    a.output_tokens_per_minute = 60;   // 1 per second.
    limiter.configure(std::vector<TenantConfig>{a});
    TenantLimiter::Decision d = limiter.admit("a");
    REQUIRE(d.lease);
    d.lease->finish(700, 10);  // 100 input tokens of debt.
    TenantLimiter::Decision over = limiter.admit("a");
    CHECK(over.reason == RejectReason::kInputTokens);
    CHECK(over.retry_after == Duration(10s));
    clock.advance(10s);
    TenantLimiter::Decision ok = limiter.admit("a");
    REQUIRE(ok.reason == RejectReason::kNone);
    ok.lease->finish(0, 100);  // Output: 60 - 10, refilled to 60, then - 100 = -40.
    TenantLimiter::Decision out = limiter.admit("a");
    CHECK(out.reason == RejectReason::kOutputTokens);
    CHECK(out.retry_after == Duration(40s));
}

TEST_CASE("limiter: a prompt charged once tokenized is not charged again at finish") {
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.input_tokens_per_minute = 600;  // 10 per second.
    limiter.configure(std::vector<TenantConfig>{a});
    TenantLimiter::Decision d = limiter.admit("a");
    REQUIRE(d.lease);
    d.lease->charge_prompt(700);  // 100 of debt while the request still runs.
    d.lease->charge_prompt(700);  // Once.
    TenantLimiter::Decision over = limiter.admit("a");
    CHECK(over.reason == RejectReason::kInputTokens);
    CHECK(over.retry_after == Duration(10s));
    d.lease->finish(720, 0);  // Only the 20 more it reports: 120 of debt.
    CHECK(limiter.admit("a").retry_after == Duration(12s));

    // Finished first (a request that ended before its acceptance was reported): nothing more.
    clock.advance(12s);
    TenantLimiter::Decision e = limiter.admit("a");
    REQUIRE(e.lease);
    e.lease->finish(0, 0);  // Its usage says no prompt (cancelled before tokenizing).
    e.lease->charge_prompt(600);
    CHECK(limiter.admit("a").reason == RejectReason::kNone);
    // Destroyed unfinished: the charged prompt stays charged.
    {
        TenantLimiter::Decision f = limiter.admit("a");
        REQUIRE(f.lease);
        f.lease->charge_prompt(50);
    }
    CHECK(limiter.admit("a").retry_after == Duration(5s));
}

TEST_CASE("limiter: with several limits in debt, Retry-After is the longest wait") {
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.input_tokens_per_minute = 600;  // 10 per second.
    a.output_tokens_per_minute = 60;  // 1 per second.
    a.max_concurrent = 1;
    limiter.configure(std::vector<TenantConfig>{a});
    TenantLimiter::Decision d = limiter.admit("a");
    REQUIRE(d.lease);
    TenantLimiter::Decision busy = limiter.admit("a");
    CHECK(busy.reason == RejectReason::kConcurrency);
    CHECK(busy.retry_after == Duration(1s));
    d.lease->finish(650, 100);  // Input 5 s of debt, output 40 s.
    TenantLimiter::Decision over = limiter.admit("a");
    CHECK(over.reason == RejectReason::kOutputTokens);
    CHECK(over.retry_after == Duration(40s));
    clock.advance(over.retry_after);  // A client that follows Retry-After is admitted.
    CHECK(limiter.admit("a").reason == RejectReason::kNone);
}

TEST_CASE("limiter: a refusal waits for the request rate too, and following it is admitted") {
    // Audit 7 F3: max_concurrent refused with Retry-After 1 s; a client that waited it was then
    // refused for requests_per_second (4 s more).
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.max_concurrent = 1;
    a.requests_per_second = 0.25;  // Burst 1: one request, then one per 4 s.
    limiter.configure(std::vector<TenantConfig>{a});
    TenantLimiter::Decision first = limiter.admit("a");
    REQUIRE(first.lease);
    clock.advance(1s);  // The one running request is likely done in 1 s (no history yet).
    TenantLimiter::Decision busy = limiter.admit("a");
    CHECK(busy.reason == RejectReason::kRequestRate);  // The longest wait: 3 s.
    CHECK(busy.retry_after == Duration(3s));
    CHECK(busy.blocking ==
          std::vector<RejectReason>{RejectReason::kConcurrency, RejectReason::kRequestRate});
    CHECK_FALSE(busy.lease);
    first.lease->finish(1, 1);
    // Refusals took no token: a client following Retry-After is admitted, not refused again.
    clock.advance(busy.retry_after);
    TenantLimiter::Decision after = limiter.admit("a");
    CHECK(after.reason == RejectReason::kNone);
    CHECK(after.blocking.empty());
    CHECK(after.lease);
    // The rate alone: one limit named.
    after.lease->finish(1, 1);
    TenantLimiter::Decision rate = limiter.admit("a");
    CHECK(rate.reason == RejectReason::kRequestRate);
    CHECK(rate.blocking == std::vector<RejectReason>{RejectReason::kRequestRate});
    CHECK(rate.retry_after == Duration(4s));
}

TEST_CASE("limiter: would_refuse answers as admit would and takes nothing") {
    // The API asks it before parsing a body: a tenant held back costs one bucket check.
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.max_concurrent = 1;
    a.requests_per_second = 0.25;  // Burst 1: one request, then one per 4 s.
    a.input_tokens_per_minute = 600;  // 10 per second.
    a.output_tokens_per_minute = 60;  // 1 per second.
    limiter.configure(std::vector<TenantConfig>{a});
    for (int i = 0; i < 10; ++i) {  // Asked again and again, it spends no token and no slot.
        TenantLimiter::Decision ok = limiter.would_refuse("a");
        CHECK(ok.reason == RejectReason::kNone);
        CHECK(ok.blocking.empty());
        CHECK_FALSE(ok.lease);
    }
    CHECK(limiter.running("a") == 0);
    CHECK(limiter.would_refuse("anonymous").reason == RejectReason::kNone);  // Not configured.
    TenantLimiter::Decision first = limiter.admit("a", 60);  // The whole output budget.
    REQUIRE(first.lease);

    // Rate and slot: the same verdict as admit's, and still nothing taken by either.
    clock.advance(1s);
    TenantLimiter::Decision peeked = limiter.would_refuse("a");
    TenantLimiter::Decision refused = limiter.admit("a");
    CHECK(peeked.reason == RejectReason::kRequestRate);
    CHECK(peeked.retry_after == Duration(3s));
    CHECK(peeked.blocking ==
          std::vector<RejectReason>{RejectReason::kConcurrency, RejectReason::kRequestRate});
    CHECK_FALSE(peeked.lease);
    CHECK(peeked.reason == refused.reason);
    CHECK(peeked.retry_after == refused.retry_after);
    CHECK(peeked.blocking == refused.blocking);
    CHECK(limiter.running("a") == 1);

    // Tokens in debt: input 600 - 700, output 1 - 40 (100 generated, 60 reserved); 3 s later
    // 7 s and 36 s to go. No reservation of its own: the output bucket refuses only in debt.
    first.lease->finish(700, 100);
    clock.advance(3s);
    peeked = limiter.would_refuse("a");
    CHECK(peeked.reason == RejectReason::kOutputTokens);
    CHECK(peeked.retry_after == Duration(36s));
    CHECK(peeked.blocking ==
          std::vector<RejectReason>{RejectReason::kInputTokens, RejectReason::kOutputTokens});
    CHECK(limiter.admit("a").retry_after == peeked.retry_after);
    // Output tokens alone are admit()'s to refuse: the wait depends on the request's max_tokens.
    clock.advance(7s);
    CHECK(limiter.would_refuse("a").reason == RejectReason::kNone);
    CHECK(limiter.would_refuse("a").blocking.empty());
    CHECK(limiter.admit("a").retry_after == Duration(29s));
    clock.advance(29s);
    CHECK(limiter.would_refuse("a").reason == RejectReason::kNone);
    CHECK(limiter.admit("a", 10).retry_after == Duration(10s));
    // Nothing was taken by the checks: the request token and the slot are there.
    TenantLimiter::Decision second = limiter.admit("a");
    CHECK(second.reason == RejectReason::kNone);
    CHECK(second.lease);
}

TEST_CASE("limiter: reconfigure keeps counters by name, removed tenants' leases stay valid") {
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.max_concurrent = 1;
    a.requests_per_second = 1;
    limiter.configure(std::vector<TenantConfig>{a});
    TenantLimiter::Decision held = limiter.admit("a");
    REQUIRE(held.lease);
    a.max_concurrent = 2;
    limiter.configure(std::vector<TenantConfig>{a});
    CHECK(limiter.running("a") == 1);
    // The request-rate bucket was spent before the reload and stays spent.
    CHECK(limiter.admit("a").reason == RejectReason::kRequestRate);
    clock.advance(1s);
    TenantLimiter::Decision second = limiter.admit("a");
    CHECK(second.reason == RejectReason::kNone);
    limiter.configure(std::vector<TenantConfig>{tenant("b")});
    // Removed, but its two requests still run: a request authenticated just before the reload
    // is still held to the old limits.
    CHECK(limiter.running("a") == 2);
    clock.advance(1s);
    CHECK(limiter.admit("a").reason == RejectReason::kConcurrency);
    // Only for a moment: requests forwarded under the name must not keep removed limits alive.
    clock.advance(10s);
    CHECK(limiter.admit("a").reason == RejectReason::kNone);
    // The two requests still hold the retired state; they release it as they end.
    CHECK(limiter.running("a") == 2);
    held.lease->finish(1, 1);  // Still safe.
    CHECK(limiter.running("a") == 1);
    second.lease.reset();
    CHECK(limiter.running("a") == 0);
    limiter.configure(std::nullopt);
    CHECK(limiter.admit("b").reason == RejectReason::kNone);
    CHECK(limiter.admit("a").reason == RejectReason::kNone);  // Unknown now: no limits.
}

TEST_CASE("limiter: a removed tenant with nothing running is still limited for the grace") {
    // A request authenticated against the old tenant table can reach admit() after the reload
    // that removed its tenant; with no lease holding the state, it used to be admitted unlimited.
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.requests_per_second = 1;
    limiter.configure(std::vector<TenantConfig>{a});
    limiter.admit("a").lease->finish(1, 1);  // The bucket's one token, spent; nothing running.
    limiter.configure(std::vector<TenantConfig>{tenant("b")});
    CHECK(limiter.admit("a").reason == RejectReason::kRequestRate);
    clock.advance(9s);
    TenantLimiter::Decision late = limiter.admit("a");  // Refilled, still the old limits.
    CHECK(late.reason == RejectReason::kNone);
    CHECK(limiter.running("a") == 1);
    late.lease.reset();
    // After the grace the name is no tenant's: no limits, and the state is let go.
    clock.advance(1s);
    CHECK(limiter.admit("a").reason == RejectReason::kNone);
    CHECK(limiter.admit("a").reason == RejectReason::kNone);
    CHECK(limiter.running("a") == 0);
}

TEST_CASE("limiter: a tenant removed and added back while its requests run keeps its count") {
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.max_concurrent = 1;
    limiter.configure(std::vector<TenantConfig>{a});
    TenantLimiter::Decision held = limiter.admit("a");
    REQUIRE(held.lease);
    limiter.configure(std::vector<TenantConfig>{});  // A mistake in the YAML...
    limiter.configure(std::vector<TenantConfig>{a});  // ...fixed by the next reload.
    CHECK(limiter.running("a") == 1);
    CHECK(limiter.admit("a").reason == RejectReason::kConcurrency);
    held.lease.reset();
    TenantLimiter::Decision again = limiter.admit("a");
    CHECK(again.reason == RejectReason::kNone);
    // keep_others (a reload's first half) leaves out no one.
    limiter.configure(std::vector<TenantConfig>{tenant("b")}, /*keep_others=*/true);
    CHECK(limiter.admit("a").reason == RejectReason::kConcurrency);
}

TEST_CASE("limiter: a request refused after admission (no route) gives everything back") {
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.requests_per_second = 1;
    a.output_tokens_per_minute = 60;
    a.max_concurrent = 1;
    limiter.configure(std::vector<TenantConfig>{a});
    TenantLimiter::Decision d = limiter.admit("a", 60);
    REQUIRE(d.lease);
    d.lease->refuse();
    d.lease->refuse();  // Once.
    d.lease->finish(5, 5);  // Nothing after a refusal.
    CHECK(limiter.running("a") == 0);
    // Same second: the rate token, the output reservation and the slot are all back.
    TenantLimiter::Decision again = limiter.admit("a", 60);
    CHECK(again.reason == RejectReason::kNone);
}

TEST_CASE("limiter: a refused request gives back a prompt it was charged for") {
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig a = tenant("a");
    a.input_tokens_per_minute = 60;
    limiter.configure(std::vector<TenantConfig>{a});
    TenantLimiter::Decision d = limiter.admit("a");
    REQUIRE(d.lease);
    d.lease->charge_prompt(120);  // One minute of debt, were it kept.
    d.lease->refuse();
    CHECK(limiter.admit("a").reason == RejectReason::kNone);
}

TEST_CASE("limiter: the docs describe max_concurrent's Retry-After as the estimate it is") {
    // Audit 7 F2: both pages promised a fixed 1 s; the limiter estimates from slot hold times,
    // bounded to kConcurrencyRetryMin..Max, which is what a client should be told.
    auto seconds = [](Duration d) {
        return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(d).count());
    };
    const std::string bounds = seconds(TenantLimiter::kConcurrencyRetryMin) + " to " +
                               seconds(TenantLimiter::kConcurrencyRetryMax) + " s";
    for (const char* page : {"docs/config.md", "docs/api.md"}) {
        CAPTURE(page);
        const std::string doc = source_file(page);
        const size_t at = doc.find("for `max_concurrent`");
        REQUIRE(at != std::string::npos);
        const std::string said = doc.substr(at, 300);
        CHECK(said.find("estimate") != std::string::npos);
        CHECK(said.find(bounds) != std::string::npos);
        CHECK(said.find("max_concurrent` and the queue it is a fixed") == std::string::npos);
    }
}

TEST_CASE("limiter: max_concurrent's Retry-After follows how long requests hold their slot") {
    TwoRunning t;
    auto& [clock, limiter, one, two] = t;
    CHECK(limiter.admit("a").retry_after == Duration(1s));  // No request ended yet.
    clock.advance(30s);
    one.lease->finish(1, 1);  // Held 30 s.
    TenantLimiter::Decision three = limiter.admit("a");
    REQUIRE(three.lease);
    // Two running, each held ~30 s: one is likely done in 15 s.
    CHECK(limiter.admit("a").retry_after == Duration(15s));
    clock.advance(600s);
    two.lease->finish(1, 1);  // Held 630 s: the mean moves to 0.8 * 30 + 0.2 * 630 = 150 s.
    TenantLimiter::Decision four = limiter.admit("a");
    REQUIRE(four.lease);
    CHECK(limiter.admit("a").retry_after == Duration(60s));  // 75 s, capped.
}

TEST_CASE("limiter: a tenant renamed by a reload keeps its counters and running requests") {
    // The same keys under a new name started with full buckets and no request running, so the
    // tenant ran max_concurrent more while its requests under the old name still ran.
    ManualClock clock;
    TenantLimiter limiter(clock);
    const std::string k1(64, '1'), k2(64, '2'), k3(64, '3');
    TenantConfig acme = tenant("acme");
    acme.api_key_sha256 = {k1, k2};
    acme.max_concurrent = 1;
    acme.requests_per_second = 1;
    limiter.configure(std::vector<TenantConfig>{acme});
    TenantLimiter::Decision held = limiter.admit("acme");
    REQUIRE(held.lease);
    TenantConfig renamed = acme;
    renamed.name = "acme-corp";
    renamed.api_key_sha256 = {k3, k2};  // Rotated one key in the same reload.
    TenantConfig fresh = tenant("initech");  // Added in the same reload, a key of its own.
    fresh.api_key_sha256 = {std::string(64, '4')};
    fresh.max_concurrent = 1;
    // As Daemon::reload_tenants does: the new limits first, the old name dropped after.
    const std::vector<TenantConfig> reloaded{fresh, renamed};
    limiter.configure(reloaded, /*keep_others=*/true);
    limiter.configure(reloaded);
    CHECK(limiter.running("acme-corp") == 1);
    TenantLimiter::Decision over = limiter.admit("acme-corp");
    CHECK(over.blocking ==
          std::vector<RejectReason>{RejectReason::kConcurrency, RejectReason::kRequestRate});
    CHECK(limiter.running("initech") == 0);  // One state, one tenant.
    CHECK(limiter.admit("initech").reason == RejectReason::kNone);
    held.lease->finish(1, 1);  // The old name's request ends: the slot of acme-corp frees.
    clock.advance(1s);
    TenantLimiter::Decision next = limiter.admit("acme-corp");
    CHECK(next.reason == RejectReason::kNone);
    // The old name is let go after the grace, though its state lives on under the new one.
    clock.advance(10s);
    limiter.configure(reloaded);
    CHECK(limiter.running("acme") == 0);
    CHECK(limiter.running("acme-corp") == 1);
    // A tenant that keeps its name keeps its state, whoever else holds one of its keys.
    TenantConfig added = tenant("umbrella");
    added.api_key_sha256 = {k3};
    limiter.configure(std::vector<TenantConfig>{added, renamed});
    CHECK(limiter.running("acme-corp") == 1);
    CHECK(limiter.running("umbrella") == 0);
}

TEST_CASE("limiter: leases() counts the leases alive under the name they were admitted by") {
    // running() follows the state: a renamed tenant's old name reads 0 once it is let go, while
    // its requests still run and count into its metrics (Daemon::reload_tenants asks leases()).
    ManualClock clock;
    TenantLimiter limiter(clock);
    TenantConfig acme = tenant("acme");
    acme.api_key_sha256 = {std::string(64, '1')};
    limiter.configure(std::vector<TenantConfig>{acme});
    TenantLimiter::Decision held = limiter.admit("acme");
    REQUIRE(held.lease);
    TenantConfig renamed = acme;
    renamed.name = "acme-corp";
    const std::vector<TenantConfig> reloaded{renamed};
    limiter.configure(reloaded, /*keep_others=*/true);
    limiter.configure(reloaded);
    clock.advance(11s);
    limiter.configure(reloaded);
    CHECK(limiter.running("acme") == 0);
    CHECK(limiter.leases("acme") == 1);
    CHECK(limiter.leases("acme-corp") == 0);
    // Finished, the lease still counts until its request lets it go (its last metrics).
    held.lease->finish(1, 1);
    CHECK(limiter.leases("acme") == 1);
    held.lease.reset();
    CHECK(limiter.leases("acme") == 0);
    // Unlimited names too.
    TenantLimiter::Decision anonymous = limiter.admit("anonymous");
    CHECK(limiter.leases("anonymous") == 1);
    anonymous.lease.reset();
    CHECK(limiter.leases("anonymous") == 0);
}

TEST_CASE("limiter: requests admitted without limits count as running under their name") {
    // A reload that turns authentication on keeps the anonymous tenant's series while its
    // requests run (Daemon::reload_tenants asks running()): it was always 0, as the limiter kept
    // nothing for a tenant without limits, and the series went while its streams still ran.
    ManualClock clock;
    TenantLimiter limiter(clock);
    limiter.configure(std::nullopt);
    TenantLimiter::Decision one = limiter.admit("anonymous", 100);
    TenantLimiter::Decision two = limiter.admit("anonymous");
    REQUIRE(one.lease);
    REQUIRE(two.lease);
    CHECK(limiter.running("anonymous") == 2);
    CHECK(limiter.running("other") == 0);
    // Authentication on: the anonymous requests still run, without limits, until they end.
    limiter.configure(std::vector<TenantConfig>{tenant("acme")});
    CHECK(limiter.running("anonymous") == 2);
    one.lease->finish(10, 20);
    CHECK(limiter.running("anonymous") == 1);
    two.lease.reset();  // Destroyed unfinished: its slot goes too.
    CHECK(limiter.running("anonymous") == 0);
    // Still unlimited: admissions of an unconfigured name are never refused.
    for (int i = 0; i < 100; ++i) {
        CHECK(limiter.admit("anonymous", 1'000'000).lease);
    }
    CHECK(limiter.running("anonymous") == 0);  // Each lease above ended at once.
}
