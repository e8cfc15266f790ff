#include "daemon/api/api_router.h"

#include <algorithm>
#include <optional>
#include <string>
#include <variant>

#include <boost/algorithm/string/predicate.hpp>

#include "common/log.h"
#include "daemon/api/api_router_internal.h"
#include "daemon/api/completion.h"
#include "daemon/api/deferred_response.h"
#include "daemon/api/openai_request.h"
#include "daemon/config.h"

namespace edge::daemon::api {

void ApiRouter::set_tenants(std::shared_ptr<const TenantTable> tenants) {
    std::lock_guard lock(tenants_mu_);
    tenants_ = std::move(tenants);
}

std::shared_ptr<const TenantTable> ApiRouter::tenants() const {
    std::lock_guard lock(tenants_mu_);
    return tenants_;
}

void ApiRouter::handle(tls::HttpRequest request, std::shared_ptr<tls::ResponseChannel> channel) {
    serve(std::move(request), std::move(channel), false);
}

void ApiRouter::handle_forwarded(tls::HttpRequest request,
                                 std::shared_ptr<tls::ResponseChannel> channel) {
    serve(std::move(request), std::move(channel), true);
}

void ApiRouter::serve(tls::HttpRequest request, std::shared_ptr<tls::ResponseChannel> channel,
                      bool from_peer) {
    std::string_view path = request.path();
    Endpoint endpoint = Endpoint::kChatCompletions;
    constexpr std::string_view kModelsPrefix = "/v1/models/";
    const bool models_path = path == "/v1/models" || (path.size() > kModelsPrefix.size() &&
                                                      path.starts_with(kModelsPrefix));
    if (models_path) {
        // HEAD as GET (RFC 9110 section 9.3.2): the server sends the head alone.
        if (request.method != "GET" && request.method != "HEAD") {
            ApiError e = method_not_allowed(request.method, path);
            tls::HttpResponse r = e.to_response();
            r.headers.push_back({"Allow", "GET, HEAD"});
            channel->respond(std::move(r));
            return;
        }
    } else if (path == "/v1/chat/completions" || path == "/v1/completions") {
        if (request.method != "POST") {
            ApiError e = method_not_allowed(request.method, path);
            tls::HttpResponse r = e.to_response();
            r.headers.push_back({"Allow", "POST"});
            channel->respond(std::move(r));
            return;
        }
        endpoint = path == "/v1/completions" ? Endpoint::kCompletions
                                             : Endpoint::kChatCompletions;
        // A compressed body would otherwise read as malformed JSON (RFC 9110 section 15.5.16).
        if (std::string_view coding = request.header("content-encoding");
            !coding.empty() && !boost::algorithm::iequals(coding, "identity")) {
            ApiError e;
            e.status = 415;
            e.code = "unsupported_content_encoding";
            e.message = "Content-Encoding '" + logprob_token_text(coding) +
                        "' is not supported: send the JSON body uncompressed.";
            tls::HttpResponse r = e.to_response();
            r.headers.push_back({"Accept-Encoding", "identity"});
            channel->respond(std::move(r));
            return;
        }
    } else {
        ApiError e;
        e.status = 404;
        e.message = "Unknown request URL: " + request.method + " " + logprob_token_text(path);
        e.code = "unknown_url";
        channel->respond(e.to_response());
        return;
    }

    // The headers that say who is served, and where: one each, or a proxy in front that reads
    // another copy than this server would act for someone else.
    for (std::string_view name : {std::string_view("Authorization"), cluster::kModelVersionHeader,
                                  cluster::kHopHeader, cluster::kTenantHeader}) {
        if (request.header_count(name) > 1) {
            channel->respond(invalid_request("The " + std::string(name) +
                                                 " header appears more than once; send it once.",
                                             std::nullopt)
                                 .to_response());
            return;
        }
    }
    std::shared_ptr<const TenantTable> table = tenants();
    std::string_view hop = request.header(cluster::kHopHeader);
    // The tenant of a forwarded request: the configured one of that name when this site knows
    // it (its weight and caps apply), else one with the forwarding site's name and no caps.
    Tenant forwarded_tenant;
    const Tenant* tenant_ptr = nullptr;
    if (!from_peer) {
        if (!hop.empty()) {
            ApiError e = invalid_request(
                "The " + std::string(cluster::kHopHeader) +
                    " header is only accepted from cluster peers on the peer listener; a request "
                    "that carries it here is refused, so a forwarding loop cannot form.",
                std::nullopt);
            e.code = "forwarding_header_not_allowed";
            channel->respond(e.to_response());
            return;
        }
        TenantTable::Match auth = table->authenticate(request.header("authorization"));
        if (auth.outcome != AuthOutcome::kOk) {
            // No tenant is known: the series has tenant="" (a revoked or mistyped key shows here).
            if (metrics_ != nullptr) {
                metrics_->on_tenant_rejected(
                    "", auth.outcome == AuthOutcome::kMissing ? "missing_key" : "unknown_key");
            }
            channel->respond(auth_error(auth.outcome).to_response());
            return;
        }
        tenant_ptr = auth.tenant;
    } else {
        std::string_view tenant_name = request.header(cluster::kTenantHeader);
        ApiError e;
        if (request.peer_identity.empty()) {
            e.status = 403;
            e.type = "permission_error";
            e.code = "peer_not_authenticated";
            e.message = "Forwarded requests need a client certificate from the cluster CA.";
        } else if (hop.empty() || tenant_name.empty()) {
            e.code = "not_a_forwarded_request";
            e.message = "The peer listener only takes requests forwarded by another site: " +
                        std::string(cluster::kHopHeader) + " and " +
                        std::string(cluster::kTenantHeader) + " are required.";
        } else if (verify_site_identity_ &&
                   std::none_of(request.peer_names.begin(), request.peer_names.end(),
                                [&](const std::string& name) {
                                    // DNS names compare without case; no wildcards: a site id
                                    // names one site.
                                    return boost::algorithm::iequals(name, hop);
                                })) {
            // Any certificate of the cluster CA would otherwise speak for any site.
            e.status = 403;
            e.type = "permission_error";
            e.code = "peer_identity_mismatch";
            e.message = "The client certificate does not name site '" + logprob_token_text(hop) +
                        "' (the " + std::string(cluster::kHopHeader) +
                        " header) as a DNS subjectAltName; each site forwards with its own "
                        "certificate (peer.verify_site_identity).";
        }
        if (e.status != 400 || !e.message.empty()) {
            // Marked (kPeerRefusalHeader): the forwarding site relayed it as its answer, and its
            // client got a 403 (or 400) for a certificate not its own, no other target tried.
            tls::HttpResponse refusal = e.to_response();
            refusal.headers.push_back({std::string(kPeerRefusalHeader), *e.code});
            channel->respond(std::move(refusal));
            return;
        }
        if (!is_identifier(tenant_name)) {
            // A tenant name as the forwarding site's config has them (or "anonymous").
            e.code = "invalid_forwarded_tenant";
            e.message = "The " + std::string(cluster::kTenantHeader) +
                        " header must be a tenant name: 1 to 64 letters, digits, '.', '_' or "
                        "'-'.";
            channel->respond(e.to_response());
            return;
        }
        const Tenant* known = table->find(tenant_name);
        if (known != nullptr && table->enabled()) {
            forwarded_tenant = *known;  // Its settings, name and prefix-cache scope here.
        } else {
            // A tenant this site has no entry for (or every tenant, authentication being off
            // here): the default settings (the anonymous tenant's), under one name for the
            // engine, kForwardedTenant, so its per-tenant series and fair-share entries are this
            // site's tenants and that one, whatever names peers send. Its prefix cache is its
            // own all the same ("never across tenants", docs/config.md).
            if (known != nullptr) {
                forwarded_tenant = *known;
            }
            forwarded_tenant.name = std::string(kForwardedTenant);
            forwarded_tenant.cache_scope = "forwarded:" + std::string(tenant_name);
        }
        tenant_ptr = &forwarded_tenant;
        channel->note("from_site", std::string(hop));
        channel->note("peer_cert", request.peer_identity);
        channel->note("tenant", std::string(tenant_name));
    }
    if (!from_peer) {
        channel->note("tenant", tenant_ptr->name);
    }
    if (models_path) {
        // OpenAI clients escape the id ("org%2Fname" for "org/name").
        models_endpoint(channel, from_peer ? nullptr : tenant_ptr,
                        path.size() > kModelsPrefix.size()
                            ? tls::percent_decode(path.substr(kModelsPrefix.size()))
                            : std::string());
        return;
    }
    const Tenant& tenant = *tenant_ptr;
    auto reject = [&](const ApiError& e, std::string_view reason) {
        if (metrics_ != nullptr && !from_peer) {
            metrics_->on_tenant_rejected(tenant.name, reason);
            metrics_->on_tenant_request(tenant.name, "rejected");
        }
        channel->note("rejected", std::string(reason));
        channel->respond(e.to_response());
    };
    // Refused for itself once its body was read (it does not parse, names a model the tenant
    // may not use, asks more than its limits allow): it spends a request of the tenant's rate
    // as an admitted one does, or invalid requests, never held back, could keep the site
    // parsing bodies and compiling schemas at any rate. (A peer's request was charged there.)
    auto refuse_request = [&](const ApiError& e, std::string_view reason) {
        if (!from_peer) {
            limiter_.charge_request(tenant.name);
        }
        reject(e, reason);
    };
    if (!from_peer) {
        // A tenant that would be refused now whatever it asks (its request rate, max_concurrent,
        // input tokens in debt) gets its 429 before the body is read: parsing it may compile
        // up to 128 tool schemas and a response_format on this I/O thread, which a tenant held
        // back must not be able to make the site do. Advisory: admit() below decides (it checks
        // again, with the request's output reservation). So the 429 comes before what the body
        // would be refused for (400, the model's 404 or 403), which needs it parsed; a client
        // that waits out Retry-After gets that answer then. That refusal spends a request
        // (refuse_request), so it is held back by the rate like any other.
        if (TenantLimiter::Decision refused = limiter_.would_refuse(tenant.name);
            refused.reason != RejectReason::kNone) {
            reject(limit_error(refused, tenant.name), reject_reason_name(refused.reason));
            return;
        }
    }
    std::variant<ParsedRequest, ApiError> parsed = parse_openai_request(endpoint, request.body);
    if (auto* error = std::get_if<ApiError>(&parsed)) {
        // Counted with the tenant's other refusals, so its request total is its HTTP total.
        refuse_request(*error, "invalid_request");
        return;
    }
    ParsedRequest& req = std::get<ParsedRequest>(parsed);
    if (!from_peer) {
        // A model no site has is not found, whoever asks, before anything is charged: in a
        // cluster the planner would answer it 503 no_pool_serves_model, which OpenAI clients
        // retry and then raise as a server error. One a site advertises but does not serve now
        // (loading, draining, its site found dead) gets the planner's 503, which they retry.
        // 403 is for one that exists.
        if (!model_exists(req.generate.model)) {
            refuse_request(
                api_error_from_status(not_found_error("unknown model"), req.generate.model),
                "model_not_found");
            return;
        }
    }
    if (!from_peer && !tenant.may_use(req.generate.model)) {
        ApiError e;
        e.status = 403;
        e.type = "permission_error";
        e.param = "model";
        e.code = "model_not_allowed";
        e.message = "Tenant '" + tenant.name + "' may not use model '" +
                    req.generate.model + "'.";
        refuse_request(e, "model_not_allowed");
        return;
    }
    int32_t& max_tokens = req.generate.sampling.max_tokens;
    const int32_t default_max_tokens = max_tokens;
    if (tenant.max_output_tokens > 0 && max_tokens > tenant.max_output_tokens) {
        if (!req.max_tokens_param.empty()) {
            refuse_request(
                invalid_request(req.max_tokens_param + " (" + std::to_string(max_tokens) +
                                    ") exceeds this tenant's limit of " +
                                    std::to_string(tenant.max_output_tokens),
                                req.max_tokens_param),
                "max_output_tokens");
            return;
        }
        max_tokens = static_cast<int32_t>(tenant.max_output_tokens);  // Lower the default.
    }
    // One request larger than a whole minute's output budget could never be admitted; its
    // choices (n for each prompt) may each generate max_tokens.
    if (const int64_t budget = limiter_.output_budget(tenant.name);
        !from_peer && budget > 0 && int64_t{max_tokens} * req.choices() > budget) {
        if (!req.max_tokens_param.empty() || req.choices() > budget) {
            const std::string asked = req.choices() > 1
                                          ? std::to_string(req.choices()) + " choices of " +
                                                std::to_string(max_tokens) + " tokens"
                                          : std::to_string(max_tokens);
            const std::string param = !req.max_tokens_param.empty() ? req.max_tokens_param
                                      : req.prompts() > 1           ? "prompt"
                                                                    : "n";
            refuse_request(
                invalid_request(param + " (" + asked + ") exceeds this tenant's " +
                                    "output_tokens_per_minute of " + std::to_string(budget),
                                param),
                "output_tokens_per_minute");
            return;
        }
        max_tokens = static_cast<int32_t>(budget / req.choices());  // Lower the default.
    }
    if (from_peer && req.generate.max_tokens_is_default) {
        // The default the forwarding site lowered for its tenant's limits.
        auto cap = peer_count(request, cluster::kMaxTokensHeader);
        if (const auto* e = std::get_if<ApiError>(&cap)) {
            reject(*e, "invalid_request");
            return;
        }
        if (const std::optional<int64_t> value = std::get<std::optional<int64_t>>(cap)) {
            max_tokens = static_cast<int32_t>(std::min<int64_t>(max_tokens, *value));
        }
    }
    if (max_tokens < default_max_tokens && req.generate.sampling.min_tokens > max_tokens) {
        // A default lowered for the tenant's limits (here or at the forwarding site): the
        // engine, which sees only the lowered value, would blame the context's room.
        refuse_request(
            invalid_request("'min_tokens' (" + std::to_string(req.generate.sampling.min_tokens) +
                                ") exceeds the " + std::to_string(max_tokens) +
                                " tokens this tenant's limits (max_output_tokens, "
                                "output_tokens_per_minute) leave for the reply",
                            std::string("min_tokens")),
            "invalid_request");
        return;
    }
    req.generate.max_context_tokens = tenant.max_context_tokens;
    req.generate.max_prompt_tokens = tenant.input_tokens_per_minute;
    if (from_peer) {
        // The forwarding site's caps for its tenant: this site may not know the tenant (no caps
        // here), yet the request is charged there. The tighter one holds.
        for (auto [header, most] :
             {std::pair{cluster::kMaxPromptTokensHeader, &req.generate.max_prompt_tokens},
              std::pair{cluster::kMaxContextTokensHeader, &req.generate.max_context_tokens}}) {
            auto cap = peer_count(request, header);
            if (const auto* e = std::get_if<ApiError>(&cap)) {
                reject(*e, "invalid_request");
                return;
            }
            if (const std::optional<int64_t> value = std::get<std::optional<int64_t>>(cap)) {
                *most = *most > 0 ? std::min(*most, *value) : *value;
            }
        }
    }
    req.generate.tenant_weight = tenant.weight;
    req.generate.priority = tenant.priority;
    req.generate.tenant = tenant.name;
    req.generate.cache_scope = tenant.cache_scope;
    if (std::string_view forwarded_id = request.header(cluster::kRequestIdHeader);
        from_peer && is_request_id(forwarded_id)) {
        req.generate.request_id = std::string(forwarded_id);
    } else {
        char id[24];
        std::snprintf(id, sizeof(id), "%016llx",
                      static_cast<unsigned long long>(next_request_.fetch_add(1)));
        req.generate.request_id = id;
    }
    channel->note("model", req.generate.model);
    channel->note("request_id", req.generate.request_id);

    if (from_peer) {
        // Limits were charged at the forwarding site. Runs here or fails: never forwarded again.
        if (ApiError e; !serves_here(req.generate.model,
                                     request.header(cluster::kModelVersionHeader), e,
                                     "a forwarded request is never forwarded again")) {
            channel->respond(e.to_response());
            return;
        }
        req.report_usage = true;  // The forwarding site charges the tenant from it.
        channel->note("served_by", site_id_);
        std::function<void(int64_t)> on_accepted;
        if (!req.stream && !request.header(kDeferredHeadHeader).empty()) {
            // The head goes out once the engine accepted the request (deferred_response.h).
            auto deferred = std::make_shared<DeferredHeadChannel>(std::move(channel));
            channel = deferred;
            on_accepted = [deferred](int64_t prompt_tokens) { deferred->open(prompt_tokens); };
        }
        RefusalTaker shared_queue;
        if (req.generate.tenant == kForwardedTenant) {
            // The tenants this site does not know share one queue here: its being full is this
            // site's load for forwarded requests, not the tenant's doing. A 503, which the
            // forwarding site takes to its plan's next target, not a 429 naming "(forwarded)"
            // that one tenant's burst would make every other such tenant's answer.
            shared_queue = [channel, model = req.generate.model](const Status& s) {
                if (s.code() != StatusCode::kResourceExhausted) {
                    return false;
                }
                const Status load = unavailable_error(
                    "this site's queue for forwarded requests is full; retry later");
                engine::Finish finish;
                finish.reason = engine::FinishReason::kError;
                finish.error = load;
                note_finish(*channel, finish, true);
                channel->respond(api_error_from_status(load, model).to_response());
                return true;
            };
        }
        run_completion(generator_, std::move(req), channel, clock_.wall_now_us() / 1'000'000,
                       [channel](const engine::Finish& finish, bool refused) {
                           note_finish(*channel, finish, refused);
                       },
                       std::move(on_accepted), std::move(shared_queue));
        return;
    }

    // A version pin on a site without a cluster: only this site's own version can answer it (a
    // planner applies it to every pool otherwise; a model not served here is the engine's 404).
    if (ApiError e; planner_.load() == nullptr &&
                    !serves_here(req.generate.model, request.header(cluster::kModelVersionHeader),
                                 e, "this site has no cluster to find that version in") &&
                    e.code == "version_pin_unmatched") {
        // A 503 the client is told to retry, not a fault of the request: not charged, as the
        // planner's refusal of the same pin on a site with a cluster is refunded.
        reject(e, "route_rejected");
        return;
    }
    // Reserved from the output budget: the client's max_tokens for each choice (of every prompt).
    // A default one (a chat request without max_tokens may run to the end of the context)
    // reserves at most a quarter of the minute's budget, so a tenant's default requests still run
    // several at once; what they generate beyond it is charged as debt when they end, like prompt
    // tokens.
    int64_t reserve = int64_t{max_tokens} * req.choices();
    if (req.generate.max_tokens_is_default) {
        if (const int64_t budget = limiter_.output_budget(tenant.name); budget > 0) {
            reserve = std::min(reserve, std::max<int64_t>(1, budget / 4));
        }
    }
    TenantLimiter::Decision admitted = limiter_.admit(tenant.name, reserve);
    if (admitted.reason != RejectReason::kNone) {
        reject(limit_error(admitted, tenant.name),
               reject_reason_name(admitted.reason));
        return;
    }
    std::string tenant_name = tenant.name;
    if (cluster::RoutePlanner* planner = planner_.load()) {
        cluster::RoutePlan plan =
            planner->plan(req.generate.model, request.header(cluster::kModelVersionHeader));
        if (plan.rejection != cluster::RouteRejection::kNone) {
            admitted.lease->refuse();  // Refused by capacity, not by the tenant's limits.
            reject(route_rejection_error(plan, req.generate.model), "route_rejected");
            return;
        }
        if (!plan.targets.empty() && !plan.targets.front().local) {
            if (forwarder_ == nullptr) {
                ApiError e;
                e.status = 503;
                e.type = "server_error";
                e.code = "forwarding_unavailable";
                e.message = "Model '" + req.generate.model + "' is routed to site '" +
                            plan.targets.front().site_id +
                            "', but this site has no `peer` section to forward with.";
                admitted.lease->refuse();
                reject(e, "forwarding_unavailable");
                return;
            }
            set_peer_headers(request, req);
            const int64_t most_output = int64_t{max_tokens} * req.choices();
            forward_to(std::move(request), std::make_shared<ParsedRequest>(std::move(req)),
                       std::move(plan.targets), std::move(channel), std::move(admitted.lease),
                       tenant_name, most_output);
            return;
        }
        // Planned here first: should this site's engine refuse it for its load (its queue full,
        // overloaded, draining), the plan's remote targets are tried next, as after a peer's
        // refusal. The tenant's own queue here being full (a 429) stays the answer.
        std::vector<cluster::RouteTarget> elsewhere = remote_targets_after_here(plan.targets);
        if (forwarder_ != nullptr && !elsewhere.empty()) {
            set_peer_headers(request, req);
            const int64_t most_output = int64_t{max_tokens} * req.choices();
            run_here(std::move(req), std::move(channel), std::move(admitted.lease), tenant_name,
                     forward_elsewhere(std::make_shared<tls::HttpRequest>(std::move(request)),
                                       std::move(elsewhere), tenant_name, most_output));
            return;
        }
    }
    run_here(std::move(req), std::move(channel), std::move(admitted.lease), tenant_name);
}

void ApiRouter::forward_to(tls::HttpRequest request, std::shared_ptr<ParsedRequest> req,
                           std::vector<cluster::RouteTarget> targets,
                           std::shared_ptr<tls::ResponseChannel> channel,
                           std::shared_ptr<TenantLimiter::Lease> lease,
                           const std::string& tenant_name, int64_t most_output,
                           EarlierTargets earlier) {
    std::shared_ptr<tls::ResponseChannel> notes = channel;
    // The plan's remote targets after this site's (the forwarder tries those before it): where a
    // run here the engine refuses for load goes next. The request is kept for them.
    auto after_here =
        std::make_shared<std::vector<cluster::RouteTarget>>(remote_targets_after_here(targets));
    auto again = after_here->empty() || req == nullptr
                     ? nullptr
                     : std::make_shared<tls::HttpRequest>(request);
    // The prompt counts against input_tokens_per_minute from the peer's acceptance, as a run
    // here does from its own; finish() below charges only what that did not take.
    auto on_accepted = [lease](int64_t prompt_tokens) { lease->charge_prompt(prompt_tokens); };
    // A peer tried before these targets may have run it (earlier.maybe_ran) or accepted it
    // (earlier.accepted): the forwarder answers as after such a peer of its own list, no target
    // reached being a 504 or the cut's 503, not the 503 that tells the client the request ran
    // nowhere.
    forwarder_->forward(
        std::move(request), tenant_name, std::move(targets), std::move(channel),
        [this, lease = std::move(lease), metrics = metrics_, tenant_name, notes = std::move(notes),
         most_output, req = std::move(req), after_here = std::move(after_here),
         again = std::move(again), earlier](const cluster::ForwardResult& forwarded) {
            // Settled as the forwarder settles its own list of peers when one tried before may
            // have run the request, or accepted it and was cut (peer_attempt.cc): whatever these
            // targets answered, it is never refunded as refused.
            cluster::ForwardResult result = forwarded;
            result.maybe_ran = result.maybe_ran || earlier.maybe_ran;
            if (earlier.any() && result.unplaced) {
                // Accepted there, then no room before any token: the error after acceptance it
                // is, its prompt as told.
                result.unplaced = false;
                result.accepted = true;
                if (earlier.accepted) {
                    // It may have generated at the peer that accepted it before: charged as an
                    // answer cut after acceptance, as when this site or the forwarder's own
                    // next peer ends it so.
                    result.usage_unknown = true;
                    result.prompt_tokens = std::max(result.prompt_tokens, earlier.prompt_tokens);
                }
            } else if (earlier.accepted && !result.accepted && !result.usage_unknown &&
                       (result.status >= 400 || (result.cancelled && !result.started))) {
                // Refused there, or the client left before any of these targets answered (still
                // counted cancelled): it may have generated at the peer that accepted it, charged
                // as an answer cut after acceptance, as the forwarder charges the same end after
                // a peer of its own list.
                result.accepted = true;
                result.usage_unknown = true;
                result.prompt_tokens = earlier.prompt_tokens;
            }
            if (result.run_here && req != nullptr) {
                // Every remote site before this one in the plan failed before answering: it runs
                // here, as a retry at the next candidate would. (The forwarder sets run_here only
                // for a plan holding this site, which is when `req` is kept.)
                notes->note("attempts", result.attempts);
                notes->note("fallback", "local");
                // A peer tried may have run it, or accepted it before its answer was cut: a
                // refusal here or after settles as one of a later peer would.
                const EarlierTargets tried{result.maybe_ran, result.accepted, result.prompt_tokens,
                                           most_output};
                run_here(std::move(*req), notes, lease, tenant_name,
                         again != nullptr
                             ? forward_elsewhere(again, std::move(*after_here), tenant_name,
                                                 most_output, tried)
                             : Elsewhere(),
                         tried);
                return;
            }
            notes->note("served_by", result.site_id);
            notes->note("attempts", result.attempts);
            note_usage(*notes, result.prompt_tokens, result.completion_tokens);
            // Refused before it ran, as run_here() settles a refusal: the lease ends refused
            // (a prompt read to refuse it charged when refused for itself), counted rejected.
            auto refused = [&](const char* reason, TenantLimiter::Lease::Refusal why) {
                notes->note("rejected", std::string(reason));
                lease->refuse(why, result.prompt_tokens);
                if (metrics != nullptr) {
                    metrics->on_tenant_rejected(tenant_name, reason);
                    metrics->on_tenant_request(tenant_name, "rejected");
                }
            };
            if (forward_never_ran(result) && result.unplaced) {
                // Its engine accepted it, then found no room before any token: as run_here()
                // settles a request never placed, a refusal for capacity with the engine's reason.
                refused(result.status == 429 ? "queue_full" : "overloaded",
                        TenantLimiter::Lease::Refusal::kCapacity);
                return;
            }
            if (forward_never_ran(result)) {
                // As a local engine's refusal: for its load (503), everything admission took
                // goes back; for the tenant's own queue full there (a 429: a peer applies no rate
                // limit to a forwarded request, and its shared queue full is a 503), the request
                // token stays spent, or a tenant whose queue there is full could have the peer
                // tokenize its prompts at any rate.
                refused("peer_refused", result.status == 429
                                            ? TenantLimiter::Lease::Refusal::kRequest
                                            : TenantLimiter::Lease::Refusal::kCapacity);
                return;
            }
            if (const char* reason = forward_refusal_reason(result)) {
                // The peer's engine refused the request itself (its prompt beyond the context, a
                // field it cannot take): as the same refusal here, the request token and the
                // prompt it read stay spent, or a tenant could have peers tokenize prompts
                // without end, never held to its input limit.
                refused(reason, TenantLimiter::Lease::Refusal::kRequest);
                return;
            }
            // Cut, or the client left, before the peer's usage report: charged the most it may
            // have generated (max_tokens of each choice), so a tenant cannot stream for free by
            // leaving before the end.
            const int64_t completion =
                result.usage_unknown ? most_output : result.completion_tokens;
            lease->finish(result.prompt_tokens, completion);
            if (metrics != nullptr) {
                // Tokens served, as far as known (the charge above is not a count).
                metrics->on_tenant_tokens(tenant_name, result.prompt_tokens,
                                          result.completion_tokens);
                // A stream that failed after its head (cut, or the peer's error event), or an
                // error answer after the peer accepted it, is an error, as the same failure here
                // is; one the peer stopped for its load or a shutdown, or whose client left, is
                // cancelled, as here.
                metrics->on_tenant_request(tenant_name, forward_outcome(result));
            }
        },
        std::move(on_accepted), earlier);
}

ApiRouter::Elsewhere ApiRouter::forward_elsewhere(std::shared_ptr<tls::HttpRequest> request,
                                                  std::vector<cluster::RouteTarget> targets,
                                                  const std::string& tenant_name,
                                                  int64_t most_output, EarlierTargets earlier) {
    auto rest = std::make_shared<std::vector<cluster::RouteTarget>>(std::move(targets));
    return [this, request = std::move(request), rest = std::move(rest), tenant_name, most_output,
            earlier](std::shared_ptr<tls::ResponseChannel> refused_here,
                     std::shared_ptr<TenantLimiter::Lease> lease) {
        refused_here->note("fallback", "remote");
        forward_to(std::move(*request), nullptr, std::move(*rest), std::move(refused_here),
                   std::move(lease), tenant_name, most_output, earlier);
    };
}

void ApiRouter::run_here(ParsedRequest req, std::shared_ptr<tls::ResponseChannel> channel,
                         std::shared_ptr<TenantLimiter::Lease> admitted,
                         const std::string& tenant_name, Elsewhere elsewhere,
                         EarlierTargets earlier) {
    channel->note("served_by", site_id_);
    std::shared_ptr<TenantLimiter::Lease> lease = admitted;
    RefusalTaker take_refusal;
    if (elsewhere) {
        take_refusal = [elsewhere = std::move(elsewhere), channel, admitted](const Status& s) {
            if (s.code() != StatusCode::kUnavailable) {
                return false;
            }
            elsewhere(channel, admitted);
            return true;
        };
    }
    run_completion(
        generator_, std::move(req), channel, clock_.wall_now_us() / 1'000'000,
        [lease = std::move(admitted), metrics = metrics_, tenant_name, channel, earlier](
            const engine::Finish& finish, bool refused) {
            const bool capacity = finish.error.code() == StatusCode::kResourceExhausted ||
                                  finish.error.code() == StatusCode::kUnavailable;
            // Accepted, then ended for capacity before any token (no free sequence slot, no KV
            // room for it once queued): as a full queue's refusal at submit, not the tenant's
            // doing, and counted as one (rejected, with its reason; not an error).
            const bool never_placed = finish.reason == engine::FinishReason::kError &&
                                      capacity && finish.usage.completion_tokens == 0;
            // Refused at submit for the tenant's own queue here being full (the 429 naming it;
            // the model's whole queue full is kUnavailable): the tenant's doing, after the
            // engine tokenized its prompt.
            const bool own_queue_full =
                refused && finish.error.code() == StatusCode::kResourceExhausted;
            // A peer tried before may have run it, or accepted it before its answer was cut:
            // this site's refusal settles nothing of that. It is the error after acceptance it
            // is, never given back, its prompt as that peer told it (or as read here), as the
            // forwarder settles a later peer's refusal.
            const bool after_peer = (refused || never_placed) && earlier.any();
            const bool rejected = (refused || never_placed) && !after_peer;
            engine::Finish settled = finish;
            if (after_peer) {
                settled.usage.prompt_tokens =
                    std::max(finish.usage.prompt_tokens, earlier.prompt_tokens);
            }
            const char* outcome = note_finish(*channel, settled, rejected);
            if (rejected) {
                // It never generated: the model's full queue or an overloaded engine gives back
                // all that admission took, as a routing refusal does; a request refused for
                // itself (a prompt beyond the context, one the engine cannot take) or for its
                // tenant's full queue keeps its rate token and prompt charge, or a tenant could
                // have the engine tokenize prompts without end, never held to its rate.
                lease->refuse(capacity && !own_queue_full ? TenantLimiter::Lease::Refusal::kCapacity
                                                          : TenantLimiter::Lease::Refusal::kRequest,
                              finish.usage.prompt_tokens);
            } else {
                // After a peer that accepted it, what it may have generated there, as an answer
                // cut after acceptance is charged.
                lease->finish(settled.usage.prompt_tokens,
                              after_peer && earlier.accepted ? earlier.most_output
                                                             : settled.usage.completion_tokens);
            }
            if (metrics == nullptr) {
                return;
            }
            // Tokens served: a refused prompt was read, not run.
            metrics->on_tenant_tokens(tenant_name, rejected ? 0 : settled.usage.prompt_tokens,
                                      settled.usage.completion_tokens);
            if (rejected) {
                metrics->on_tenant_rejected(tenant_name, engine_refusal_reason(finish.error));
            }
            metrics->on_tenant_request(tenant_name, outcome);
        },
        // The prompt counts against input_tokens_per_minute from now, not from its end.
        [lease = std::move(lease)](int64_t prompt_tokens) { lease->charge_prompt(prompt_tokens); },
        std::move(take_refusal));
}

}  // namespace edge::daemon::api
