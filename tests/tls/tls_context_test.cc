// Loading certificate chains and keys into TlsContextStore, with files generated at test time.

#include "tls/tls_context.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <chrono>
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
    Status bad = use_private_key_file(ctx, garbage);
    CHECK(bad.message().find("'" + garbage + "'") != std::string::npos);
    CHECK(bad.message().find("encrypted") == std::string::npos);
}
