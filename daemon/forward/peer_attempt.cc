// PeerClient::Impl::attempt: one forward's try at one target, from the request written to the
// answer relayed (or the reason the next target is to be tried), and what the client is told of
// an answer that broke.

#include <algorithm>
#include <array>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http.hpp>
#include <optional>

#include "common/log.h"
#include "daemon/api/deferred_response.h"
#include "daemon/forward/peer_client_impl.h"
#include "daemon/forward/usage_scanner.h"
#include "daemon/metrics.h"

namespace edge::daemon::forward {

namespace http = beast::http;

namespace {

// Client headers that travel to the peer. Never Authorization: the tenant travels instead.
constexpr std::string_view kForwardedRequestHeaders[] = {"content-type",
                                                         "accept",
                                                         cluster::kModelVersionHeader,
                                                         "x-request-id",
                                                         "user-agent",
                                                         cluster::kRequestIdHeader,
                                                         cluster::kMaxTokensHeader,
                                                         cluster::kMaxPromptTokensHeader,
                                                         cluster::kMaxContextTokensHeader};

// Peer response headers not passed to the client: hop-by-hop ones, those our server writes, and
// those the peer's Connection header names (`connection`: its values, comma-joined), which are
// hop-by-hop too (RFC 9110 7.6.1) and meant for this site only.
bool is_hop_by_hop(std::string_view name, std::string_view connection) {
    for (std::string_view h : {"connection", "keep-alive", "transfer-encoding", "content-length",
                               "te", "trailer", "upgrade", "proxy-connection", "content-type"}) {
        if (beast::iequals(name, h)) {
            return true;
        }
    }
    while (!connection.empty()) {
        const size_t comma = connection.find(',');
        std::string_view token = connection.substr(0, comma);
        connection =
            comma == std::string_view::npos ? std::string_view() : connection.substr(comma + 1);
        while (!token.empty() && (token.front() == ' ' || token.front() == '\t')) {
            token.remove_prefix(1);
        }
        while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) {
            token.remove_suffix(1);
        }
        if (beast::iequals(name, token)) {
            return true;
        }
    }
    return false;
}

// The usage reports for this site only (on a head, or a deferred answer's), never relayed.
bool is_usage_header(std::string_view name) {
    return beast::iequals(name, cluster::kPromptTokensHeader) ||
           beast::iequals(name, cluster::kCompletionTokensHeader);
}

// A count the peer told in header `name` of a deferred answer; nullopt when absent or malformed.
std::optional<int64_t> told_count(const tls::HttpResponse& answer, std::string_view name) {
    for (const tls::HttpHeader& h : answer.headers) {
        if (beast::iequals(h.name, name)) {
            return cluster::header_count(h.value, 0, kMaxToldTokens);
        }
    }
    return std::nullopt;
}

// What an answer the peer accepted used: its usage report, or, without one (cut, the client
// gone, a peer that sends none), the prompt its head told and a generation of unknown length.
void take_usage(ForwardJob& job, const UsageScanner& usage) {
    if (usage.failed()) {
        job.result.failed = true;
        job.result.failed_unavailable = usage.error_code() == "service_unavailable";
    }
    if (usage.reported()) {
        job.result.prompt_tokens = usage.prompt_tokens();
        job.result.completion_tokens = usage.completion_tokens();
    } else {
        job.result.usage_unknown = true;
        job.result.prompt_tokens = job.accepted_prompt_tokens;
    }
}

}  // namespace

net::awaitable<void> PeerClient::Impl::testing_delay(const RouteTarget& target) {
    auto it = config_.testing_delay.find(target.site_id);
    if (it == config_.testing_delay.end() || it->second.count() <= 0) {
        co_return;
    }
    net::steady_timer timer(strand_, it->second);
    co_await timer.async_wait(kTuple);
}

net::awaitable<bool> PeerClient::Impl::attempt(ForwardJob& job, const RouteTarget& target) {
    const auto start = SteadyClock::now();
    // `reported`: the planner already heard of this attempt (at the response head).
    auto fail = [&](Failure failure, const std::string& why, bool reported = false) {
        job.last_failure = failure;
        job.last_error = "site '" + target.site_id + "' (" + target.peer_addr + "): " + why;
        if (!reported) {
            report(target, false, SteadyClock::now() - start);
        }
        log::info("forward_attempt_failed", {{"site", target.site_id},
                                             {"peer", target.peer_addr},
                                             {"reason", std::string(failure_reason(failure))},
                                             {"error", why}});
    };

    job.current_site = target.site_id;
    job.site_lost = false;
    http::request<http::string_body> req;
    req.version(11);
    req.method_string(job.request.method);
    req.target(job.request.target);
    req.set(http::field::host, target.peer_addr);
    req.set(cluster::kHopHeader, config_.site_id);
    req.set(cluster::kTenantHeader, job.tenant);
    // A non-streamed answer's head comes once the peer's engine accepted the request.
    req.set(api::kDeferredHeadHeader, "1");
    for (std::string_view name : kForwardedRequestHeaders) {
        std::string_view value = job.request.header(name);
        if (!value.empty()) {
            req.set(name, value);
        }
    }
    req.body() = job.request.body;
    req.keep_alive(true);
    req.prepare_payload();

    co_await testing_delay(target);  // Testing only: the request's way there.
    if (job.cancelled) {
        co_return true;
    }
    // Pooled per site and address: a connection is only reused for the site it was verified as.
    const std::string pool_key = target.site_id + " " + target.peer_addr;
    std::unique_ptr<Connection> conn = take_pooled(pool_key);
    std::optional<http::response_parser<http::buffer_body>> parser;
    for (int tries = 0;; ++tries) {
        if (!conn) {
            Failure failure = Failure::kNone;
            std::string why;
            conn = co_await connect(job, target.site_id, target.peer_addr, failure, why);
            if (job.cancelled) {
                co_return true;
            }
            if (!conn) {
                fail(failure, why);
                co_return false;
            }
        }
        job.current = conn.get();
        auto& layer = beast::get_lowest_layer(conn->stream);
        layer.expires_after(config_.response_timeout);
        auto [wec, wn] = co_await http::async_write(conn->stream, req, kTuple);
        boost::system::error_code ec = wec;
        // An interim head (1xx: 100 Continue, 103 Early Hints) may precede the answer's and is
        // not passed on (RFC 9110 15.2): taken for the answer, it reached the client as a bare
        // 1xx and left the real answer unread on the connection. Their count is bounded by
        // response_timeout, which covers them all.
        bool interim = false;
        while (!ec) {
            parser.emplace();
            parser->header_limit(64 * 1024);
            // Beast's default 8 MiB body limit would cut a healthy stream (a long reasoning
            // reply, logprobs) and refuse answers below max_response_bytes, which bounds the
            // answers read whole (the loop below); a stream relays as it goes.
            parser->body_limit(boost::none);
            auto [hec, hn] =
                co_await http::async_read_header(conn->stream, conn->buffer, *parser, kTuple);
            ec = hec;
            if (ec || parser->get().result_int() >= 200) {
                break;
            }
            interim = true;
        }
        if (!ec) {
            break;
        }
        job.current = nullptr;
        // A pooled connection the peer closed while idle fails before any answer: once, open a
        // fresh one to the same target instead of counting it as the target's failure (not when
        // this site closed it because gossip declared the target dead).
        bool stale = !job.site_lost && conn->reused && tries == 0 && !interim &&
                     ec != beast::error::timeout && (parser == std::nullopt || !parser->got_some());
        conn->close();
        conn.reset();
        if (job.cancelled) {
            co_return true;
        }
        if (stale) {
            continue;
        }
        job.head_timed_out = job.head_timed_out || ec == beast::error::timeout;
        fail(ec == beast::error::timeout ? Failure::kTimeout : Failure::kReset,
             job.site_lost ? std::string("no response head: declared dead by gossip")
                           : "no response head: " + ec.message());
        co_return false;
    }

    co_await testing_delay(target);  // Testing only: the answer's way back.
    if (job.cancelled) {
        job.current = nullptr;
        conn->close();
        co_return true;
    }
    const auto to_head = SteadyClock::now() - start;
    auto& response = parser->get();
    const int status = response.result_int();
    if (std::string_view refusal = response[api::kPeerRefusalHeader];
        !refusal.empty() && status >= 400 && status < 500) {
        // The peer's listener refused this site itself (its certificate does not name this
        // site's id there, say): the request never ran, and the client did nothing wrong. As
        // a peer whose certificate fails this site's check: a failure to connect, the next
        // target (or this site) runs it. Relayed, every request routed there got that 403,
        // the peer heard as healthy, the tenant charged.
        job.current = nullptr;
        conn->close();
        fail(Failure::kConnect, "its peer listener refused this site's forward (" +
                                    std::to_string(status) + " " +
                                    std::string(refusal.substr(0, 64)) + ")");
        co_return false;
    }
    // A deferred answer (api/deferred_response.h): the peer accepted the request; its answer,
    // status included, is the body. If the connection breaks before it, nothing reached the
    // client and the next target is tried (a peer that died mid-generation), not charged twice.
    const bool deferred = status == 200 && !response[api::kDeferredHeadHeader].empty();
    const bool streamed = !deferred && !parser->is_done() &&
                          (parser->chunked() || !parser->content_length().has_value());
    // The head of an accepted request says only that it was accepted: its outcome is reported
    // at the answer's end. Reported here as a success, it reset the detector's consecutive
    // failures before the cut that followed, so a peer that accepted and then died every time
    // was never ejected.
    const bool accepted = deferred || (streamed && status == 200);
    // What ran there before an error answer after acceptance, as the peer told: a deferred
    // one's (below), or a plain one's, which a peer sends when the end came before its deferred
    // head could go out (a race there). Told on a plain one (the generated tokens' count marks
    // it), read as the deferred one's is: run again elsewhere only when it says no token was
    // generated, and charged. The prompt's length alone comes on a refusal before the request
    // ran: what the peer's engine read to refuse it.
    std::optional<int64_t> told_prompt;
    std::optional<int64_t> told_completion;
    bool told_usage = false;
    if (!deferred && !streamed && status != 200) {
        told_usage = !response[cluster::kCompletionTokensHeader].empty();
        if (!response[cluster::kPromptTokensHeader].empty()) {
            told_prompt = cluster::header_count(response[cluster::kPromptTokensHeader], 0,
                                                kMaxToldTokens);
        }
        if (told_usage) {
            told_completion = cluster::header_count(response[cluster::kCompletionTokensHeader],
                                                    0, kMaxToldTokens);
        }
    }
    if (status != 503 && !accepted) {
        // A 503 head is a refusal before the request ran (the peer's queue full, draining,
        // loading): load and state, which gossip gives the cost, not ill health. Counted as a
        // failure, a site busy for a moment was ejected for 30 s and more, past its load.
        report(target, status < 500, to_head);
    }
    if (metrics_ != nullptr) {
        metrics_->on_forward_latency(target.site_id, to_head);
    }
    // After acceptance, as for a deferred answer (below): only a refusal for capacity (503 or
    // 429) before any token is run again.
    const bool rerunnable = told_usage ? (status == 503 || status == 429) &&
                                             told_completion == int64_t{0}
                                       : status >= 500;
    if (rerunnable && can_retry(job)) {
        job.current = nullptr;
        conn->close();
        fail(Failure::kStatus5xx, "answered " + std::to_string(status), true);
        co_return false;
    }

    tls::HttpResponse head;
    head.status = status;
    auto content_type = response[http::field::content_type];
    head.content_type = content_type.empty() ? "application/json" : std::string(content_type);
    std::string connection;
    for (const auto& field : response) {
        if (field.name() == http::field::connection) {
            connection.append(field.value()).push_back(',');
        }
    }
    for (const auto& field : response) {
        if (!is_hop_by_hop(field.name_string(), connection)) {
            head.headers.push_back({std::string(field.name_string()), std::string(field.value())});
        }
    }
    head.headers.push_back({std::string(kServedByHeader), target.site_id});
    // For this site only: the prompt's length, sent once the peer's engine accepted the request
    // (and an error answer's usage).
    std::erase_if(head.headers, [](const tls::HttpHeader& h) { return is_usage_header(h.name); });
    const bool accepted_before = job.result.accepted;  // By a peer tried before, then cut.
    if (accepted) {
        // Only a request its engine took gets either head (an error is a whole answer).
        job.result.accepted = true;
        job.accepted_prompt_tokens =
            cluster::header_count(response[cluster::kPromptTokensHeader], 0, kMaxToldTokens)
                .value_or(0);
        // Charged now, as a run here is on its acceptance, not when the answer ends: a tenant's
        // long streams elsewhere would otherwise all be admitted before the first one's prompt
        // put its input tokens in debt.
        if (job.on_accepted && job.accepted_prompt_tokens > 0) {
            job.on_accepted(job.accepted_prompt_tokens);
        }
    }
    const bool event_stream = beast::iequals(content_type, "text/event-stream");
    job.result.status = status;
    if (streamed) {
        job.channel->begin_stream(head);
        job.result.started = true;
    }

    UsageScanner usage;
    std::string body;
    std::array<char, 16 * 1024> chunk;
    boost::system::error_code ec;
    auto& layer = beast::get_lowest_layer(conn->stream);
    // A deferred answer's first byte comes when the generation has ended: the wait for it is
    // bounded by deferred_answer_timeout (0: by nothing but the peer's death, found by a reset or
    // keepalive, and the client's going away). Once it began, as any body, by stream_idle_timeout.
    const auto answer_by = SteadyClock::now() + config_.deferred_answer_timeout;
    while (!parser->is_done()) {
        response.body().data = chunk.data();
        response.body().size = chunk.size();
        if (deferred && body.empty()) {
            if (config_.deferred_answer_timeout.count() > 0) {
                layer.expires_at(answer_by);
            } else {
                layer.expires_never();
            }
        } else {
            layer.expires_after(config_.stream_idle_timeout);
        }
        auto [rec, rn] =
            co_await http::async_read_some(conn->stream, conn->buffer, *parser, kTuple);
        size_t got = chunk.size() - response.body().size;
        if (got > 0) {
            std::string_view piece(chunk.data(), got);
            if (streamed) {
                // Events pass whole, less the peer's usage report (only for this site).
                std::string relay = event_stream ? usage.feed_events(piece) : std::string(piece);
                if (!relay.empty()) {
                    job.channel->write(std::move(relay));
                }
            } else if (body.size() + got > config_.max_response_bytes) {
                ec = http::error::body_limit;
                break;
            } else {
                body.append(piece);
            }
        }
        if (rec && rec != http::error::need_buffer) {
            ec = rec;
            break;
        }
        if (job.cancelled) {
            break;
        }
    }
    // An edgeserve stream always ends with its end event, an error event before it when the
    // generation failed: a peer that ended the body without it (a close-delimited body cut by
    // the peer's death reads as ended) cut the answer, and the client is told so in-band.
    if (!ec && !job.cancelled && streamed && event_stream && status == 200 && !usage.ended()) {
        ec = http::error::partial_message;
    }
    job.current = nullptr;
    if (ec || job.cancelled) {
        conn->close();
        // A peer silent past a timeout is stuck or too slow, not gone: the request is not run
        // again elsewhere (it would take as long, and the client has waited that long already).
        const bool timed_out = ec == beast::error::timeout;
        if (!job.cancelled && deferred && body.empty() && ec != http::error::body_limit &&
            !timed_out && can_retry(job)) {
            // Nothing reached the client and the peer is gone: the next target runs it, as for
            // a peer that died before its head. Not once its answer began: a deferred body
            // starts when the generation has ended, so the peer ran it whole (running it again
            // would generate, and charge, it twice).
            fail(Failure::kReset, "deferred answer cut: " + ec.message());
            co_return false;
        }
        // The bytes held at the cut: a usage report without its blank line is read, the start
        // of an event is dropped (the error event below must not join it).
        const std::string close_event = usage.cut();
        // The peer ran it and this is the end: what it reported, else the tenant pays the
        // reservation (ForwardResult::usage_unknown).
        take_usage(job, usage);
        if (job.cancelled) {
            co_return true;  // The client left (or stop()): nothing learnt of the peer's health.
        }
        // Cut after the stream's end event, or after the usage report the peer writes after its
        // last event and just before that end event: the client has the whole answer (a peer
        // that closed before the end event or the chunked body's terminator).
        const bool whole = streamed && event_stream && (usage.ended() || usage.reported());
        if (accepted && ec != http::error::body_limit) {  // The limit is this site's.
            report(target, whole, to_head);
        }
        log::warn(
            "forward_response_cut",
            {{"site", target.site_id},
             {"streamed", streamed},
             {"error", job.site_lost ? std::string("declared dead by gossip") : ec.message()}});
        if (whole) {
            // Ended as it would have ended.
            if (!usage.ended()) {
                job.channel->write("data: [DONE]\n\n");
            }
            job.deliver_last = [channel = job.channel] { channel->end_stream(); };
            co_return true;
        }
        const api::ApiError e =
            broken_answer_error(job, target, ec, streamed, deferred && body.empty());
        if (streamed) {
            // Bytes are out: no retry. Say so in-band where the format allows, then end.
            if (event_stream) {
                // Ended as a locally cut stream is: the error event, then the stream's end;
                // after the relayed part of an over-long event, a blank line ends that event
                // first, so the error is an event of its own.
                job.channel->write(close_event + "data: " + e.to_json() + "\n\ndata: [DONE]\n\n");
            }
            job.result.failed = true;
            job.deliver_last = [channel = job.channel] { channel->end_stream(); };
        } else {
            job.result.status = e.status;
            job.result.started = true;
            job.deliver_last = [channel = job.channel, r = e.to_response()]() mutable {
                channel->respond(std::move(r));
            };
        }
        co_return true;
    }
    if (streamed) {
        if (std::string held = usage.flush(); !held.empty()) {
            job.channel->write(std::move(held));
        }
        job.deliver_last = [channel = job.channel] { channel->end_stream(); };
        if (accepted) {
            report(target, true, to_head);
        }
        // A stream that ended without the peer's report (not an edgeserve peer of this
        // version) is charged as one cut: otherwise it would be free.
        take_usage(job, usage);
    } else {
        if (deferred) {
            // What ran there before an error after acceptance (a deferred error answer's usage,
            // api::Response), as the peer told.
            std::optional<tls::HttpResponse> answer = api::decode_deferred_response(body);
            if (answer) {
                told_prompt = told_count(*answer, cluster::kPromptTokensHeader);
                told_completion = told_count(*answer, cluster::kCompletionTokensHeader);
                std::erase_if(answer->headers,
                              [](const tls::HttpHeader& h) { return is_usage_header(h.name); });
            }
            if (answer && (answer->status == 503 || answer->status == 429) &&
                told_completion == int64_t{0} && can_retry(job)) {
                // Accepted, then refused there for capacity before any token (its engine found
                // no sequence slot or KV room once it was queued, a drain cancelled it while
                // queued): nothing reached the client, so the next target runs it, as after a
                // 503 head. Relayed, the client got a 503 although this site, or another, could
                // run it. Load and state, not ill health: not reported. Not once the peer
                // generated (a drain's deadline, a sequence that outgrew the KV cache, a lost
                // device end a generation well along), nor when it does not say (it may have):
                // run again, the work was done twice and the tokens generated there never
                // charged. Not a 500: that request ran there and failed (a JSON reply no token
                // continues), and would fail again at every target.
                conn->close();
                job.result.accepted = accepted_before;  // Its error was the whole outcome.
                fail(Failure::kStatus5xx,
                     "answered " + std::to_string(answer->status) + " after accepting", true);
                co_return false;
            }
            if (!answer) {
                api::ApiError e;
                e.status = 502;
                e.type = "server_error";
                e.code = "upstream_bad_answer";
                e.message = "site '" + target.site_id + "' sent a malformed deferred answer";
                answer = e.to_response();
            }
            // As for a head (above): a 503 after acceptance (a drain cancelled it) is state.
            if (answer->status != 503) {
                report(target, answer->status < 500, to_head);
            }
            answer->headers.push_back({std::string(kServedByHeader), target.site_id});
            head = std::move(*answer);
            body = std::move(head.body);
            job.result.status = head.status;
        }
        // Accepted there, then refused for capacity before any token (no other target left).
        const bool unplaced_there = (deferred || told_usage) &&
                                    (head.status == 503 || head.status == 429) &&
                                    told_completion == int64_t{0};
        if (head.status == 200) {
            usage.feed_json(body);
            job.result.prompt_tokens = usage.prompt_tokens();
            job.result.completion_tokens = usage.completion_tokens();
        } else if (unplaced_there && !accepted_before && !job.head_timed_out) {
            // Accepted, then refused there for capacity before any token, and no other target
            // left to run it: settled as the same end here is (a refusal for capacity, all that
            // admission took given back, the prompt charged at acceptance too), not as an error
            // after acceptance that ran. Not when a peer of this list tried before may have run
            // it (accepted_before, head_timed_out): then it is that error, its prompt as told,
            // never refunded. After targets the caller tried (ApiRouter's fallback past this
            // site) it stays unplaced: the caller settles it as after those.
            job.result.accepted = false;
            job.result.unplaced = true;
            // The prompt its acceptance charged: the caller keeps it when a peer it tried
            // before this list accepted the request (ApiRouter's fallback past this site).
            job.result.prompt_tokens = told_prompt.value_or(job.accepted_prompt_tokens);
        } else if (deferred || told_usage) {
            // Accepted, then failed there (a drain cancelled it, say): the prompt was read, and
            // what it generated until then, as the peer told (a peer that does not: none).
            // Never refunded as refused, as a deferred answer is not.
            job.result.accepted = true;
            job.result.prompt_tokens =
                told_prompt.value_or(deferred ? job.accepted_prompt_tokens : 0);
            job.result.completion_tokens = told_completion.value_or(0);
            if (unplaced_there && accepted_before) {
                // None generated here, but the peer tried before accepted it and may have
                // generated there before its answer was cut: charged as that answer cut, the
                // prompt told and max_tokens, as when this site or a later peer refuses it.
                job.result.usage_unknown = true;
            }
        } else if (accepted_before) {
            // A peer tried before accepted it, then was cut; this one refused it: as when no
            // other site could take it (finish()), it may have generated there. Relayed with
            // no usage, the refusal settled the charge at nothing, the prompt refunded too.
            job.result.usage_unknown = true;
            job.result.prompt_tokens = job.accepted_prompt_tokens;
        } else {
            // Refused there before it ran (its prompt beyond the context, a field its engine
            // cannot take, a full queue): why, and the prompt the engine read to find out, which
            // the caller charges as it charges the same refusal here.
            usage.feed_json(body);
            job.result.error_code = usage.error_code();
            job.result.prompt_tokens = told_prompt.value_or(0);
        }
        head.body = std::move(body);
        job.result.started = true;
        job.deliver_last = [channel = job.channel, head = std::move(head)]() mutable {
            channel->respond(std::move(head));
        };
    }
    // Bytes read past the answer's end (a peer that sent more than it declared, or a second
    // answer) would be parsed as the next forward's answer on this connection: never pooled.
    if (parser->keep_alive() && conn->buffer.size() == 0) {
        conn->reused = false;
        give_back(pool_key, std::move(conn));
    } else {
        conn->close();
    }
    co_return true;
}

api::ApiError PeerClient::Impl::broken_answer_error(const ForwardJob& job,
                                                    const RouteTarget& target,
                                                    boost::system::error_code ec, bool streamed,
                                                    bool awaiting_answer) const {
    const std::string site = "site '" + target.site_id + "'";
    auto ms = [](std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; };
    api::ApiError e;
    e.type = "server_error";
    if (ec == http::error::body_limit) {
        e.status = 503;
        e.code = "upstream_answer_too_large";
        e.message = "the answer of " + site + " is larger than " +
                    std::to_string(config_.max_response_bytes) + " bytes";
    } else if (ec == beast::error::timeout) {
        e.status = 504;
        e.code = "upstream_timeout";
        e.message = awaiting_answer
                        ? site + " accepted the request but sent no answer within " +
                              ms(config_.deferred_answer_timeout) +
                              " (peer.deferred_answer_timeout_ms)"
                        : site + " sent nothing for " + ms(config_.stream_idle_timeout) +
                              (streamed ? " while streaming" : " inside its answer") +
                              " (peer.stream_idle_timeout_ms)";
    } else if (streamed) {
        e.status = 502;
        e.code = "upstream_cut";
        e.message = job.site_lost
                        ? site + " was declared dead (gossip) while streaming"
                        : "the connection to " + site + " broke while streaming: " + ec.message();
    } else {
        e.status = 503;
        e.code = "upstream_cut";
        e.message =
            "the connection to " + site + " broke while reading its answer: " + ec.message();
    }
    return e;
}

}  // namespace edge::daemon::forward
