// The HTTPS server over real loopback sockets with certificates generated at test time.

#include "tls/http_server.h"

#include <doctest/doctest.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "common/log.h"
#include "tests/testing/daemon_yaml.h"
#include "tests/testing/fd_exhaustion.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"
#include "tests/tls/https_fixture.h"
#include "tls/tls_context.h"

using namespace edge;
using namespace edge::tls;
using namespace edge::tls::test;

namespace {

// Writes `chunk` again and again to a stream whose client reads nothing, as a generator far
// faster than its reader, until the server cuts the stream (`gone`) or 1 GiB has gone in.
// Returns the bytes written.
size_t write_until_cut(ResponseChannel& channel, const std::string& chunk,
                       const std::atomic<bool>& gone) {
    constexpr size_t kGiveUp = size_t{1} << 30;
    size_t written = 0;
    while (!gone && written < kGiveUp) {
        channel.write(chunk);
        written += chunk.size();
        std::this_thread::yield();
    }
    return written;
}

// A self-signed RSA-2048 certificate for localhost (the test helpers make EC keys): static-RSA
// key exchange suites such as AES128-SHA need an RSA certificate to be chosen at all.
testing::TestCertificate make_rsa_certificate(const std::string& dir, const std::string& stem) {
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_RSA_gen(2048), EVP_PKEY_free);
    REQUIRE(key != nullptr);
    std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
    X509_set_version(cert.get(), 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 77);
    X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
    X509_set_pubkey(cert.get(), key.get());
    X509_NAME* name = X509_get_subject_name(cert.get());
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
    X509_set_issuer_name(cert.get(), name);
    REQUIRE(X509_sign(cert.get(), key.get(), EVP_sha256()) > 0);
    testing::TestCertificate out{dir + "/" + stem + ".crt", dir + "/" + stem + ".key", "localhost"};
    FILE* f = std::fopen(out.cert_path.c_str(), "w");
    REQUIRE(f != nullptr);
    PEM_write_X509(f, cert.get());
    std::fclose(f);
    testing::write_private_key(out.key_path, key.get());
    return out;
}

// A TLS 1.2 handshake with the server on 127.0.0.1:`port` from a raw OpenSSL client offering only
// the suites of `ciphers` (OpenSSL's notation): the suite agreed on, or "refused".
std::string tls12_suite(uint16_t port, const std::string& ciphers) {
    Result<int> fd = testing::tcp_connect(port);
    REQUIRE(fd.ok());
    std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                          SSL_CTX_free);
    REQUIRE(ctx != nullptr);
    SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
    SSL_CTX_set_max_proto_version(ctx.get(), TLS1_2_VERSION);
    REQUIRE_MESSAGE(SSL_CTX_set_cipher_list(ctx.get(), ciphers.c_str()) == 1, ciphers);
    std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
    SSL_set_fd(ssl.get(), *fd);
    SSL_set_tlsext_host_name(ssl.get(), "localhost");
    const bool done = SSL_connect(ssl.get()) == 1;
    const std::string suite = done ? SSL_get_cipher_name(ssl.get()) : "refused";
    ERR_clear_error();
    ::close(*fd);
    return suite;
}

}  // namespace

TEST_CASE("TLS 1.2 agrees on forward-secret AEAD suites only, for ECDSA and RSA certificates") {
    Fixture f;  // EC P-256 certificates.
    const uint16_t port = f.server->port();
    CHECK(tls12_suite(port, "ECDHE-ECDSA-AES128-GCM-SHA256") == "ECDHE-ECDSA-AES128-GCM-SHA256");
    CHECK(tls12_suite(port, "ECDHE-ECDSA-CHACHA20-POLY1305") == "ECDHE-ECDSA-CHACHA20-POLY1305");
    // CBC with SHA-1 or SHA-384 MACs: OpenSSL's DEFAULT list took them.
    CHECK(tls12_suite(port, "ECDHE-ECDSA-AES128-SHA") == "refused");
    CHECK(tls12_suite(port, "ECDHE-ECDSA-AES256-SHA384") == "refused");

    auto rsa = make_rsa_certificate(f.dir.path(), "rsa");
    REQUIRE(f.tls->reload({{{"localhost"}, rsa.cert_path, rsa.key_path}}, {}).ok());
    // Static-RSA key exchange (no forward secrecy), with CBC or even with GCM.
    CHECK(tls12_suite(port, "AES128-SHA") == "refused");
    CHECK(tls12_suite(port, "AES128-GCM-SHA256") == "refused");
    CHECK(tls12_suite(port, "ECDHE-RSA-AES128-SHA") == "refused");
    CHECK(tls12_suite(port, "ECDHE-RSA-AES128-GCM-SHA256") == "ECDHE-RSA-AES128-GCM-SHA256");
    // A client offering weak suites first still gets a strong one.
    CHECK(tls12_suite(port, "AES128-SHA:ECDHE-RSA-AES256-GCM-SHA384") ==
          "ECDHE-RSA-AES256-GCM-SHA384");
    // TLS 1.3 is untouched.
    auto c = f.connect();
    REQUIRE(c.ok());
    CHECK((*c)->protocol_version() == "TLSv1.3");
}

TEST_CASE("TLS 1.3 and TLS 1.2 handshakes, ALPN http/1.1 and keep-alive") {
    Fixture f;
    for (int version : {TLS1_3_VERSION, TLS1_2_VERSION}) {
        TlsClientOptions o;
        o.min_version = version;
        o.max_version = version;
        auto c = f.connect(o);
        REQUIRE(c.ok());
        CHECK((*c)->protocol_version() == (version == TLS1_3_VERSION ? "TLSv1.3" : "TLSv1.2"));
        CHECK((*c)->alpn() == "http/1.1");
        CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");
        CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");  // Same connection.
    }
    TlsClientOptions old;
    old.max_version = TLS1_1_VERSION;
    CHECK_FALSE(f.connect(old).ok());
}

TEST_CASE("SNI selects the certificate chain and unknown names get the default") {
    Fixture f;
    auto pick = [&](const std::string& name) {
        TlsClientOptions o;
        o.server_name = name;
        auto c = f.connect(o);
        REQUIRE(c.ok());
        return (*c)->peer_common_name();
    };
    CHECK(pick("localhost") == "localhost");
    CHECK(pick("other.test") == "other.test");
    CHECK(pick("OTHER.test") == "other.test");
    CHECK(pick("a.wild.test") == "other.test");
    CHECK(pick("a.b.wild.test") == "localhost");
    CHECK(pick("unknown.example") == "localhost");
    CHECK(pick("") == "localhost");
}

TEST_CASE(
    "session ticket keys rotate: an older key's ticket resumes and is replaced, an expired key's "
    "does not resume, and tickets survive a certificate reload") {
    using std::chrono::seconds;
    for (int version : {TLS1_3_VERSION, TLS1_2_VERSION}) {
        CAPTURE(version);
        auto clock = std::make_shared<std::atomic<int64_t>>(0);  // Seconds.
        SessionTicketOptions tickets;
        tickets.rotation = seconds(3600);
        tickets.lifetime = seconds(7200);
        tickets.clock = [clock] {
            return std::chrono::steady_clock::time_point(seconds(clock->load()));
        };
        Fixture f({}, {"127.0.0.0/8"}, 1, tickets);
        TlsClientOptions o;
        o.min_version = version;
        o.max_version = version;
        // Connects offering `session` (null: none); the session it ends with, and whether it
        // resumed. The clients stay open: freeing one marks its sessions not resumable.
        std::vector<std::unique_ptr<TlsClient>> clients;
        auto handshake = [&](SSL_SESSION* session) {
            o.resume = session;
            auto c = f.connect(o);
            REQUIRE(c.ok());
            get_body(**c);
            clients.push_back(std::move(c).value());
            return std::pair{clients.back()->take_session(), clients.back()->session_reused()};
        };
        // Sessions with tickets of the first key. A TLS 1.3 client offers a ticket once, so
        // each step offers one not offered before.
        auto [first, first_reused] = handshake(nullptr);
        auto [second, second_reused] = handshake(nullptr);
        auto [third, third_reused] = handshake(nullptr);
        CHECK_FALSE(first_reused);
        REQUIRE(first != nullptr);
        REQUIRE(second != nullptr);
        REQUIRE(third != nullptr);

        clock->store(3599);  // The first key still makes tickets.
        auto [after_first, resumed] = handshake(first);
        CHECK(resumed);
        CHECK(f.tls->session_tickets().keys_made() == 1);

        // A second key makes tickets; the first still opens its own, and the client gets a
        // ticket of the second key in place of it.
        clock->store(3601);
        auto [renewed, resumed_old] = handshake(second);
        CHECK(resumed_old);
        CHECK(f.tls->session_tickets().keys_made() == 2);
        REQUIRE(renewed != nullptr);
        auto [later, later_reused] = handshake(nullptr);
        REQUIRE(later != nullptr);

        // A new certificate: the tickets handed out under the old one still resume.
        testing::TempDir fresh;
        auto next = testing::make_certificate(fresh.path(), "n", {"localhost"});
        std::filesystem::copy_file(next.cert_path, f.a.cert_path,
                                   std::filesystem::copy_options::overwrite_existing);
        std::filesystem::copy_file(next.key_path, f.a.key_path,
                                   std::filesystem::copy_options::overwrite_existing);
        REQUIRE(f.tls->reload().ok());
        auto [after_reload, resumed_after_reload] = handshake(renewed);
        CHECK(resumed_after_reload);

        // The first key made its last ticket before 3600, and each lives 7200 s: at 10800 it is
        // erased, and its tickets make full handshakes. The second key's still resume.
        clock->store(10800);
        auto [full, resumed_expired] = handshake(third);
        CHECK_FALSE(resumed_expired);
        auto [from_second_key, resumed_second] = handshake(later);
        CHECK(resumed_second);
        CHECK(f.tls->session_tickets().keys_held() == 2);  // The second key and a third.
        for (SSL_SESSION* s : {first, second, third, after_first, renewed, later, after_reload,
                               full, from_second_key}) {
            SSL_SESSION_free(s);
        }
    }
}

TEST_CASE(
    "sessions resume over TLS 1.3 and TLS 1.2, only under a name their certificate serves (RFC "
    "6066 3)") {
    Fixture f;
    for (int version : {TLS1_3_VERSION, TLS1_2_VERSION}) {
        CAPTURE(version);
        // A session begun under `from`, offered under `to`: whether it resumed, and the
        // certificate the second connection is authenticated by.
        auto offer = [&](const std::string& from, const std::string& to) {
            TlsClientOptions o;
            o.min_version = version;
            o.max_version = version;
            o.server_name = from;
            auto first = f.connect(o);
            REQUIRE(first.ok());
            get_body(**first);
            SSL_SESSION* session = (*first)->take_session();
            REQUIRE(session != nullptr);
            o.resume = session;
            o.server_name = to;
            auto second = f.connect(o);
            REQUIRE(second.ok());
            get_body(**second);
            auto result = std::pair{(*second)->session_reused(), (*second)->peer_common_name()};
            SSL_SESSION_free(session);
            return result;
        };
        // Another certificate's name: a full handshake with that certificate.
        CHECK(offer("localhost", "other.test") == std::pair{false, std::string("other.test")});
        CHECK(offer("other.test", "localhost") == std::pair{false, std::string("localhost")});
        CHECK(offer("localhost", "unknown.example").second == "localhost");
        // The same certificate's names resume.
        CHECK(offer("localhost", "localhost") == std::pair{true, std::string("localhost")});
        CHECK(offer("other.test", "a.wild.test") == std::pair{true, std::string("other.test")});
    }
}

TEST_CASE(
    "a server that requires client certificates resumes no session: every handshake checks the "
    "client certificate against the CA file as it is now") {
    testing::TempDir dir;
    testing::TestCa old_ca = testing::make_ca(dir.path(), "old-ca", "old CA");
    testing::TestCa new_ca = testing::make_ca(dir.path(), "new-ca", "new CA");
    auto site = testing::make_signed_certificate(new_ca, dir.path(), "site", {"site"});
    auto client = testing::make_signed_certificate(old_ca, dir.path(), "client", {"client"});
    // The peer listener's CA file mid rotation ("New CA", step 1): both CAs.
    const auto write_ca = [&](const std::vector<std::string>& cas) {
        std::string bundle;
        for (const std::string& ca : cas) {
            bundle += testing::read_file(ca);
        }
        return dir.write("ca.crt", bundle);
    };
    const std::string ca_path = write_ca({old_ca.cert_path, new_ca.cert_path});
    auto store = TlsContextStore::create({{{}, site.cert_path, site.key_path}}, {ca_path});
    REQUIRE(store.ok());
    boost::asio::io_context io;
    EchoHandler handler;
    CountingObserver observer;
    HttpServerConfig config;
    config.address = "127.0.0.1";
    config.port = 0;
    auto created = HttpServer::create(io, config, **store, handler, &observer);
    REQUIRE(created.ok());
    std::unique_ptr<HttpServer> server = std::move(created).value();
    server->start();
    std::thread thread([&] {
        auto guard = boost::asio::make_work_guard(io);
        io.run();
    });
    for (int version : {TLS1_3_VERSION, TLS1_2_VERSION}) {
        CAPTURE(version);
        TlsClientOptions o;
        o.min_version = version;
        o.max_version = version;
        o.client_cert_path = client.cert_path;
        o.client_key_path = client.key_path;
        write_ca({old_ca.cert_path, new_ca.cert_path});
        REQUIRE((*store)->reload().ok());
        // Two sessions: a TLS 1.3 client offers a ticket once. The clients stay open: freeing
        // one marks its session not resumable.
        auto first = TlsClient::connect(server->port(), o);
        REQUIRE(first.ok());
        get_body(**first);
        SSL_SESSION* session = (*first)->take_session();
        REQUIRE(session != nullptr);
        auto second = TlsClient::connect(server->port(), o);
        REQUIRE(second.ok());
        get_body(**second);
        SSL_SESSION* later_session = (*second)->take_session();
        REQUIRE(later_session != nullptr);
        // Offered while the CA is still trusted: a full handshake all the same.
        o.resume = session;
        auto again = TlsClient::connect(server->port(), o);
        REQUIRE(again.ok());
        get_body(**again);
        CHECK_FALSE((*again)->session_reused());
        // The old CA removed ("New CA", step 3): its certificate no longer gets in, session or
        // not (the handshake fails at once, or the server's alert ends the connection at the
        // first read under TLS 1.3).
        write_ca({new_ca.cert_path});
        REQUIRE((*store)->reload().ok());
        o.resume = later_session;
        auto after = TlsClient::connect(server->port(), o);
        if (after.ok()) {
            CHECK_FALSE((*after)->session_reused());
            REQUIRE((*after)->send(testing::http_request("GET", "/x")).ok());
            CHECK_FALSE((*after)->read_response().ok());
        }
        SSL_SESSION_free(session);
        SSL_SESSION_free(later_session);
    }
    server->stop(std::chrono::milliseconds(0));
    io.stop();
    thread.join();
}

TEST_CASE("session ticket options must be positive durations") {
    SessionTicketOptions zero;
    zero.rotation = std::chrono::seconds(0);
    CHECK_FALSE(SessionTicketKeys::create(zero).ok());
    SessionTicketOptions negative;
    negative.lifetime = std::chrono::seconds(-1);
    CHECK_FALSE(SessionTicketKeys::create(negative).ok());
}

TEST_CASE(
    "reload: open connections keep working and new handshakes get the new certificate while a "
    "broken key keeps the old one") {
    Fixture f;
    auto open = f.connect();
    REQUIRE(open.ok());
    CHECK((*open)->peer_common_name() == "localhost");
    testing::TempDir fresh;
    auto next = testing::make_certificate(fresh.path(), "n", {"reloaded.test", "localhost"});
    std::filesystem::copy_file(next.cert_path, f.a.cert_path,
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(next.key_path, f.a.key_path,
                               std::filesystem::copy_options::overwrite_existing);
    REQUIRE(f.tls->reload().ok());
    auto after = f.connect();
    REQUIRE(after.ok());
    CHECK((*after)->peer_common_name() == "reloaded.test");
    CHECK(get_body(**open) == "remote=127.0.0.1 sni=localhost body=0");

    f.dir.write("a.key", "-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n");
    Status broken = f.tls->reload();
    CHECK_FALSE(broken.ok());
    CHECK(broken.message().find("a.key") != std::string::npos);
    auto still = f.connect();
    REQUIRE(still.ok());
    CHECK((*still)->peer_common_name() == "reloaded.test");
    CHECK(get_body(**open) == "remote=127.0.0.1 sni=localhost body=0");
}

TEST_CASE("PROXY v1 and v2 from a trusted balancer set the client address") {
    Fixture f;
    TlsClientOptions v1;
    v1.before_handshake = "PROXY TCP4 203.0.113.7 127.0.0.1 40000 443\r\n";
    auto c1 = f.connect(v1);
    REQUIRE(c1.ok());
    CHECK(get_body(**c1) == "remote=203.0.113.7 sni=localhost body=0");

    TlsClientOptions v2;
    v2.before_handshake = std::string("\r\n\r\n\0\r\nQUIT\n", 12) + "\x21\x11" +
                          std::string("\0\x0c", 2) +
                          std::string("\xc6\x33\x64\x09\x7f\x00\x00\x01\x9c\x40\x01\xbb", 12);
    auto c2 = f.connect(v2);
    REQUIRE(c2.ok());
    CHECK(get_body(**c2) == "remote=198.51.100.9 sni=localhost body=0");

    TlsClientOptions bad;
    bad.before_handshake = "PROXY TCP4 nonsense\r\n";
    CHECK_FALSE(f.connect(bad).ok());
}

TEST_CASE("PROXY headers from untrusted peers are refused") {
    Fixture f(HttpLimits{}, {"10.0.0.0/8"});
    TlsClientOptions v1;
    v1.before_handshake = "PROXY TCP4 203.0.113.7 127.0.0.1 40000 443\r\n";
    CHECK_FALSE(f.connect(v1).ok());
    auto plain = f.connect();
    REQUIRE(plain.ok());
    CHECK(get_body(**plain) == "remote=127.0.0.1 sni=localhost body=0");
}

TEST_CASE("bad input: malformed request line, oversized header and body, stalled client") {
    HttpLimits limits;
    limits.header_timeout = std::chrono::milliseconds(200);
    limits.body_timeout = std::chrono::milliseconds(200);
    limits.max_header_bytes = 2048;
    limits.max_body_bytes = 1024;
    Fixture f(limits);
    {
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send("GARBAGE\r\n\r\n").ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 400);
        CHECK(r->headers["connection"] == "close");
        CHECK((*c)->wait_closed());
        CHECK((*c)->got_close_notify());  // A clean TLS close, not a cut connection.
    }
    {
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send(testing::http_request("GET", "/x", "",
                                                 "X-Big: " + std::string(4000, 'a') + "\r\n"))
                    .ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 431);
    }
    // A request line within the limit that arrives in two pieces, then fields past the limit:
    // 431 (the fields), not 414 (Beast parses such a line only once the whole header is in).
    {
        auto c = f.connect();
        REQUIRE(c.ok());
        const std::string line = "GET /" + std::string(1500, 'p') + " HTTP/1.1\r\n";
        REQUIRE((*c)->send(line.substr(0, 1000)).ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        REQUIRE((*c)->send(line.substr(1000) + "Host: x\r\nX-Big: " + std::string(1000, 'b') +
                           "\r\n\r\n")
                    .ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 431);
    }
    // Many fields, each small, over the limit together with the request line: 431; just within
    // it, served.
    for (const bool over : {true, false}) {
        auto c = f.connect();
        REQUIRE(c.ok());
        const std::string line = "GET /x HTTP/1.1\r\nHost: x\r\n";
        std::string fields;
        while (line.size() + fields.size() + 2 + 10 <= (over ? 2060u : 2048u)) {
            fields += "X-F: 1234\r\n";
        }
        REQUIRE((*c)->send(line + fields + "\r\n").ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == (over ? 431 : 200));
    }
    // A request line longer than the limit, an unknown method, a version other than 1.0 and 1.1,
    // an HTTP/1.1 request without one Host.
    for (const auto& [request, status] : std::vector<std::pair<std::string, int>>{
             {"GET /" + std::string(3000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n", 414},
             {"BREW /x HTTP/1.1\r\nHost: x\r\n\r\n", 501},
             {"GET /x HTTP/2.0\r\nHost: x\r\n\r\n", 505},
             {"GET /x HTTP/1.2\r\nHost: x\r\n\r\n", 505},
             {"GET /x HTTP/1.1\nHost: x\n\n", 400},  // Bare LF: malformed, not HTTP/2.
             {"GET /x HTTP/1.1\r\n\r\n", 400},
             {"GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400}}) {
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send(request).ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == status);
        CHECK(r->headers["connection"] == "close");
    }
    {
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n").ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 413);
    }
    {
        auto c = f.connect();
        REQUIRE(c.ok());
        CHECK(get_body(**c, "/x") == "remote=127.0.0.1 sni=localhost body=0");
        REQUIRE((*c)->send("GET /x HTTP/1.1\r\nHost: loc").ok());  // ...and stalls.
        auto started = std::chrono::steady_clock::now();
        // 408 and a clean close (nginx's client_header_timeout, RFC 9110 section 15.5.9).
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 408);
        CHECK(r->headers["connection"] == "close");
        CHECK(r->body.find("header_timeout") != std::string::npos);
        CHECK((*c)->wait_closed());
        CHECK((*c)->got_close_notify());
        CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(4));
    }
    {
        // Half of a body, then nothing: 408 at the body timeout.
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" +
                           std::string(50, 'b'))
                    .ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 408);
        CHECK(r->body.find("body_timeout") != std::string::npos);
        CHECK((*c)->wait_closed());
        CHECK((*c)->got_close_notify());
    }
    {
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send(testing::http_request("POST", "/x", std::string(1000, 'b'))).ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->body == "remote=127.0.0.1 sni=localhost body=1000");
    }
}

TEST_CASE("TLS garbage and a stalled handshake are closed while others are still served") {
    HttpLimits limits;
    limits.handshake_timeout = std::chrono::milliseconds(200);
    Fixture f(limits);
    auto fd = testing::tcp_connect(f.server->port());
    REQUIRE(fd.ok());
    std::string garbage = "this is not TLS at all\r\n\r\n" + std::string(300, '\x17');
    CHECK(::send(*fd, garbage.data(), garbage.size(), MSG_NOSIGNAL) > 0);
    char buf[512];
    ssize_t n;
    while ((n = ::recv(*fd, buf, sizeof(buf), 0)) > 0) {
    }
    CHECK(n <= 0);
    ::close(*fd);

    auto stalled = testing::tcp_connect(f.server->port());
    REQUIRE(stalled.ok());
    CHECK(::recv(*stalled, buf, sizeof(buf), 0) <= 0);  // Closed by the handshake timeout.
    ::close(*stalled);

    auto c = f.connect();
    REQUIRE(c.ok());
    CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");
}

TEST_CASE("connections beyond max_connections are closed at once") {
    HttpLimits limits;
    limits.max_connections = 2;
    Fixture f(limits);
    auto c1 = f.connect();
    auto c2 = f.connect();
    REQUIRE(c1.ok());
    REQUIRE(c2.ok());
    CHECK_FALSE(f.connect().ok());
    c1->reset();
    for (int i = 0; i < 200 && f.server->open_connections() > 1; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // Waits on a socket close.
    }
    CHECK(f.connect().ok());
}

TEST_CASE("drain: the request in flight completes with Connection: close, new connections are "
          "refused") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    auto idle = f.connect();
    REQUIRE(idle.ok());
    CHECK(get_body(**idle) == "remote=127.0.0.1 sni=localhost body=0");
    auto silent = f.connect();  // Connected, never sends a request.
    REQUIRE(silent.ok());
    REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
    auto channel = f.handler.wait_held();
    REQUIRE(channel != nullptr);
    auto stopper = std::async(std::launch::async, [&] {
        f.server->stop(std::chrono::seconds(10));
        f.stopped = true;
    });
    CHECK((*idle)->wait_closed());  // Idle keep-alive connections go at once.
    // One that has not sent its first request gets two seconds' grace (see the next test), then
    // goes too: it does not hold the drain to header_timeout.
    const auto silent_from = std::chrono::steady_clock::now();
    CHECK((*silent)->wait_closed());
    CHECK(std::chrono::steady_clock::now() - silent_from < std::chrono::seconds(4));
    for (int i = 0; i < 200 && testing::accepts_connections(f.server->port()); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK_FALSE(testing::accepts_connections(f.server->port()));
    channel->respond(HttpResponse{200, "text/plain", {}, "finished"});
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(r->body == "finished");
    CHECK(r->headers["connection"] == "close");
    CHECK(stopper.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
}

TEST_CASE("drain: a connection accepted before the listener closed is served its first request") {
    // A socket-activated restart: the old process drains while its successor accepts from the
    // same socket. A client whose connection the old process accepted just before closing its
    // listener sends its request there; closing that connection would lose the request.
    Fixture f;
    auto fresh = f.connect();
    REQUIRE(fresh.ok());
    auto stopper = std::async(std::launch::async, [&] {
        f.server->stop(std::chrono::seconds(10));
        f.stopped = true;
    });
    for (int i = 0; i < 200 && testing::accepts_connections(f.server->port()); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE_FALSE(testing::accepts_connections(f.server->port()));  // Draining now.
    REQUIRE((*fresh)->send(testing::http_request("GET", "/late")).ok());
    auto r = (*fresh)->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    CHECK(r->headers["connection"] == "close");
    CHECK(stopper.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
}

TEST_CASE("drain deadline closes requests that do not finish") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
    REQUIRE(f.handler.wait_held() != nullptr);
    auto started = std::chrono::steady_clock::now();
    f.server->stop(std::chrono::milliseconds(200));
    f.stopped = true;
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
    CHECK((*c)->wait_closed());
    CHECK(f.server->open_connections() == 0);
}

TEST_CASE("several I/O threads serve concurrent clients (connections on strands)") {
    Fixture f(HttpLimits{}, {"127.0.0.0/8"}, 3);
    std::vector<std::future<int>> clients;
    for (int i = 0; i < 8; ++i) {
        clients.push_back(std::async(std::launch::async, [&] {
            auto c = f.connect();
            if (!c.ok()) {
                return 0;
            }
            int ok = 0;
            for (int j = 0; j < 20; ++j) {
                if (!(*c)->send(testing::http_request("POST", "/x", "abc")).ok()) {
                    break;
                }
                auto r = (*c)->read_response();
                ok += r.ok() && r->body == "remote=127.0.0.1 sni=localhost body=3";
            }
            return ok;
        }));
    }
    for (auto& c : clients) {
        CHECK(c.get() == 20);
    }
}

TEST_CASE("start and stop with four I/O threads while clients keep connecting") {
    // stop() closed the acceptor on the bare io_context while an accept's completion could run
    // on another I/O thread (and start the next accept on the same acceptor), and returned
    // while that completion could still run on a destroyed server.
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "a", {"localhost"});
    auto store = TlsContextStore::create({{{"localhost"}, cert.cert_path, cert.key_path}});
    REQUIRE(store.ok());
    boost::asio::io_context io;
    auto guard = boost::asio::make_work_guard(io);
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
        threads.emplace_back([&io] { io.run(); });
    }
    EchoHandler handler;
    std::atomic<uint16_t> port{0};
    std::atomic<bool> done{false};
    std::atomic<int> answered{0};
    auto hammer = [&](bool tls) {
        while (!done) {
            const uint16_t p = port.load();
            if (p == 0) {
                std::this_thread::yield();
                continue;
            }
            if (!tls) {
                if (auto fd = testing::tcp_connect(p, 1000); fd.ok()) {
                    ::close(*fd);
                }
                continue;
            }
            TlsClientOptions o;
            o.timeout_ms = 1000;
            auto c = TlsClient::connect(p, o);
            if (c.ok() && (*c)->send(testing::http_request("GET", "/x")).ok() &&
                (*c)->read_response().ok()) {
                ++answered;
            }
        }
    };
    std::thread plain(hammer, false);
    std::thread secure(hammer, true);
    for (int round = 0; round < 50; ++round) {
        HttpServerConfig config;
        config.address = "127.0.0.1";
        config.port = 0;
        config.io_threads = 4;
        // No observer: the server's own null observer is used by its sessions up to the end.
        auto created = HttpServer::create(io, config, **store, handler, nullptr);
        REQUIRE(created.ok());
        std::unique_ptr<HttpServer> server = std::move(created).value();
        server->start();
        port = server->port();
        std::this_thread::sleep_for(std::chrono::milliseconds(round % 5 == 0 ? 30 : 3));
        const auto started = std::chrono::steady_clock::now();
        server->stop(std::chrono::milliseconds(round % 2 == 0 ? 0 : 20));
        CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
        CHECK(server->open_connections() == 0);
        port = 0;
        server.reset();
    }
    done = true;
    plain.join();
    secure.join();
    guard.reset();
    for (auto& t : threads) {
        t.join();
    }
    CHECK(answered.load() > 0);  // The servers did serve between their starts and stops.
}

TEST_CASE("idle keep-alive connections close after the idle timeout") {
    HttpLimits limits;
    limits.idle_timeout = std::chrono::milliseconds(200);
    Fixture f(limits);
    auto c = f.connect();
    REQUIRE(c.ok());
    CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");
    auto started = std::chrono::steady_clock::now();
    CHECK((*c)->wait_closed());
    CHECK((*c)->got_close_notify());
    CHECK_FALSE((*c)->read_response().ok());  // No 408 between requests: a clean close only.
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(4));
}

TEST_CASE("a connection that handshakes and sends nothing closes at the header timeout") {
    HttpLimits limits;
    limits.header_timeout = std::chrono::milliseconds(200);  // The idle timeout stays 60 s.
    Fixture f(limits);
    auto c = f.connect();
    REQUIRE(c.ok());
    auto started = std::chrono::steady_clock::now();
    CHECK((*c)->wait_closed());
    CHECK((*c)->got_close_notify());
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(10));
}

TEST_CASE("empty lines trickled a byte at a time do not restart the first request's timeout") {
    HttpLimits limits;
    limits.header_timeout = std::chrono::milliseconds(200);
    Fixture f(limits);
    auto c = f.connect();
    REQUIRE(c.ok());
    const auto started = std::chrono::steady_clock::now();
    // A CR or LF every 180 ms: ten empty lines (the most allowed) take 3.6 s, and each read
    // used to restart the 200 ms. The sends stop once the server has closed.
    for (int i = 0; i < 20 && (*c)->send(i % 2 == 0 ? "\r" : "\n").ok(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(180));
    }
    CHECK((*c)->wait_closed());
    // Closed near 200 ms, plus at most the last second it gets to close cleanly; not at 3.6 s.
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::milliseconds(2500));
}

TEST_CASE("a body trickled a byte at a time is cut at request_read_timeout with a 408") {
    HttpLimits limits;
    limits.body_timeout = std::chrono::milliseconds(400);  // Never silent this long below.
    limits.request_read_timeout = std::chrono::milliseconds(1000);
    Fixture f(limits);
    auto c = f.connect();
    REQUIRE(c.ok());
    const auto started = std::chrono::steady_clock::now();
    REQUIRE((*c)->send("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n").ok());
    // A byte every 150 ms would take 15 s; the sends stop once the server has answered.
    for (int i = 0; i < 100 && (*c)->send("a").ok(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        if (std::chrono::steady_clock::now() - started > std::chrono::seconds(3)) {
            break;
        }
    }
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 408);
    CHECK(r->body.find("request_read_timeout") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
}

TEST_CASE("a handler that throws: the client gets a 500 and the connection serves on") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send(testing::http_request("GET", "/throw")).ok());
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 500);
    CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");
}

TEST_CASE("a handler that drops its channel unanswered: a 500, or a stream begun is cut") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send(testing::http_request("GET", "/drop")).ok());
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 500);
    CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");
    REQUIRE((*c)->send(testing::http_request("GET", "/drop-stream")).ok());
    // The head and the first chunk, then the connection closes (no last chunk: it would have
    // kept the connection open, and wait_closed times out).
    Result<std::string> head = (*c)->read_until("data: 1\n\n");
    REQUIRE(head.ok());
    CHECK(head->find("data: 1\n\n") != std::string::npos);
    CHECK((*c)->wait_closed());
    std::vector<Answered> answered = f.observer.answered(3);
    REQUIRE(answered.size() == 3);
    CHECK(answered[0].status == 500);
    CHECK(answered[0].complete);
    CHECK(answered[2].path == "/drop-stream");
    CHECK_FALSE(answered[2].complete);
    // HTTP/1.0: the body ends at the close, so a cut one ends without close_notify (which would
    // tell the client the body it has is whole).
    auto old = f.connect();
    REQUIRE(old.ok());
    REQUIRE((*old)->send("GET /drop-stream HTTP/1.0\r\n\r\n").ok());
    REQUIRE((*old)->read_until("data: 1\n\n").ok());
    CHECK((*old)->wait_closed());
    CHECK_FALSE((*old)->got_close_notify());
    auto whole = f.connect();  // A whole HTTP/1.0 answer still ends with it.
    REQUIRE(whole.ok());
    REQUIRE((*whole)->send("GET /x HTTP/1.0\r\n\r\n").ok());
    REQUIRE((*whole)->read_until("body=0").ok());
    CHECK((*whole)->wait_closed());
    CHECK((*whole)->got_close_notify());
}

TEST_CASE("Expect: 100-continue gets an interim response before the body is sent") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
                       "Expect: 100-continue\r\n\r\n")
                .ok());
    auto interim = (*c)->read_until("\r\n\r\n");
    REQUIRE(interim.ok());
    CHECK(interim->find("100 Continue") != std::string::npos);
    REQUIRE((*c)->send("abcd").ok());
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(r->body == "remote=127.0.0.1 sni=localhost body=4");
}

TEST_CASE("a stream whose client stops reading is cancelled at max_stream_buffer_bytes") {
    HttpLimits limits;
    limits.max_stream_buffer_bytes = 256 * 1024;
    Fixture f(limits);
    auto c = f.connect();
    REQUIRE(c.ok());
    int small = 4096;  // Little kernel buffering on the client's side: the server queue fills.
    setsockopt((*c)->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
    auto channel = f.handler.wait_held();
    REQUIRE(channel != nullptr);
    std::atomic<bool> gone{false};
    channel->on_client_gone([&gone] { gone = true; });
    channel->begin_stream(HttpResponse{200, "text/event-stream", {}, ""});
    // A generator far faster than its reader, which reads nothing at all.
    const std::string chunk = "data: " + std::string(16 * 1024, 'x') + "\n\n";
    const size_t written = write_until_cut(*channel, chunk, gone);
    CHECK(gone.load());  // The engine side hears of it as a disconnect (it cancels generation).
    CHECK(written < (size_t{1} << 30));
    CHECK(f.observer.cancelled() == std::vector<std::string>{"slow_reader"});
    for (int i = 0; i < 400 && f.server->open_connections() > 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // Waits on a socket close.
    }
    CHECK(f.server->open_connections() == 0);
    channel->write(chunk);  // Later calls are ignored.
    channel->end_stream();

    // A reader that keeps up is never cut, with the same limit.
    auto reader = f.connect();
    REQUIRE(reader.ok());
    f.handler.reset_held();
    REQUIRE((*reader)->send(testing::http_request("GET", "/hold")).ok());
    auto second = f.handler.wait_held();
    REQUIRE(second != nullptr);
    second->begin_stream(HttpResponse{200, "text/event-stream", {}, ""});
    REQUIRE((*reader)->read_until("\r\n\r\n").ok());
    for (int i = 0; i < 64; ++i) {
        const std::string marker = "<" + std::to_string(i) + ">";
        second->write("data: " + std::string(64 * 1024, 'y') + marker + "\n\n");
        auto got = (*reader)->read_until(marker);
        REQUIRE(got.ok());
        REQUIRE(got->find(marker) != std::string::npos);
    }
    // An event larger than the whole limit passes, and so do the small ones written right
    // behind it (the final chunk, [DONE]) while it is still being written.
    const std::string big = "data: " + std::string(300 * 1024, 'z') + "<big>\n\n";
    second->write(big);
    second->write("data: {\"finish_reason\":\"stop\"}\n\n");
    second->write("data: [DONE]\n\n");
    auto got = (*reader)->read_until("[DONE]");
    REQUIRE(got.ok());
    CHECK(got->find("<big>") != std::string::npos);
    second->end_stream();
    CHECK(f.observer.cancelled().size() == 1);
}

TEST_CASE("two stream chunks larger than max_stream_buffer_bytes in a row reach a reader") {
    // The second one, written before the first reached the socket, was counted alone against
    // the limit and cancelled a reader that kept up as a slow one.
    HttpLimits limits;
    limits.max_stream_buffer_bytes = 256 * 1024;
    Fixture f(limits);
    auto reader = f.connect();
    REQUIRE(reader.ok());
    {
        REQUIRE((*reader)->send(testing::http_request("GET", "/two-large")).ok());
        auto r = (*reader)->read_response();
        REQUIRE(r.ok());
        CHECK(r->body.find("<first>") != std::string::npos);
        CHECK(r->body.find("<second>") != std::string::npos);
        CHECK(r->body.ends_with("data: [DONE]\n\n"));
    }
    // And from another thread, while the reader reads: one burst on a fresh stream. (Bursts
    // one after another on the same stream may find the places of the last burst's chunks not
    // yet given back, as the reader can read a chunk before the write's completion runs: a
    // third oversized chunk waiting is counted by design.)
    REQUIRE((*reader)->send(testing::http_request("GET", "/hold")).ok());
    auto channel = f.handler.wait_held();
    REQUIRE(channel != nullptr);
    std::atomic<bool> gone{false};
    channel->on_client_gone([&gone] { gone = true; });
    channel->begin_stream(HttpResponse{200, "text/event-stream", {}, ""});
    REQUIRE((*reader)->read_until("\r\n\r\n").ok());
    {
        const std::string tag = "0";
        // Made first, so that the writes follow each other at once.
        std::string first = "data: " + std::string(300 * 1024, 'a') + "<first" + tag + ">\n\n";
        std::string second = "data: " + std::string(300 * 1024, 'b') + "<second" + tag + ">\n\n";
        std::string done = "data: [DONE" + tag + "]\n\n";
        channel->write(std::move(first));
        channel->write(std::move(second));
        channel->write(std::move(done));
        auto got = (*reader)->read_until("[DONE" + tag + "]");
        REQUIRE(got.ok());
        CHECK(got->find("<first" + tag + ">") != std::string::npos);
        CHECK(got->find("<second" + tag + ">") != std::string::npos);
    }
    channel->end_stream();
    CHECK((*reader)->read_until("0\r\n\r\n").ok());
    CHECK_FALSE(gone.load());
    CHECK(f.observer.cancelled().empty());

    // A client that reads nothing is still cut when the generator writes only oversized chunks:
    // they are let through uncounted only while few enough wait.
    auto stalled = f.connect();
    REQUIRE(stalled.ok());
    int small = 4096;
    setsockopt((*stalled)->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    f.handler.reset_held();
    REQUIRE((*stalled)->send(testing::http_request("GET", "/hold")).ok());
    auto second = f.handler.wait_held();
    REQUIRE(second != nullptr);
    std::atomic<bool> second_gone{false};
    second->on_client_gone([&second_gone] { second_gone = true; });
    second->begin_stream(HttpResponse{200, "text/event-stream", {}, ""});
    const size_t written =
        write_until_cut(*second, "data: " + std::string(300 * 1024, 'z') + "\n\n", second_gone);
    CHECK(second_gone.load());
    CHECK(written < (size_t{1} << 30));
    CHECK(f.observer.cancelled() == std::vector<std::string>{"slow_reader"});
    second->end_stream();
}

// The handler's channel of a /hold request sent on `client`, its stream of `type` begun and the
// head read by the client.
std::shared_ptr<ResponseChannel> begin_held_stream(Fixture& f, testing::TlsClient& client,
                                                   const std::string& type) {
    REQUIRE(client.send(testing::http_request("GET", "/hold")).ok());
    auto channel = f.handler.wait_held();
    REQUIRE(channel != nullptr);
    channel->begin_stream(HttpResponse{200, type, {}, ""});
    REQUIRE(client.read_until("\r\n\r\n").ok());
    return channel;
}

TEST_CASE("a silent event stream gets keepalive comments, other streams do not") {
    HttpLimits limits;
    limits.stream_keepalive = std::chrono::milliseconds(100);
    Fixture f(limits);
    auto reader = f.connect();
    REQUIRE(reader.ok());
    auto channel = begin_held_stream(f, **reader, "text/event-stream");
    // Nothing from the handler: comments come on their own, as whole events.
    auto first = (*reader)->read_until(": keepalive\n\n");
    REQUIRE(first.ok());
    auto second = (*reader)->read_until(": keepalive\n\n");
    REQUIRE(second.ok());
    channel->write("data: hello\n\n");
    channel->write("data: [DONE]\n\n");
    channel->end_stream();
    auto rest = (*reader)->read_until("0\r\n\r\n");
    REQUIRE(rest.ok());
    CHECK(rest->find("data: hello\n\n") != std::string::npos);

    // A stream of another type is left as it is.
    f.handler.reset_held();
    auto plain = f.connect();
    REQUIRE(plain.ok());
    auto other = begin_held_stream(f, **plain, "text/plain");
    std::this_thread::sleep_for(std::chrono::milliseconds(350));
    other->write("end");
    other->end_stream();
    auto body = (*plain)->read_until("0\r\n\r\n");
    REQUIRE(body.ok());
    CHECK(body->find("keepalive") == std::string::npos);
}

TEST_CASE("a keepalive comment never lands inside an event that a stream sends in pieces") {
    HttpLimits limits;
    limits.stream_keepalive = std::chrono::milliseconds(100);
    Fixture f(limits);
    auto reader = f.connect();
    REQUIRE(reader.ok());
    auto channel = begin_held_stream(f, **reader, "text/event-stream");
    // Each piece is followed by silences of several keepalive intervals (a peer stalling
    // mid-event); the blank line that ends an event comes split across pieces, LF and CRLF.
    const auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(350)); };
    for (const char* piece : {"data: one", " two\n", "\n", "data: three\r\n\r", "\n"}) {
        channel->write(piece);
        pause();
    }
    channel->write("data: [DONE]\n\n");
    channel->end_stream();
    auto raw = (*reader)->read_until("0\r\n\r\n");
    REQUIRE(raw.ok());
    // The body without its chunk framing: each chunk was written alone, so its size line and
    // CRLF surround it.
    std::string body;
    for (size_t at = 0; at < raw->size();) {
        const size_t line_end = raw->find("\r\n", at);
        REQUIRE(line_end != std::string::npos);
        const size_t size = std::stoul(raw->substr(at, line_end - at), nullptr, 16);
        if (size == 0) {
            break;
        }
        body += raw->substr(line_end + 2, size);
        at = line_end + 2 + size + 2;
    }
    INFO(body);
    // Whole events, and comments only between them: after each event, in the silence before the
    // next piece.
    CHECK(body.find("data: one two\n\n: keepalive\n\n") != std::string::npos);
    CHECK(body.find("data: three\r\n\r\n: keepalive\n\n") != std::string::npos);
    std::string events = body;
    for (size_t at; (at = events.find(": keepalive\n\n")) != std::string::npos;) {
        events.erase(at, std::string_view(": keepalive\n\n").size());
    }
    CHECK(events == "data: one two\n\ndata: three\r\n\r\ndata: [DONE]\n\n");
}

TEST_CASE("a client that stops reading is cut at the write timeout, and its handler told") {
    HttpLimits limits;
    limits.write_timeout = std::chrono::milliseconds(200);
    limits.max_stream_buffer_bytes = size_t{1} << 30;  // The timeout cuts it, not the buffer.
    Fixture f(limits);
    auto c = f.connect();
    REQUIRE(c.ok());
    int small = 4096;
    setsockopt((*c)->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
    auto channel = f.handler.wait_held();
    REQUIRE(channel != nullptr);
    std::atomic<bool> gone{false};
    channel->on_client_gone([&gone] { gone = true; });
    auto started = std::chrono::steady_clock::now();
    // Far more than the socket buffers take: the write stalls until the watchdog closes it.
    SUBCASE("a whole response") {
        channel->respond(HttpResponse{200, "text/plain", {}, std::string(64 << 20, 'z')});
    }
    SUBCASE("a stream, in one write") {
        channel->begin_stream(HttpResponse{200, "text/event-stream", {}, ""});
        channel->write("data: " + std::string(32 << 20, 'x') + "\n\n");
    }
    for (int i = 0; i < 800 && f.server->open_connections() > 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // Waits on a socket close.
    }
    CHECK(f.server->open_connections() == 0);
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(4));
    // The handler hears of the cut as of a client that left (it stops generating).
    CHECK(gone.load());
    CHECK(f.observer.cancelled().empty());  // Not the slow-reader cut.
    channel->end_stream();                  // The handler's last calls are ignored.
}

TEST_CASE("a slow client that keeps reading a large answer is not cut at the write timeout") {
    HttpLimits limits;
    limits.write_timeout = std::chrono::milliseconds(1500);
    Fixture f(limits);
    TlsClientOptions options;
    options.receive_buffer_bytes = 4096;
    auto c = f.connect(options);
    REQUIRE(c.ok());
    REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
    auto channel = f.handler.wait_held();
    REQUIRE(channel != nullptr);
    // 16 MiB in 64 KiB pieces, each ending in its number: read one piece every 15 ms, so the
    // whole answer takes over twice the write timeout beyond what the kernel's socket buffers
    // hold (~4 MiB: the old whole-answer deadline cut it near piece 160), while every 256 KiB
    // slice takes ~60 ms, a twentieth of it (room for a loaded 2-core machine).
    constexpr int kPieces = 256;
    auto marker = [](int i) { return "#" + std::to_string(1000 + i) + "#"; };
    std::string body;
    for (int i = 0; i < kPieces; ++i) {
        body += std::string(65536 - 6, 'b') + marker(i);
    }
    channel->respond(HttpResponse{200, "text/plain", {}, body});
    auto started = std::chrono::steady_clock::now();
    for (int i = 0; i < kPieces; ++i) {
        auto got = (*c)->read_until(marker(i));
        INFO("piece " << i << ": " << (got.ok() ? std::string("ok") : got.status().to_string()));
        REQUIRE(got.ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(15));
    }
    CHECK(std::chrono::steady_clock::now() - started > limits.write_timeout);
    CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");  // Still kept alive.
}

TEST_CASE("a pause between stream chunks longer than the write timeout does not cut the stream") {
    HttpLimits limits;
    limits.write_timeout = std::chrono::milliseconds(200);
    Fixture f(limits);
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
    auto channel = f.handler.wait_held();
    REQUIRE(channel != nullptr);
    channel->begin_stream(HttpResponse{200, "text/event-stream", {}, ""});
    channel->write("data: first\n\n");
    REQUIRE((*c)->read_until("first").ok());
    // Generation pauses (a preempted request) while the client keeps reading.
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    channel->write("data: second\n\n");
    REQUIRE((*c)->read_until("second").ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    channel->end_stream();
    CHECK((*c)->read_until("0\r\n\r\n").ok());
    CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");  // Still kept alive.
}

TEST_CASE("a request pipelined behind a pending response is answered after it") {
    HttpLimits limits;
    limits.idle_timeout = std::chrono::milliseconds(1500);
    Fixture f(limits);
    for (bool same_write : {true, false}) {
        f.handler.reset_held();
        auto c = f.connect();
        REQUIRE(c.ok());
        if (same_write) {
            REQUIRE((*c)->send(testing::http_request("GET", "/hold") +
                               testing::http_request("POST", "/x", "abc"))
                        .ok());
        } else {
            // The second request arrives while the first is pending (read by the watcher).
            REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
            REQUIRE(f.handler.wait_held() != nullptr);
            REQUIRE((*c)->send(testing::http_request("POST", "/x", "abc")).ok());
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        auto channel = f.handler.wait_held();
        REQUIRE(channel != nullptr);
        channel->respond(HttpResponse{200, "text/plain", {}, "held"});
        auto first = (*c)->read_response();
        REQUIRE(first.ok());
        CHECK(first->body == "held");
        auto started = std::chrono::steady_clock::now();
        auto second = (*c)->read_response();
        REQUIRE(second.ok());
        CHECK(second->body == "remote=127.0.0.1 sni=localhost body=3");
        CHECK(std::chrono::steady_clock::now() - started < std::chrono::milliseconds(1000));
    }
}

TEST_CASE("a client that pipelines a request and leaves is seen while the first is pending") {
    // A pipelined request used to stop the disconnect watcher: the handler of a long answer
    // kept generating for a client that had gone.
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    const std::string next = testing::http_request("POST", "/x", "abc");
    SUBCASE("behind it in the same write") {
        REQUIRE((*c)->send(testing::http_request("GET", "/hold") + next).ok());
    }
    SUBCASE("after it, while it is pending") {
        REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
        REQUIRE(f.handler.wait_held() != nullptr);
        REQUIRE((*c)->send(next).ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    SUBCASE("a part of it only") {
        REQUIRE((*c)->send(testing::http_request("GET", "/hold") + next.substr(0, 10)).ok());
    }
    auto channel = f.handler.wait_held();
    REQUIRE(channel != nullptr);
    std::atomic<bool> gone{false};
    channel->on_client_gone([&gone] { gone = true; });
    CHECK_FALSE(gone.load());
    (*c)->close();
    CHECK(testing::wait_for([&] { return gone.load(); }, std::chrono::seconds(5)));
    CHECK(testing::wait_for([&] { return f.server->open_connections() == 0; },
                            std::chrono::seconds(5)));
    channel->respond(HttpResponse{200, "text/plain", {}, "late"});  // Ignored.
}

TEST_CASE("requests pipelined past max_header_bytes behind a pending one are all answered") {
    // The watcher stops reading at max_header_bytes buffered; the rest is read as the requests
    // are parsed.
    HttpLimits limits;
    limits.max_header_bytes = 1024;
    Fixture f(limits);
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
    auto channel = f.handler.wait_held();
    REQUIRE(channel != nullptr);
    std::string pipelined;
    constexpr int kRequests = 40;  // About 2.4 KiB.
    for (int i = 0; i < kRequests; ++i) {
        pipelined += testing::http_request("POST", "/x", "abc");
    }
    REQUIRE((*c)->send(pipelined).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    channel->respond(HttpResponse{200, "text/plain", {}, "held"});
    auto first = (*c)->read_response();
    REQUIRE(first.ok());
    CHECK(first->body == "held");
    for (int i = 0; i < kRequests; ++i) {
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->body == "remote=127.0.0.1 sni=localhost body=3");
    }
}

TEST_CASE("empty lines before a request line are ignored, a bounded number of them") {
    HttpLimits limits;
    limits.idle_timeout = std::chrono::milliseconds(1500);
    Fixture f(limits);
    const std::string echoed = "remote=127.0.0.1 sni=localhost body=";
    SUBCASE("on a fresh connection") {
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send("\r\n" + testing::http_request("GET", "/x")).ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 200);
        CHECK(r->headers.count("connection") == 0);  // Kept alive.
        CHECK(get_body(**c) == echoed + "0");
    }
    SUBCASE("an empty line split over two writes, a bare LF") {
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send("\r").ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        REQUIRE((*c)->send("\n\n" + testing::http_request("GET", "/x")).ok());
        CHECK(get_body(**c) == echoed + "0");
    }
    SUBCASE("a CRLF after a POST body, then the next request") {
        auto c = f.connect();
        REQUIRE(c.ok());
        // In the same write as the next request (parsed from the buffer) ...
        REQUIRE((*c)->send(testing::http_request("POST", "/x", "abc") + "\r\n" +
                           testing::http_request("GET", "/x"))
                    .ok());
        for (const std::string& body : {echoed + "3", echoed + "0"}) {
            auto r = (*c)->read_response();
            REQUIRE(r.ok());
            CHECK(r->status == 200);
            CHECK(r->body == body);
            CHECK(r->headers.count("connection") == 0);
        }
        // ... and alone, the next request coming later (read in the keep-alive wait).
        REQUIRE((*c)->send(testing::http_request("POST", "/x", "abcd") + "\r\n").ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->body == echoed + "4");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        CHECK(get_body(**c) == echoed + "0");
    }
    SUBCASE("more than ten are still refused") {
        auto c = f.connect();
        REQUIRE(c.ok());
        std::string lines;
        for (int i = 0; i < 11; ++i) {
            lines += "\r\n";
        }
        REQUIRE((*c)->send(lines + testing::http_request("GET", "/x")).ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 400);
        CHECK(r->headers["connection"] == "close");
    }
    SUBCASE("a CRLF behind a pending request leaves its client watched") {
        // The CRLF was taken for the next request's first bytes and the disconnect watcher was
        // never started: a client that left went unnoticed until the answer was written.
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send(testing::http_request("POST", "/hold", "abc") + "\r\n").ok());
        auto channel = f.handler.wait_held();
        REQUIRE(channel != nullptr);
        std::atomic<bool> gone{false};
        channel->on_client_gone([&gone] { gone = true; });
        (*c)->close();
        CHECK(testing::wait_for([&] { return gone.load(); }, std::chrono::seconds(5)));
        channel->respond(HttpResponse{200, "text/plain", {}, "late"});
    }
}

TEST_CASE("an endless chunk-size line, chunk extension or trailer is refused at max_header_bytes") {
    HttpLimits limits;
    limits.max_header_bytes = 2048;
    Fixture f(limits);
    const std::string head = "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (const std::string& start :
         {std::string("1;"), std::string("0"), std::string("0\r\nX: ")}) {
        CAPTURE(start);
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send(head + start).ok());
        const char fill = start == "0" ? '0' : 'a';
        for (int i = 0; i < 4; ++i) {
            REQUIRE((*c)->send(std::string(4096, fill)).ok());
        }
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 400);
        CHECK(r->headers["connection"] == "close");
    }
    // Exactly at the bound: a chunk extension or a trailer one byte longer than max_header_bytes
    // sent at once (one read could take in more than the bound) is refused.
    for (const std::string& body :
         {"3;n=" + std::string(2048, 'v') + "\r\nabc\r\n0\r\n\r\n",
          "0\r\nX-Trailer: " + std::string(2048, 't') + "\r\n\r\n"}) {
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send(head + body).ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 400);
    }
    // A long chunked body sent at once, its chunk lines falling anywhere in the parser's slices
    // of max_header_bytes, arrives whole.
    {
        auto c = f.connect();
        REQUIRE(c.ok());
        std::string chunks;
        for (int i = 0; i < 40; ++i) {
            chunks += "2bd;i=" + std::to_string(i) + "\r\n" + std::string(701, 'c') + "\r\n";
        }
        REQUIRE((*c)->send(head + chunks + "0\r\n\r\n").ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->body == "remote=127.0.0.1 sni=localhost body=28040");
    }
    // Extensions and trailers within the bound are accepted.
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send(head + "3;name=" + std::string(1000, 'v') +
                       "\r\nabc\r\n0\r\nX-Trailer: " + std::string(1000, 't') + "\r\n\r\n")
                .ok());
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(r->body == "remote=127.0.0.1 sni=localhost body=3");
}

TEST_CASE("the server's own error answer to a HEAD request has no content") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send("HEAD / HTTP/1.1\r\n\r\n").ok());  // No Host: a 400.
    auto all = (*c)->read_until("\r\n\r\n");
    REQUIRE(all.ok());
    CHECK(all->starts_with("HTTP/1.1 400 "));
    CHECK(all->find("content-length: 0") == std::string::npos);  // The GET's length is kept,
    CHECK_FALSE((*c)->read_until("}").ok());  // and no JSON body follows before the close.
}

TEST_CASE("a chunked body's trailer fields are read and dropped, never taken as header fields") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send("POST /headers HTTP/1.1\r\nHost: localhost\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n"
                       "3\r\nabc\r\n0\r\nHost: other.test\r\nAuthorization: Bearer x\r\n"
                       "X-Model-Version: v9\r\n\r\n")
                .ok());
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    CHECK(r->body == "Host: localhost\nTransfer-Encoding: chunked\nbody=abc");
    // The connection goes on: the trailer was consumed.
    CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");
}

TEST_CASE("a trailer's Connection field does not close the connection") {
    // The parser adds the trailer's fields to the message's; keep-alive was read from the
    // message after its body, so a trailer's Connection: close ended the connection and the
    // request pipelined behind went unanswered (RFC 9110 section 6.5.1: a trailer must not
    // change how the connection is handled).
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send("POST /x HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "3\r\nabc\r\n0\r\nConnection: close\r\n\r\n" +
                       testing::http_request("POST", "/x", "hello"))
                .ok());
    auto first = (*c)->read_response();
    REQUIRE(first.ok());
    CHECK(first->status == 200);
    CHECK(first->body == "remote=127.0.0.1 sni=localhost body=3");
    CHECK(first->headers.count("connection") == 0);
    auto second = (*c)->read_response();
    REQUIRE(second.ok());
    CHECK(second->body == "remote=127.0.0.1 sni=localhost body=5");
    // A header's Connection: close still ends it after the answer.
    REQUIRE(
        (*c)->send("GET /x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok());
    auto last = (*c)->read_response();
    REQUIRE(last.ok());
    CHECK(last->headers["connection"] == "close");
    CHECK((*c)->wait_closed());
}

TEST_CASE("Transfer-Encoding other than chunked alone is refused and the connection closed") {
    Fixture f;
    const std::string inner = testing::http_request("GET", "/x");
    struct Case {
        std::string headers;
        int status;
        std::string version = "1.1";
    };
    for (const Case& k : {Case{"Transfer-Encoding: xchunked\r\n", 400},
                          Case{"Transfer-Encoding: chunked, gzip\r\n", 400},
                          Case{"Transfer-Encoding: identity\r\n", 400},
                          Case{"Transfer-Encoding: xchunked\r\nContent-Length: 3\r\n", 400},
                          Case{"Transfer-Encoding: gzip, chunked\r\n", 501},
                          Case{"Transfer-Encoding: chunked\r\n", 400, "1.0"}}) {
        CAPTURE(k.headers);
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send("POST /x HTTP/" + k.version + "\r\nHost: a\r\n" + k.headers +
                           "\r\n0\r\n\r\n" + inner)
                    .ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == k.status);
        CHECK(r->headers["connection"] == "close");
        CHECK((*c)->wait_closed());  // The body is not served as a second request.
    }
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send("POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n"
                       "2\r\nab\r\n0\r\n\r\n")
                .ok());
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(r->body == "remote=127.0.0.1 sni=localhost body=2");
}

TEST_CASE("a request the parser refuses gets a 400 naming what is wrong, then the close") {
    Fixture f;
    const std::string inner = testing::http_request("GET", "/x");
    struct Case {
        std::string request;
        std::string names;  // In the answer's message.
    };
    const std::string post = "POST /x HTTP/1.1\r\nHost: a\r\n";
    for (const Case& k :
         {// Request smuggling (RFC 9112 section 6.3), in either order.
          Case{post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
               "both Transfer-Encoding and Content-Length"},
          Case{post + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
               "both Transfer-Encoding and Content-Length"},
          Case{post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
               "conflicting Content-Length"},
          Case{post + "Content-Length: +5\r\n\r\nhello", "invalid Content-Length"},
          Case{post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n",
               "Transfer-Encoding after chunked"},
          Case{"GET /x HTTP/1.1\r\nHost: a\r\nX-A : 1\r\n\r\n", "header field name"},
          Case{"GET /x HTTP/1.1\r\nHost: a\r\nX-A: a\rb\r\n\r\n", "lines end with CRLF"},
          Case{post + "Transfer-Encoding: chunked\r\n\r\nfffffffffffffffffffff\r\n",
               "malformed chunk"},
          Case{post + "Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", "malformed chunk"},
          Case{post + "Transfer-Encoding: chunked\r\n\r\n0\r\nX-T : 1\r\n\r\n",
               "malformed trailer field name"}}) {
        CAPTURE(k.request);
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send(k.request + inner).ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 400);
        CHECK(r->headers["connection"] == "close");
        CHECK(r->body.find(k.names) != std::string::npos);
        CHECK(r->body.find("invalid_request_error") != std::string::npos);
        CHECK((*c)->wait_closed());  // Nothing behind it is served as a request.
    }
}

TEST_CASE("a HEAD response has the GET's Content-Length and no body") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send(testing::http_request("HEAD", "/x")).ok());
    auto head = (*c)->read_until("\r\n\r\n");
    REQUIRE(head.ok());
    const std::string body = "remote=127.0.0.1 sni=localhost body=0";
    CHECK(head->find("Content-Length: " + std::to_string(body.size()) + "\r\n") !=
          std::string::npos);
    // A body sent anyway would be read here as the next response.
    CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");
}

TEST_CASE("Expect: 100-continue in an HTTP/1.0 request gets no interim response") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send("POST /x HTTP/1.0\r\nHost: a\r\nContent-Length: 4\r\n"
                       "Expect: 100-continue\r\n\r\nabcd")
                .ok());
    auto head = (*c)->read_until("\r\n\r\n");
    REQUIRE(head.ok());
    CHECK(head->starts_with("HTTP/1.0 200 "));  // Not an interim "HTTP/1.1 100 Continue".
}

TEST_CASE("out of file descriptors, the accept loop backs off and logs once, then serves again") {
    Fixture f;
    auto failures_logged = std::make_shared<std::atomic<int>>(0);
    log::set_sink([failures_logged](std::string_view line) {
        if (line.find("accept_failed") != std::string_view::npos) {
            ++*failures_logged;
        }
    });
    // The client's socket is made first; then every descriptor is taken, so the server's accept
    // fails.
    auto client_socket = testing::tcp_socket();
    REQUIRE(client_socket.ok());
    testing::FdExhaustion exhausted;
    auto waiting = testing::tcp_connect_socket(*client_socket, f.server->port());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const int logged = failures_logged->load();
    exhausted.release();
    log::set_sink(nullptr);
    REQUIRE(exhausted.filled());
    REQUIRE(waiting.ok());
    ::close(*waiting);
    CHECK(logged >= 1);
    CHECK(logged <= 2);  // Spinning logged tens of thousands of lines a second.
    auto c = f.connect();
    REQUIRE(c.ok());
    CHECK(get_body(**c) == "remote=127.0.0.1 sni=localhost body=0");
}

TEST_CASE("a client that leaves mid-request is not answered, nor counted, as a malformed one") {
    Fixture f;
    for (const std::string& partial :
         {std::string("GET /x HTTP/1.1\r\nHost: localhost\r\n"),
          std::string("POST /x HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\nabc"),
          std::string("POST /x HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
                      "\r\n5\r\nab")}) {
        for (const bool notify : {true, false}) {
            auto c = f.connect();
            REQUIRE(c.ok());
            REQUIRE((*c)->send(partial).ok());
            // The TLS end (close_notify), or the TCP end alone: a partial message either way.
            if (notify) {
                (*c)->send_close_notify();
                CHECK((*c)->wait_closed());
            }
            (*c)->close();
        }
    }
    auto c = f.connect();
    REQUIRE(c.ok());
    CHECK(get_body(**c, "/x") == "remote=127.0.0.1 sni=localhost body=0");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::vector<Answered> a = f.observer.answered(1);
    REQUIRE(a.size() == 1);  // Was a 400 "malformed HTTP request" for each.
    CHECK(a[0].status == 200);
}

TEST_CASE("each answer is reported once: status, body bytes, completeness and the handler's notes") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    const std::string body = get_body(**c, "/x");
    std::vector<Answered> a = f.observer.answered(1);
    REQUIRE(a.size() == 1);
    CHECK(a[0].method == "GET");
    CHECK(a[0].path == "/x");
    CHECK(a[0].client == "127.0.0.1");
    CHECK(a[0].status == 200);
    CHECK(a[0].complete);
    CHECK(a[0].body_bytes == body.size());
    CHECK(a[0].notes.empty());

    // A streamed answer: its notes in order, the chunks' bytes without the chunk framing.
    REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
    std::shared_ptr<ResponseChannel> held = f.handler.wait_held();
    REQUIRE(held != nullptr);
    held->note("tenant", "acme");
    held->note("completion_tokens", int64_t{7});
    held->begin_stream(HttpResponse{200, "text/plain", {}, {}});
    held->write("abc");
    held->write("de");
    held->end_stream();
    auto reply = (*c)->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->body == "abcde");
    a = f.observer.answered(2);
    REQUIRE(a.size() == 2);
    CHECK(a[1].path == "/hold");
    CHECK(a[1].status == 200);
    CHECK(a[1].complete);
    CHECK(a[1].body_bytes == 5);
    CHECK(a[1].notes == std::vector<std::string>{"tenant=acme", "completion_tokens=7"});

    // The client leaves before any answer: 499, not complete. The record waits until the
    // handler lets go of the channel, so the notes it makes meanwhile (how generation ended) are
    // in it; a late answer changes nothing.
    f.handler.reset_held();
    REQUIRE((*c)->send(testing::http_request("GET", "/hold")).ok());
    held = f.handler.wait_held();
    REQUIRE(held != nullptr);
    held->note("tenant", "acme");
    (*c)->close();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(f.observer.answered(2).size() == 2);
    held->note("outcome", "cancelled");
    held->respond(HttpResponse{});
    f.handler.reset_held();
    held.reset();
    a = f.observer.answered(3);
    REQUIRE(a.size() == 3);
    CHECK(a[2].status == kClientClosedRequest);
    CHECK_FALSE(a[2].complete);
    CHECK(a[2].body_bytes == 0);
    CHECK(a[2].path == "/hold");
    CHECK(a[2].notes == std::vector<std::string>{"tenant=acme", "outcome=cancelled"});
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(f.observer.answered(3).size() == 3);

    // What the server answers itself has no method.
    auto bad = f.connect();
    REQUIRE(bad.ok());
    REQUIRE((*bad)->send("NOT HTTP\r\n\r\n").ok());
    a = f.observer.answered(4);
    REQUIRE(a.size() == 4);
    CHECK(a[3].method.empty());
    CHECK(a[3].status == 400);
    CHECK(a[3].complete);
    CHECK(a[3].body_bytes > 0);
}

TEST_CASE("a body read to the close (HTTP/1.0 stream) ends with close_notify, not a cut") {
    Fixture f;
    auto c = f.connect();
    REQUIRE(c.ok());
    REQUIRE((*c)->send("GET /hold HTTP/1.0\r\nHost: a\r\n\r\n").ok());
    std::shared_ptr<ResponseChannel> held = f.handler.wait_held();
    REQUIRE(held != nullptr);
    held->begin_stream(HttpResponse{200, "text/plain", {}, {}});
    held->write("abc");
    held->end_stream();
    auto reply = (*c)->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->body == "abc");
    CHECK((*c)->got_close_notify());
}

TEST_CASE("the request path: origin form, absolute form, query dropped") {
    auto path = [](std::string target) {
        HttpRequest r;
        r.target = std::move(target);
        return std::string(r.path());
    };
    CHECK(path("/v1/models?limit=2") == "/v1/models");
    CHECK(path("https://edge.example:8443/v1/models?x") == "/v1/models");
    CHECK(path("HTTP://edge.example/v1/chat/completions") == "/v1/chat/completions");
    CHECK(path("http://edge.example") == "/");
    CHECK(path("http://edge.example?x=1") == "/");
    CHECK(path("/a://b") == "/a://b");  // Origin form that holds "://".
}

TEST_CASE("body_timeout bounds a body's silences: a slow upload that keeps sending is read") {
    HttpLimits limits;
    limits.body_timeout = std::chrono::milliseconds(300);
    Fixture f(limits);
    auto c = f.connect();
    REQUIRE(c.ok());
    // 10 pieces 100 ms apart: a second in all, more than three body timeouts.
    constexpr int kPieces = 10;
    REQUIRE((*c)->send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                       std::to_string(kPieces * 100) + "\r\n\r\n")
                .ok());
    const auto started = std::chrono::steady_clock::now();
    for (int i = 0; i < kPieces; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        REQUIRE((*c)->send(std::string(100, 'b')).ok());
    }
    auto r = (*c)->read_response();
    REQUIRE(r.ok());
    CHECK(std::chrono::steady_clock::now() - started > 3 * limits.body_timeout);
    CHECK(r->status == 200);
    CHECK(r->body == "remote=127.0.0.1 sni=localhost body=1000");

    // The same connection, then a body that stops: 408 once it has been silent that long.
    REQUIRE((*c)->send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 300\r\n\r\n").ok());
    for (int i = 0; i < 2; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        REQUIRE((*c)->send(std::string(100, 'b')).ok());
    }
    const auto stalled = std::chrono::steady_clock::now();
    auto timed_out = (*c)->read_response();
    REQUIRE(timed_out.ok());
    CHECK(timed_out->status == 408);
    CHECK(timed_out->body.find("body_timeout") != std::string::npos);
    // The server armed it when it read the last piece, which can be a little before this
    // thread, descheduled after its send, took `stalled`.
    CHECK(std::chrono::steady_clock::now() - stalled >=
          limits.body_timeout - std::chrono::milliseconds(50));
    CHECK((*c)->wait_closed());
}

TEST_CASE("a 408 is recorded under its route with the time the request held the connection") {
    HttpLimits limits;
    limits.header_timeout = std::chrono::milliseconds(300);
    limits.body_timeout = std::chrono::milliseconds(300);
    Fixture f(limits);
    {
        // The header stops after its request line.
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send("POST /v1/models?x=1 HTTP/1.1\r\nHost: lo").ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 408);
    }
    {
        // The same with a request line that came in two pieces (Beast then waits for the whole
        // header before it parses the line).
        auto c = f.connect();
        REQUIRE(c.ok());
        REQUIRE((*c)->send("GET /v1/mod").ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        REQUIRE((*c)->send("els HTTP/1.1\r\nHost: lo").ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 408);
    }
    {
        // The body stops: the header came in at once after a keep-alive request.
        auto c = f.connect();
        REQUIRE(c.ok());
        CHECK(get_body(**c, "/first") == "remote=127.0.0.1 sni=localhost body=0");
        std::this_thread::sleep_for(std::chrono::milliseconds(500));  // Idle: not the request's.
        REQUIRE((*c)->send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                           "Content-Length: 10\r\n\r\nab")
                    .ok());
        auto r = (*c)->read_response();
        REQUIRE(r.ok());
        CHECK(r->status == 408);
    }
    const std::vector<Answered> answered = f.observer.answered(4);
    REQUIRE(answered.size() == 4);
    CHECK(answered[0].status == 408);
    CHECK(answered[0].method == "POST");
    CHECK(answered[0].path == "/v1/models");
    CHECK(answered[0].duration >= limits.header_timeout);
    CHECK(answered[0].duration < std::chrono::seconds(2));
    CHECK(answered[1].status == 408);
    CHECK(answered[1].method == "GET");
    CHECK(answered[1].path == "/v1/models");
    CHECK(answered[1].duration >= limits.header_timeout);
    CHECK(answered[2].path == "/first");
    CHECK(answered[3].status == 408);
    CHECK(answered[3].method == "POST");
    CHECK(answered[3].path == "/v1/chat/completions");
    CHECK(answered[3].duration >= limits.body_timeout);
    CHECK(answered[3].duration < limits.body_timeout + std::chrono::milliseconds(450));
}
