#pragma once

// The deferred head of a forwarded non-streamed answer. A non-streamed answer's status is known
// only when the generation ends, which may be long after the peer accepted the request; a
// forwarder waiting that long for the head cannot tell a slow generation from a dead peer. So a
// forwarding site asks for it (request header kDeferredHeadHeader) and the peer, once its engine
// accepted the request, sends at once a 200 head marked with kDeferredHeadHeader and, when the
// answer is ready, a body that encodes the whole answer (status, content type, headers, body).
// The forwarder decodes it and answers its client as if it had arrived whole. An answer known
// before acceptance (the engine refused it) goes out as a plain response.
//
// DeferredHeadChannel is the peer side: a ResponseChannel around the connection's. Thread-safe
// like any ResponseChannel; open() and respond() may race (an answer that comes first goes out
// plain).

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "tls/http_types.h"

namespace edge::daemon::api {

// Sent by a forwarding site that decodes deferred answers, and on the peer's deferred head.
inline constexpr std::string_view kDeferredHeadHeader = "X-Edgeserve-Deferred-Head";

// "<status>\n<content type>\n<name>: <value>\n...\n\n<body>".
std::string encode_deferred_response(const tls::HttpResponse& response);
// nullopt when `bytes` is not such an encoding.
std::optional<tls::HttpResponse> decode_deferred_response(std::string_view bytes);

class DeferredHeadChannel final : public tls::ResponseChannel {
public:
    explicit DeferredHeadChannel(std::shared_ptr<tls::ResponseChannel> inner)
        : inner_(std::move(inner)) {}

    // The engine accepted the request: the deferred head goes out unless the answer did, with
    // the prompt's length (cluster::kPromptTokensHeader).
    void open(int64_t prompt_tokens);

    void respond(tls::HttpResponse response) override;
    // A stream passes through unchanged (not expected: only non-streamed requests are wrapped).
    void begin_stream(tls::HttpResponse head) override;
    void write(std::string chunk) override;
    void end_stream() override;
    void on_client_gone(std::function<void()> callback) override;
    void note(std::string name, std::variant<std::string, int64_t> value) override {
        inner_->note(std::move(name), std::move(value));
    }

private:
    const std::shared_ptr<tls::ResponseChannel> inner_;
    std::mutex mu_;
    bool opened_ = false;    // The deferred head went out.
    bool answered_ = false;  // respond() or begin_stream() happened.
};

}  // namespace edge::daemon::api
