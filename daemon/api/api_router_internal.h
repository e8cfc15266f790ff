#pragma once

// The helpers of ApiRouter::serve() and run_here() (api_router.cc) that live in a file of their
// own (api_router_helpers.cc), for their use only: the error answers the router builds (401,
// 405, a tenant limit's 429, a routing refusal's 503), how generation ended as the access log
// notes it, the plan's remote targets after this site, and the headers a forwarded request
// carries between sites.
//
// Threading: pure functions, or calls on the one ResponseChannel they are given.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"
#include "daemon/api/api_error.h"
#include "daemon/api/openai_request.h"
#include "daemon/cluster/route_planner.h"
#include "daemon/tenant_limiter.h"
#include "daemon/tenants.h"
#include "engine/generator.h"
#include "tls/http_types.h"

namespace edge::daemon::api {

ApiError auth_error(AuthOutcome outcome);

// The rejections_total reason of a request the engine refused at submit().
const char* engine_refusal_reason(const Status& status);

// Whether a forwarded request never ran anywhere: every site refused it (a peer's engine
// answers 429 or 503 before generating: a full queue, no slot, overloaded) or none could be
// reached (the forwarder's own 503: refused or timed out connecting), no peer's engine accepted
// it and no usage came back but the prompt's length a peer read to refuse it. Not a 5xx after
// it started (it ran and failed), a 504 (a peer sent it timed out before answering: it may have
// run; so too when a later target refused it), or an answer a peer accepted and then lost (a
// deferred answer cut, a drain).
bool forward_never_ran(const cluster::ForwardResult& result);
// When a peer refused a forwarded request for itself before its engine accepted it (a 4xx but
// 429: its prompt beyond the context, a field the engine cannot take, a model it lacks): the
// rejections_total reason a run here gives the same refusal (engine_refusal_reason()). Else
// nullptr, as when a peer tried before may have run it (maybe_ran): then it is charged as a
// request that ran, an error.
const char* forward_refusal_reason(const cluster::ForwardResult& result);
// The tenant's request outcome of a forward that ran, as the same end here is counted: ok,
// error (an error answer after a peer's engine accepted it, a 5xx, or a stream that failed after
// its head), or cancelled (the client left, or a stream the peer stopped for its load or a
// shutdown).
const char* forward_outcome(const cluster::ForwardResult& result);

// The remote targets of a route plan after its first local one (this site), in the plan's order:
// where a request this site's engine refuses for its load goes next (the forwarder tries the
// remote targets before it). Empty when the plan holds no local target.
std::vector<cluster::RouteTarget> remote_targets_after_here(
    const std::vector<cluster::RouteTarget>& targets);

ApiError method_not_allowed(std::string_view method, std::string_view path);

// The 429 of a refused admission: `code` is the limit with the longest wait, the message names
// every limit that refused, as a client waiting less than Retry-After would meet the others.
ApiError limit_error(const TenantLimiter::Decision& refused, const std::string& tenant);

ApiError route_rejection_error(const cluster::RoutePlan& plan, const std::string& model);

void note_usage(tls::ResponseChannel& channel, int64_t prompt_tokens, int64_t completion_tokens);

// Notes how generation ended (tokens, outcome, an engine refusal's reason); returns the outcome:
// "ok", "error", "cancelled" or "rejected" (refused at submit).
const char* note_finish(tls::ResponseChannel& channel, const engine::Finish& finish,
                        bool refused);

// A request id as this daemon makes them: 16 lowercase hex digits.
bool is_request_id(std::string_view s);

// The positive count a forwarding site sent in header `name` (absent: nullopt), or the 400
// naming the header when it is no such count.
std::variant<std::optional<int64_t>, ApiError> peer_count(const tls::HttpRequest& request,
                                                          std::string_view name);

// Sets header `name` of a request going to a peer to `value`, or removes it (nullopt): a copy
// the client sent is never the one that travels.
void set_peer_header(tls::HttpRequest& request, std::string_view name,
                     std::optional<std::string> value);

// Sets what the serving site takes from this one on a request going to a peer: the request's id
// and this site's caps for the tenant (max_tokens when defaulted, prompt and context limits).
void set_peer_headers(tls::HttpRequest& request, const ParsedRequest& req);

}  // namespace edge::daemon::api
