// PeerClient::Impl's connections: the TLS client context from the PEM files, and a connection
// to a peer (name lookup, TCP connect, TLS handshake with the site's identity checked), all
// bounded by connect_timeout.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>

#include "daemon/forward/peer_client_impl.h"
#include "tls/tls_context.h"

namespace edge::daemon::forward {

Result<HostPort> split_host_port(std::string_view addr) {
    std::string_view host;
    std::string_view port;
    if (!addr.empty() && addr.front() == '[') {
        size_t close = addr.find(']');
        if (close == std::string_view::npos || close + 1 >= addr.size() || addr[close + 1] != ':') {
            return invalid_argument_error("peer address '" + std::string(addr) +
                                          "' is not [IPv6]:port");
        }
        host = addr.substr(1, close - 1);
        port = addr.substr(close + 2);
    } else {
        size_t colon = addr.rfind(':');
        if (colon == std::string_view::npos || colon == 0) {
            return invalid_argument_error("peer address '" + std::string(addr) +
                                          "' is not host:port");
        }
        host = addr.substr(0, colon);
        port = addr.substr(colon + 1);
    }
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return invalid_argument_error("peer address '" + std::string(addr) + "' has a bad port");
    }
    if (const int number = std::stoi(std::string(port)); number < 1 || number > 65535) {
        return invalid_argument_error("peer address '" + std::string(addr) +
                                      "' has a port outside 1..65535");
    }
    return HostPort{std::string(host), std::string(port)};
}

Result<std::shared_ptr<ssl::context>> PeerClient::Impl::load_context(const std::string& ca_path,
                                                                     const std::string& cert_path,
                                                                     const std::string& key_path) {
    auto context = std::make_shared<ssl::context>(ssl::context::tls_client);
    SSL_CTX* ctx = context->native_handle();
    ERR_clear_error();
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    EDGE_RETURN_IF_ERROR(tls::use_forward_secret_ciphers(ctx));  // As the peer listener takes.
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    // Never OpenSSL's terminal prompt (tls::refuse_pem_passphrase): the chain is read with it too.
    SSL_CTX_set_default_passwd_cb(ctx, tls::refuse_pem_passphrase);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_path.c_str()) != 1) {
        return invalid_argument_error("peer: cannot load certificate '" + cert_path +
                                      "': " + tls::openssl_errors());
    }
    if (Status key = tls::use_private_key_file(ctx, key_path); !key.ok()) {
        return invalid_argument_error("peer: " + key.message());
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        return invalid_argument_error("peer: key '" + key_path + "' does not match certificate '" +
                                      cert_path + "'");
    }
    if (SSL_CTX_load_verify_locations(ctx, ca_path.c_str(), nullptr) != 1) {
        return invalid_argument_error("peer: cannot load cluster CA '" + ca_path +
                                      "': " + tls::openssl_errors());
    }
    if (!tls::holds_ca_certificate(ca_path)) {
        // A site's own (leaf) certificate copied over the CA file, say: trusting only it, every
        // forward would fail. Refused as the peer listener refuses it (the same message), so a
        // reload keeps both sides on the old CA.
        return invalid_argument_error("peer: cluster CA '" + ca_path +
                                      "' holds no CA certificate (basicConstraints CA:TRUE); "
                                      "give the cluster CA's certificate, not a site's");
    }
    // Trust is membership of the cluster CA; peer addresses are often bare IPs, so the peer's
    // name is not checked against the address.
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    return context;
}

net::awaitable<std::unique_ptr<Connection>> PeerClient::Impl::connect(ForwardJob& job,
                                                                      const std::string& site_id,
                                                                      const std::string& peer_addr,
                                                                      Failure& failure,
                                                                      std::string& error) {
    failure = Failure::kConnect;
    Result<HostPort> hp = split_host_port(peer_addr);
    if (!hp.ok()) {
        error = hp.status().message();
        co_return nullptr;
    }
    std::vector<tcp::endpoint> endpoints;
    // The lookup and the connect share one connect_timeout.
    auto connect_by = SteadyClock::now() + config_.connect_timeout;
    boost::system::error_code ec;
    net::ip::address literal = net::ip::make_address(hp->host, ec);
    uint16_t port = static_cast<uint16_t>(std::stoi(hp->port));
    if (!ec) {
        endpoints.emplace_back(literal, port);
    } else {
        // The lookup counts against connect_timeout, and ends when the client goes away or
        // gossip finds the site dead (stop_attempt), as the connect after it does.
        auto resolver = std::make_shared<tcp::resolver>(strand_);
        net::steady_timer deadline(strand_, config_.connect_timeout);
        deadline.async_wait([resolver](boost::system::error_code wait_ec) {
            if (!wait_ec) {
                resolver->cancel();
            }
        });
        job.resolving = resolver;
        auto [rec, results] = co_await resolver->async_resolve(hp->host, hp->port, kTuple);
        job.resolving.reset();
        // Cancelled by the deadline's handler (not by the client or gossip: checked below).
        const bool timed_out = rec == net::error::operation_aborted;
        deadline.cancel();
        connect_by = deadline.expiry();
        if (job.cancelled || job.site_lost) {
            error = job.cancelled ? "cancelled" : "the site was found dead";
            co_return nullptr;
        }
        if (rec || timed_out) {
            failure = timed_out ? Failure::kTimeout : Failure::kConnect;
            error = "cannot resolve '" + hp->host +
                    "': " + (timed_out ? std::string("timed out") : rec.message());
            co_return nullptr;
        }
        for (const auto& entry : results) {
            endpoints.push_back(entry.endpoint());
        }
    }
    auto connection = std::make_unique<Connection>(strand_, context());
    job.current = connection.get();
    auto& layer = beast::get_lowest_layer(connection->stream);
    layer.expires_at(connect_by);
    auto [cec, endpoint] = co_await layer.async_connect(endpoints, kTuple);
    if (cec) {
        job.current = nullptr;
        failure = cec == beast::error::timeout ? Failure::kTimeout : Failure::kConnect;
        error = "connect: " + cec.message();
        co_return nullptr;
    }
    boost::system::error_code ignored;
    layer.socket().set_option(tcp::no_delay(true), ignored);
    // A deferred answer's wait is long (deferred_answer_timeout, see attempt()): keepalive probes
    // notice a peer host that vanished sooner.
    layer.socket().set_option(net::socket_base::keep_alive(true), ignored);
    int keep_idle_s = 10;
    int keep_interval_s = 5;
    int keep_count = 3;
    setsockopt(layer.socket().native_handle(), IPPROTO_TCP, TCP_KEEPIDLE, &keep_idle_s,
               sizeof(keep_idle_s));
    setsockopt(layer.socket().native_handle(), IPPROTO_TCP, TCP_KEEPINTVL, &keep_interval_s,
               sizeof(keep_interval_s));
    setsockopt(layer.socket().native_handle(), IPPROTO_TCP, TCP_KEEPCNT, &keep_count,
               sizeof(keep_count));
    SSL* ssl = connection->stream.native_handle();
    if (ec) {  // A name, not an IP literal: send it as SNI.
        SSL_set_tlsext_host_name(ssl, hp->host.c_str());
    }
    if (config_.verify_site_identity) {
        // The certificate must name the site gossip says is at this address (a DNS
        // subjectAltName equal to the site id): another site's certificate, from the same CA,
        // is refused. Never the subject's common name, which OpenSSL falls back to when the
        // certificate has no DNS subjectAltName: the peer listener reads DNS names only (the hop
        // header), so a CN=<site> certificate with only an IP SAN must not pass for the site here.
        SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_WILDCARDS | X509_CHECK_FLAG_NEVER_CHECK_SUBJECT);
        if (SSL_set1_host(ssl, site_id.c_str()) != 1) {
            job.current = nullptr;  // Not left naming the connection destroyed on return.
            error = "site id '" + site_id + "' cannot be checked against a certificate";
            co_return nullptr;
        }
    }
    auto [hec] = co_await connection->stream.async_handshake(ssl::stream_base::client, kTuple);
    job.current = nullptr;
    if (hec) {
        failure = hec == beast::error::timeout ? Failure::kTimeout : Failure::kConnect;
        error = "TLS handshake: " + hec.message();
        if (SSL_get_verify_result(ssl) == X509_V_ERR_HOSTNAME_MISMATCH) {
            error += " (its certificate does not name site '" + site_id +
                     "' as a DNS subjectAltName: peer.verify_site_identity)";
        }
        connection->close();
        co_return nullptr;
    }
    opened_.fetch_add(1);
    co_return connection;
}

}  // namespace edge::daemon::forward
