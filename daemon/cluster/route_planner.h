#pragma once

// The seam between choosing where a request runs and carrying it there.
//
// RoutePlanner (implemented by the cluster wiring from the gossip snapshot and
// routing/selection) answers, for one admitted request, an ordered list of targets: the chosen
// pool first, then the fallbacks a retry may use, or a rejection with its reason. Forwarder
// (implemented by daemon/forward over mutual TLS) carries a request to a remote target and
// streams the answer back. The API router asks the planner, runs local targets on the engine and
// hands remote ones to the forwarder; a request that arrived forwarded (hop header from an
// authenticated peer) is only ever run locally.
//
// Threading: both interfaces are called concurrently from connection strands; implementations
// are thread-safe and never block (plan() reads an immutable snapshot; forward() is
// asynchronous).

#include <charconv>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "tls/http_types.h"

namespace edge::daemon::cluster {

// The header a forwarded request carries: the site id of the daemon that forwarded it. A request
// that carries it is never forwarded again.
inline constexpr std::string_view kHopHeader = "X-Edgeserve-Forwarded-By";
// The authenticated tenant of a forwarded request (trusted only from an mTLS peer).
inline constexpr std::string_view kTenantHeader = "X-Edgeserve-Tenant";
// The forwarding site's request id (16 hex digits), which the serving site takes for its own: both
// access logs and the response id ("chatcmpl-<id>") name the request the same way.
inline constexpr std::string_view kRequestIdHeader = "X-Edgeserve-Request-Id";
// The max_tokens the forwarding site gave a request whose client set none (its tenant's limits
// can lower the default); the serving site generates no more than that. Trusted only from a peer.
inline constexpr std::string_view kMaxTokensHeader = "X-Edgeserve-Max-Tokens";
// The forwarding site's cap on the prompt's length in tokens (its tenant's
// input_tokens_per_minute: a longer prompt could never fit the budget there); the serving site
// refuses a longer prompt with the 400 the forwarding site would have given, whether or not its
// own config knows the tenant. Trusted only from a peer.
inline constexpr std::string_view kMaxPromptTokensHeader = "X-Edgeserve-Max-Prompt-Tokens";
// The same for its cap on the prompt plus max_tokens (its tenant's max_context_tokens).
inline constexpr std::string_view kMaxContextTokensHeader = "X-Edgeserve-Max-Context-Tokens";
// On a forwarded request's answer: the prompt's length in tokens, sent by the serving site on the
// head it sends once its engine accepted the request (a stream's, or a deferred answer's), so the
// forwarding site charges the prompt even when the answer is cut before its usage report; with
// kCompletionTokensHeader on an error answer after acceptance (a deferred one's inside its
// body); and alone on an answer refusing the request itself before it ran (a 4xx but 429), when
// the engine had tokenized its prompt (the forwarding site charges what was read, as a refusal
// there is). Never alone on a 429 or 5xx: a forwarding site of an earlier version takes any
// count for an answer after acceptance, neither retried nor refunded.
// Stripped before the answer reaches the client.
inline constexpr std::string_view kPromptTokensHeader = "X-Edgeserve-Prompt-Tokens";
// On a forwarded request's error answer after its engine accepted it: the tokens generated
// before it ended (a drain's deadline, a sequence the KV cache could not hold, a lost device), so
// the forwarding site charges them and runs the request again elsewhere only when it says 0 (an
// error answer without it may have generated: not run again). Its presence marks an answer after
// acceptance. Stripped as kPromptTokensHeader.
inline constexpr std::string_view kCompletionTokensHeader = "X-Edgeserve-Completion-Tokens";
// The version digest a client pins (also honoured on forwarded requests).
inline constexpr std::string_view kModelVersionHeader = "X-Model-Version";

// A count one site tells another in a header (kMaxTokensHeader, kMaxPromptTokensHeader,
// kMaxContextTokensHeader, kPromptTokensHeader, kCompletionTokensHeader): decimal digits only,
// within [min, max]; nullopt for anything else.
inline std::optional<int64_t> header_count(std::string_view text, int64_t min, int64_t max) {
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max) {
        return std::nullopt;
    }
    return value;
}

struct RouteTarget {
    bool local = false;
    std::string site_id;    // The site that runs it (this site's id when local).
    std::string peer_addr;  // host:port of the site's peer (mTLS) listener; empty when local.
    double cost_s = 0.0;    // The selection cost, for logs and metrics.
    std::string model;      // The model the plan was for (keys outlier detection per pool).
};

// Why no pool can take a request (mirrors routing::selection::Rejection).
enum class RouteRejection : uint8_t {
    kNone,
    kNoPoolServesModel,   // 503: nothing in the cluster serves this model.
    kVersionPinUnmatched, // 503: no pool serves the pinned X-Model-Version.
    kAllSaturated,        // 503 with Retry-After: every pool is at capacity.
};

struct RoutePlan {
    // Chosen target first, then fallbacks in order of cost. Empty when rejected.
    std::vector<RouteTarget> targets;
    RouteRejection rejection = RouteRejection::kNone;
    std::string message;        // Human-readable reason when rejected.
    int retry_after_seconds = 0;  // > 0 when waiting helps (kAllSaturated).
};

class RoutePlanner {
public:
    virtual ~RoutePlanner() = default;
    // Where `model` (optionally pinned to `version_pin`, "" for none) should run now.
    virtual RoutePlan plan(std::string_view model, std::string_view version_pin) = 0;
    // Outcome of one attempt on a target, for outlier detection and metrics. `ok` false for a
    // connect failure, a timeout or a 5xx; latency is the time to the response head.
    virtual void report(const RouteTarget& target, bool ok, std::chrono::nanoseconds latency) = 0;
    // Models some live site of the cluster serves now (any version), sorted, without duplicates:
    // what a request may name here even when this site runs none of them.
    virtual std::vector<std::string> cluster_models() { return {}; }
    // Models some site of the cluster advertises in any state (loading, draining, or on a member
    // gossip has found dead but still lists), sorted, without duplicates: a request naming one
    // of these is for a model that exists, which may serve again (a 503 to retry), while one
    // naming none is for no model at all (a 404).
    virtual std::vector<std::string> advertised_models() { return cluster_models(); }
};

// What happened to a forwarded request, for the caller's bookkeeping (limits, metrics).
struct ForwardResult {
    bool started = false;   // Some byte of the response reached the client.
    // A streamed answer that began and then failed: cut here, or ended by the peer's own error
    // event. Its status stays the head's (200).
    bool failed = false;
    // With failed: the peer's error event said it stopped the generation for its load or a
    // shutdown (service_unavailable: a drain's deadline, no room once queued), as a local run's
    // cancellation or capacity end, not a request that failed.
    bool failed_unavailable = false;
    int status = 0;         // HTTP status the client got (0 when none).
    std::string site_id;    // The site that answered (the last one tried).
    int attempts = 0;       // Targets tried.
    // From the peer's usage, when it reported one; for an answer refusing the request before a
    // peer's engine accepted it, the prompt's length that peer read to refuse it, as it told.
    int64_t prompt_tokens = 0;
    int64_t completion_tokens = 0;
    // The error code (error.code) of an answer refusing the request before a peer's engine
    // accepted it, "" when it had none: the caller names the refusal as it names the same one
    // here (a prompt beyond the context, a field the engine cannot take).
    std::string error_code;
    // The peer took the request (its answer had begun) but no usage came back: the answer was
    // cut, the client went away or the peer sent no report. It may have generated up to
    // max_tokens, so the tenant is charged that, as a request that ran (never refunded as one
    // that did not); prompt_tokens is then the prompt's length the peer sent on its head.
    bool usage_unknown = false;
    // A peer's engine accepted the request (its stream's head or its deferred answer's head
    // came back): it ran, or may have, so it is never refunded as refused, whatever came after
    // (a deferred answer cut is still tried at the next site: it is not charged twice).
    bool accepted = false;
    // A peer was sent the request and sent no head within response_timeout: its engine may
    // have run it, so, whatever a later target answered, it is never refunded as refused.
    bool maybe_ran = false;
    // The last peer's engine accepted it, then refused it for capacity before any token (503 or
    // 429 saying none was generated) and no other target was left: it never ran, as a local
    // run's request that was never placed (accepted stays false).
    bool unplaced = false;
    // The client went away before the answer's end (not a stop() of this site): the forward was
    // cancelled, as a request run here whose client leaves is.
    bool cancelled = false;
    // No remote target before this site's in `targets` took the request and nothing reached
    // the client: the forwarder has not answered the channel; the caller runs the request here.
    bool run_here = false;
};

// What the plan's targets tried before the next ones left of an admitted request (their
// ForwardResult): once a peer may have run it or accepted it, a later target's refusal, here or
// at a peer, gives nothing back and is an error after acceptance, and no later target reached is
// never answered as a request that ran nowhere, as the forwarder settles the same within its own
// list of peers.
struct EarlierTargets {
    bool maybe_ran = false;     // A peer was sent it and sent no head in time.
    bool accepted = false;      // A peer's engine accepted it, then its answer was cut.
    int64_t prompt_tokens = 0;  // The prompt's length that peer told at its acceptance.
    int64_t most_output = 0;    // What it may have generated there (accepted).
    bool any() const { return maybe_ran || accepted; }
};

class Forwarder {
public:
    virtual ~Forwarder() = default;
    // Sends `request` (the client's method, target, body and relevant headers; the forwarder
    // adds the hop and tenant headers) to `targets` in order: the next target is tried when
    // connecting fails or the peer answers 5xx before any byte reached the client, within the
    // retry budget; never after. The answer (full or streamed) goes to `channel`; a client that
    // goes away cancels the upstream request. `done` runs once at the end, on any thread. Local
    // targets are not run here, and are tried in the plan's order: when every remote target
    // before the list's first local one failed before any byte, `done` gets
    // ForwardResult::run_here and the channel is left unanswered (the targets after the local
    // one are the caller's to try, should this site refuse the request for its load).
    // `on_accepted`, when set, runs on a peer's acceptance (its stream's or deferred answer's
    // head) with the prompt's length that peer told (kPromptTokensHeader; not run without
    // one), before anything of that answer reaches the channel: the caller charges the prompt
    // then, not at `done`. Again should a later target accept it after a deferred answer cut.
    // `earlier`: what the targets the caller tried before `targets` left. No target reached is
    // answered as after such a peer of `targets`, never with the 503 saying it ran nowhere:
    // after one that was sent the request and sent no head in time (maybe_ran), a 504
    // (upstream_timeout), and ForwardResult::maybe_ran is set; else after one that accepted it
    // before its answer was cut (accepted), the 503 of that cut (upstream_cut). The rest of its
    // settling (the charge) is the caller's.
    virtual void forward(tls::HttpRequest request, std::string tenant,
                         std::vector<RouteTarget> targets,
                         std::shared_ptr<tls::ResponseChannel> channel,
                         std::function<void(const ForwardResult&)> done,
                         std::function<void(int64_t prompt_tokens)> on_accepted = {},
                         EarlierTargets earlier = {}) = 0;
};

}  // namespace edge::daemon::cluster
