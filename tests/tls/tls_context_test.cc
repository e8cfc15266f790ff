// Loading certificate chains and keys into TlsContextStore, with files generated at test time.

#include "tls/tls_context.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <openssl/ssl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "tests/testing/test_certs.h"

using namespace edge;
using namespace edge::tls;

namespace {

// Runs `body` with stdin on /dev/null and stderr into a file, and returns what reached stderr:
// OpenSSL's default passphrase prompt writes there when the process has no terminal, and reads
// stdin (a test run from a terminal must not wait on it).
std::string stderr_of(const testing::TempDir& dir, const std::function<void()>& body) {
    const std::string path = dir.file("stderr.txt");
    const int saved_in = dup(0);
    const int saved_err = dup(2);
    const int null_in = open("/dev/null", O_RDONLY);
    const int err = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(saved_in >= 0);
    REQUIRE(saved_err >= 0);
    REQUIRE(null_in >= 0);
    REQUIRE(err >= 0);
    dup2(null_in, 0);
    dup2(err, 2);
    body();
    dup2(saved_in, 0);
    dup2(saved_err, 2);
    for (int fd : {saved_in, saved_err, null_in, err}) {
        close(fd);
    }
    return testing::read_file(path);
}

}  // namespace

TEST_CASE("an encrypted private key is refused at once with the file named and no prompt") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "a", {"localhost"});
    testing::encrypt_private_key(cert.key_path, "x");
    Result<std::unique_ptr<TlsContextStore>> store = invalid_argument_error("not run");
    const auto start = std::chrono::steady_clock::now();
    const std::string printed = stderr_of(dir, [&] {
        store = TlsContextStore::create({{{"localhost"}, cert.cert_path, cert.key_path}});
    });
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    REQUIRE_FALSE(store.ok());
    const std::string& message = store.status().message();
    CHECK(message.find("'" + cert.key_path + "'") != std::string::npos);
    CHECK(message.find("encrypted") != std::string::npos);
    CHECK(message.find("openssl pkey") != std::string::npos);
    CHECK(printed.find("pass phrase") == std::string::npos);
    CHECK(printed.empty());
}

TEST_CASE("a reload that meets an encrypted key keeps the old certificates") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "a", {"localhost"});
    auto store = TlsContextStore::create({{{"localhost"}, cert.cert_path, cert.key_path}});
    REQUIRE(store.ok());
    const auto before = (*store)->current();
    CHECK(before->number() == 1);
    testing::encrypt_private_key(cert.key_path, "x");
    Status reloaded = invalid_argument_error("not run");
    const std::string printed = stderr_of(dir, [&] { reloaded = (*store)->reload(); });
    REQUIRE_FALSE(reloaded.ok());
    CHECK(reloaded.message().find("'" + cert.key_path + "' is encrypted") != std::string::npos);
    CHECK(printed.empty());
    CHECK((*store)->current() == before);

    // A plain key again is taken by the next reload: the failed one left nothing behind.
    testing::make_certificate(dir.path(), "a", {"localhost"});
    REQUIRE((*store)->reload().ok());
    CHECK((*store)->current() != before);
    CHECK((*store)->current()->number() == 2);  // The failed reload took no number.
}

TEST_CASE("use_private_key_file names a missing or malformed key file") {
    testing::TempDir dir;
    std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> owned(SSL_CTX_new(TLS_server_method()),
                                                            SSL_CTX_free);
    SSL_CTX* ctx = owned.get();
    Status missing = use_private_key_file(ctx, dir.file("missing.key"));
    CHECK(missing.message().find("cannot load private key '" + dir.file("missing.key") + "'") !=
          std::string::npos);
    const std::string garbage =
        dir.write("bad.key", "-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n");
    std::filesystem::permissions(
        garbage, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    Status bad = use_private_key_file(ctx, garbage);
    CHECK(bad.message().find("'" + garbage + "'") != std::string::npos);
    CHECK(bad.message().find("encrypted") == std::string::npos);
}

TEST_CASE("a private key every user may read or write is refused with its mode and the chmod") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "a", {"localhost"});
    auto create = [&](const std::string& key_path) {
        return TlsContextStore::create({{{"localhost"}, cert.cert_path, key_path}});
    };
    REQUIRE(create(cert.key_path).ok());  // 0600, as the helper writes it.
    REQUIRE(::chmod(cert.key_path.c_str(), 0640) == 0);
    CHECK(create(cert.key_path).ok());  // Group-readable: the packaged 0640 root:edgeserve.

    REQUIRE(::chmod(cert.key_path.c_str(), 0644) == 0);
    auto readable = create(cert.key_path);
    REQUIRE_FALSE(readable.ok());
    const std::string& message = readable.status().message();
    CHECK_MESSAGE(message.find("private key '" + cert.key_path +
                               "' is readable by every user on this machine (mode 0644)") !=
                      std::string::npos,
                  message);
    CHECK(message.find("chmod 0640 '" + cert.key_path + "'") != std::string::npos);
    CHECK(message.find("chmod 0600") != std::string::npos);

    REQUIRE(::chmod(cert.key_path.c_str(), 0602) == 0);
    auto writable = create(cert.key_path);
    REQUIRE_FALSE(writable.ok());
    CHECK_MESSAGE(writable.status().message().find("is writable by every user on this machine "
                                                   "(mode 0602)") != std::string::npos,
                  writable.status().message());

    // A symbolic link is judged by the file it points to (certbot's live/ -> archive/).
    const std::string link = dir.file("live.key");
    REQUIRE(::symlink(cert.key_path.c_str(), link.c_str()) == 0);
    REQUIRE(::chmod(cert.key_path.c_str(), 0604) == 0);
    auto through_link = create(link);
    REQUIRE_FALSE(through_link.ok());
    CHECK_MESSAGE(
        through_link.status().message().find(
            "private key '" + link + "' (-> '" +
            std::filesystem::canonical(cert.key_path).string() +
            "') is readable by every user on this machine (mode 0604)") != std::string::npos,
        through_link.status().message());
    REQUIRE(::chmod(cert.key_path.c_str(), 0600) == 0);
    CHECK(create(link).ok());
}

TEST_CASE("a reload that meets a world-readable key keeps the old certificates") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "a", {"localhost"});
    auto store = TlsContextStore::create({{{"localhost"}, cert.cert_path, cert.key_path}});
    REQUIRE(store.ok());
    const auto before = (*store)->current();
    REQUIRE(::chmod(cert.key_path.c_str(), 0644) == 0);
    Status reloaded = (*store)->reload();
    REQUIRE_FALSE(reloaded.ok());
    CHECK(reloaded.message().find("'" + cert.key_path + "' is readable by every user") !=
          std::string::npos);
    CHECK((*store)->current() == before);
    REQUIRE(::chmod(cert.key_path.c_str(), 0600) == 0);
    CHECK((*store)->reload().ok());
}

TEST_CASE("every server context, mutual TLS included, takes forward-secret AEAD TLS 1.2 suites") {
    testing::TempDir dir;
    auto plain = testing::make_certificate(dir.path(), "a", {"localhost"});
    testing::TestCa ca = testing::make_ca(dir.path(), "ca", "test CA");
    auto site = testing::make_signed_certificate(ca, dir.path(), "site", {"site"});
    auto public_store = TlsContextStore::create({{{"localhost"}, plain.cert_path, plain.key_path},
                                                 {{"site"}, site.cert_path, site.key_path}});
    REQUIRE(public_store.ok());
    auto peer_store =
        TlsContextStore::create({{{}, site.cert_path, site.key_path}}, {ca.cert_path});
    REQUIRE(peer_store.ok());
    auto check_suites = [](SSL_CTX* ctx) {
        int tls13 = 0;
        STACK_OF(SSL_CIPHER)* suites = SSL_CTX_get_ciphers(ctx);
        REQUIRE(suites != nullptr);
        for (int i = 0; i < sk_SSL_CIPHER_num(suites); ++i) {
            const SSL_CIPHER* c = sk_SSL_CIPHER_value(suites, i);
            INFO(SSL_CIPHER_get_name(c));
            if (SSL_CIPHER_get_kx_nid(c) == NID_kx_any) {
                ++tls13;  // TLS 1.3: key exchange is always (EC)DHE there.
                continue;
            }
            CHECK(SSL_CIPHER_get_kx_nid(c) == NID_kx_ecdhe);
            CHECK(SSL_CIPHER_is_aead(c) == 1);
        }
        CHECK(tls13 == 3);  // OpenSSL's default TLS 1.3 suites, untouched.
    };
    for (size_t i = 0; i < (*public_store)->current()->chain_count(); ++i) {
        check_suites((*public_store)->current()->native_context(i));
    }
    check_suites((*peer_store)->current()->native_context(0));
    REQUIRE((*public_store)->reload().ok());
    check_suites((*public_store)->current()->native_context(0));
}

TEST_CASE("SNI: a chain listing the name exactly wins over an earlier chain's wildcard") {
    testing::TempDir dir;
    auto fallback = testing::make_certificate(dir.path(), "default", {"default.test"});
    auto wildcard = testing::make_certificate(dir.path(), "wildcard", {"*.example.org"});
    auto exact = testing::make_certificate(dir.path(), "exact", {"api.example.org"});
    auto store = TlsContextStore::create(
        {{{"default.test"}, fallback.cert_path, fallback.key_path},
         {{"*.example.org"}, wildcard.cert_path, wildcard.key_path},
         {{"api.example.org"}, exact.cert_path, exact.key_path}});
    REQUIRE(store.ok());
    const auto generation = (*store)->current();
    CHECK(generation->chain_for("api.example.org") == 2);
    CHECK(generation->chain_for("API.example.org") == 2);
    CHECK(generation->chain_for("www.example.org") == 1);  // The wildcard still serves the rest.
    CHECK(generation->chain_for("example.org") == 0);
    CHECK(generation->chain_for("other.test") == 0);

    // A handshake (in memory) asking for `server_name`: the common name of what the server sent.
    auto served_common_name = [&](const char* server_name) -> std::string {
        SSL_CTX* client_ctx = SSL_CTX_new(TLS_client_method());
        REQUIRE(client_ctx != nullptr);
        SSL* client = SSL_new(client_ctx);
        SSL* server = SSL_new(generation->native_context(0));  // The default context.
        REQUIRE(client != nullptr);
        REQUIRE(server != nullptr);
        BIO* client_end = nullptr;
        BIO* server_end = nullptr;
        REQUIRE(BIO_new_bio_pair(&client_end, 0, &server_end, 0) == 1);
        SSL_set_bio(client, client_end, client_end);
        SSL_set_bio(server, server_end, server_end);
        SSL_set_tlsext_host_name(client, server_name);
        SSL_set_connect_state(client);
        SSL_set_accept_state(server);
        int client_done = 0;
        int server_done = 0;
        for (int turn = 0; turn < 20 && (client_done != 1 || server_done != 1); ++turn) {
            if (client_done != 1) {
                client_done = SSL_do_handshake(client);
            }
            if (server_done != 1) {
                server_done = SSL_do_handshake(server);
            }
        }
        std::string name;
        if (X509* cert = SSL_get1_peer_certificate(client)) {
            char buf[256] = {};
            X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf,
                                      sizeof(buf));
            name = buf;
            X509_free(cert);
        }
        SSL_free(client);
        SSL_free(server);
        SSL_CTX_free(client_ctx);
        return name;
    };
    CHECK(served_common_name("api.example.org") == "api.example.org");
    CHECK(served_common_name("www.example.org") == "*.example.org");
    CHECK(served_common_name("other.test") == "default.test");
}

TEST_CASE("prepare() builds a generation without serving it, install() serves it") {
    testing::TempDir dir;
    auto first = testing::make_certificate(dir.path(), "first", {"localhost"});
    auto second = testing::make_certificate(dir.path(), "second", {"localhost"});
    auto store = TlsContextStore::create({{{"localhost"}, first.cert_path, first.key_path}});
    REQUIRE(store.ok());
    const auto before = (*store)->current();
    auto prepared =
        (*store)->prepare({{{"localhost"}, second.cert_path, second.key_path}}, ClientAuthConfig{});
    REQUIRE(prepared.ok());
    CHECK((*store)->current() == before);  // Nothing served yet.
    CHECK_FALSE((*store)->prepare({{{"x"}, dir.file("missing.crt"), first.key_path}}, {}).ok());
    (*store)->install(std::move(prepared).value());
    const auto after = (*store)->current();
    CHECK(after != before);
    CHECK(after->number() == before->number() + 1);
    CHECK(after->certificate(0).cert_path == second.cert_path);
    // Later reloads read the installed files.
    REQUIRE((*store)->reload().ok());
    CHECK((*store)->current()->certificate(0).cert_path == second.cert_path);
}
