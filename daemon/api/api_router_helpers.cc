// The helpers of ApiRouter::serve() and run_here() (api_router_internal.h): the error answers
// the router builds, how generation ended as the access log notes it, and the headers a
// forwarded request carries between sites.

#include <algorithm>
#include <chrono>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <boost/algorithm/string/predicate.hpp>

#include "daemon/api/api_router_internal.h"
#include "daemon/api/completion.h"

namespace edge::daemon::api {

ApiError auth_error(AuthOutcome outcome) {
    ApiError e;
    e.status = 401;
    // RFC 7235 3.1 and RFC 6750 3: a 401 names the scheme it wants.
    e.www_authenticate =
        outcome == AuthOutcome::kMissing ? "Bearer" : "Bearer error=\"invalid_token\"";
    e.code = "invalid_api_key";
    e.message = outcome == AuthOutcome::kMissing
                    ? "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'."
                    : "Incorrect API key provided.";
    return e;
}

const char* engine_refusal_reason(const Status& status) {
    switch (status.code()) {
        case StatusCode::kResourceExhausted:
            return "queue_full";
        case StatusCode::kUnavailable:
            return "overloaded";
        case StatusCode::kOutOfRange:
            return "context_length_exceeded";
        case StatusCode::kNotFound:
            return "model_not_found";
        default:
            return "invalid_request";
    }
}

const char* forward_outcome(const cluster::ForwardResult& result) {
    if (result.cancelled || result.failed_unavailable) {
        return "cancelled";
    }
    return result.started && result.status < 400 && !result.failed ? "ok" : "error";
}

namespace {

// Refused before any peer's engine accepted it, and nothing came back of a run: the prompt a
// peer's engine read to refuse it may be told (prompt_tokens), never a generation. Not when a
// peer tried before was sent it and never answered (maybe_ran): that one may have run it, so the
// last target's refusal settles nothing, and the request is charged as one that may have run.
bool refused_before_acceptance(const cluster::ForwardResult& result) {
    return result.completion_tokens == 0 && !result.usage_unknown && !result.accepted &&
           !result.maybe_ran;
}

}  // namespace

bool forward_never_ran(const cluster::ForwardResult& result) {
    return (result.status == 429 || result.status == 503) && refused_before_acceptance(result);
}

const char* forward_refusal_reason(const cluster::ForwardResult& result) {
    if (result.status < 400 || result.status >= 500 || result.status == 429 ||
        !refused_before_acceptance(result)) {
        return nullptr;
    }
    // The peer's answer is api_error_from_status()'s of its engine's refusal: these codes are
    // the reasons engine_refusal_reason() gives the same refusals here; the rest, invalid_request.
    for (const char* reason : {"context_length_exceeded", "model_not_found"}) {
        if (result.error_code == reason) {
            return reason;
        }
    }
    return "invalid_request";
}

std::vector<cluster::RouteTarget> remote_targets_after_here(
    const std::vector<cluster::RouteTarget>& targets) {
    auto here = std::find_if(targets.begin(), targets.end(),
                             [](const cluster::RouteTarget& t) { return t.local; });
    std::vector<cluster::RouteTarget> after;
    if (here != targets.end()) {
        std::copy_if(here + 1, targets.end(), std::back_inserter(after),
                     [](const cluster::RouteTarget& t) { return !t.local; });
    }
    return after;
}

ApiError method_not_allowed(std::string_view method, std::string_view path) {
    ApiError e;
    e.status = 405;
    e.message = "Method " + std::string(method) + " is not allowed on " + logprob_token_text(path);
    return e;
}

ApiError limit_error(const TenantLimiter::Decision& refused, const std::string& tenant) {
    ApiError e;
    e.status = 429;
    e.type = "rate_limit_error";  // As the engine's queue 429 (api_error.cc).
    e.code = reject_reason_name(refused.reason);
    int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(refused.retry_after).count();
    int64_t seconds = ns <= 0 ? 1 : (ns + 999'999'999) / 1'000'000'000;
    e.retry_after_seconds = static_cast<int>(std::clamp<int64_t>(seconds, 1, 86'400));
    std::string limits = reject_reason_name(refused.reason);
    for (RejectReason other : refused.blocking) {
        if (other != refused.reason) {
            limits += std::string(" and ") + reject_reason_name(other);
        }
    }
    e.message = "Tenant '" + tenant + "' exceeded its limit" +
                (refused.blocking.size() > 1 ? "s " : " ") + limits + "; retry after " +
                std::to_string(e.retry_after_seconds) + " s.";
    return e;
}

ApiError route_rejection_error(const cluster::RoutePlan& plan, const std::string& model) {
    ApiError e;
    e.status = 503;
    e.type = "server_error";
    switch (plan.rejection) {
        case cluster::RouteRejection::kNoPoolServesModel:
            e.code = "no_pool_serves_model";
            break;
        case cluster::RouteRejection::kVersionPinUnmatched:
            e.code = "version_pin_unmatched";
            e.param = "X-Model-Version";
            break;
        case cluster::RouteRejection::kAllSaturated:
            e.code = "all_pools_saturated";
            break;
        case cluster::RouteRejection::kNone:
            break;
    }
    // A planner's message quotes the client's X-Model-Version as it came (a header value may
    // hold any byte): escaped as a token's text is, so the answer stays valid UTF-8 JSON.
    e.message = plan.message.empty() ? "No pool in the cluster can take model '" + model + "' (" +
                                           *e.code + ")."
                                     : logprob_token_text(plan.message);
    e.retry_after_seconds = std::max(0, plan.retry_after_seconds);
    return e;
}

void note_usage(tls::ResponseChannel& channel, int64_t prompt_tokens, int64_t completion_tokens) {
    channel.note("prompt_tokens", prompt_tokens);
    channel.note("completion_tokens", completion_tokens);
}

const char* note_finish(tls::ResponseChannel& channel, const engine::Finish& finish,
                        bool refused) {
    note_usage(channel, finish.usage.prompt_tokens, finish.usage.completion_tokens);
    const char* outcome = refused ? "rejected"
                          : finish.reason == engine::FinishReason::kError     ? "error"
                          : finish.reason == engine::FinishReason::kCancelled ? "cancelled"
                                                                              : "ok";
    channel.note("outcome", std::string(outcome));
    if (refused) {
        channel.note("rejected", std::string(engine_refusal_reason(finish.error)));
    }
    return outcome;
}

bool is_request_id(std::string_view s) {
    return s.size() == 16 && std::all_of(s.begin(), s.end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
           });
}

std::variant<std::optional<int64_t>, ApiError> peer_count(const tls::HttpRequest& request,
                                                          std::string_view name) {
    const std::string_view text = request.header(name);
    if (text.empty()) {
        return std::optional<int64_t>();
    }
    if (std::optional<int64_t> value =
            cluster::header_count(text, 1, std::numeric_limits<int64_t>::max())) {
        return value;
    }
    return invalid_request(
        std::string(name) + " must be a positive integer, not '" + logprob_token_text(text) + "'",
        std::nullopt);
}

void set_peer_header(tls::HttpRequest& request, std::string_view name,
                     std::optional<std::string> value) {
    std::erase_if(request.headers, [&](const tls::HttpHeader& h) {
        return boost::algorithm::iequals(h.name, name);
    });
    if (value) {
        request.headers.push_back({std::string(name), std::move(*value)});
    }
}

void set_peer_headers(tls::HttpRequest& request, const ParsedRequest& req) {
    set_peer_header(request, cluster::kRequestIdHeader, req.generate.request_id);
    set_peer_header(request, cluster::kMaxTokensHeader,
                    req.generate.max_tokens_is_default
                        ? std::optional(std::to_string(req.generate.sampling.max_tokens))
                        : std::nullopt);
    for (auto [header, most] :
         {std::pair{cluster::kMaxPromptTokensHeader, req.generate.max_prompt_tokens},
          std::pair{cluster::kMaxContextTokensHeader, req.generate.max_context_tokens}}) {
        set_peer_header(request, header,
                        most > 0 ? std::optional(std::to_string(most)) : std::nullopt);
    }
}

}  // namespace edge::daemon::api
