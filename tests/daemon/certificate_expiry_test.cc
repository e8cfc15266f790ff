// The certificate expiry gauge of an in-process Daemon: it shows what is served, the earliest
// date of each served chain (an intermediate that lapses first, the old CA of a CA bundle), and a
// reload that was refused leaves it at the served certificate's date.

#include "daemon/certificate_expiry.h"

#include <doctest/doctest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <memory>
#include <regex>
#include <string>

#include "common/clock.h"
#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "daemon/null_generator.h"
#include "tests/testing/daemon_yaml.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/test_daemon.h"

using namespace edge;

namespace {

constexpr int64_t kDay = 24 * 3600;

// A certificate made here with the validity the test needs (the shared helpers' is fixed), its
// files, and its key and certificate in memory to sign others with.
struct Issued {
    std::string cert_path;
    std::string key_path;
    int64_t not_after = 0;  // Unix seconds.
    std::shared_ptr<X509> cert;
    std::shared_ptr<EVP_PKEY> key;
};

// Writes `<dir>/<stem>.crt` and `.key`: a certificate for `name` valid for `days` days, signed by
// `issuer` (self-signed when null); `ca`: basicConstraints CA:TRUE.
Issued issue(const std::string& dir, const std::string& stem, const std::string& name, int days,
             const Issued* issuer = nullptr, bool ca = false) {
    Issued out;
    out.key.reset(EVP_EC_gen("P-256"), EVP_PKEY_free);
    REQUIRE(out.key != nullptr);
    out.cert.reset(X509_new(), X509_free);
    X509* cert = out.cert.get();
    X509_set_version(cert, 2);
    static long serial = 90'000;
    ASN1_INTEGER_set(X509_get_serialNumber(cert), ++serial);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), days * kDay);
    X509_set_pubkey(cert, out.key.get());
    X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
    X509* signer = issuer != nullptr ? issuer->cert.get() : cert;
    X509_set_issuer_name(cert, X509_get_subject_name(signer));
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, signer, cert, nullptr, nullptr, 0);
    const std::string constraints = ca ? "critical,CA:TRUE" : "CA:FALSE";
    X509_EXTENSION* ext =
        X509V3_EXT_conf_nid(nullptr, &ctx, NID_basic_constraints, constraints.c_str());
    REQUIRE(ext != nullptr);
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    if (!ca) {
        ext = X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name,
                                  ("DNS:" + name + ",DNS:localhost,IP:127.0.0.1").c_str());
        REQUIRE(ext != nullptr);
        X509_add_ext(cert, ext, -1);
        X509_EXTENSION_free(ext);
    }
    EVP_PKEY* signing_key = issuer != nullptr ? issuer->key.get() : out.key.get();
    REQUIRE(X509_sign(cert, signing_key, EVP_sha256()) > 0);
    out.cert_path = dir + "/" + stem + ".crt";
    out.key_path = dir + "/" + stem + ".key";
    FILE* f = std::fopen(out.cert_path.c_str(), "w");
    REQUIRE(f != nullptr);
    PEM_write_X509(f, cert);
    std::fclose(f);
    testing::write_private_key(out.key_path, out.key.get());
    Result<int64_t> not_after = daemon::certificate_not_after(out.cert_path);
    REQUIRE(not_after.ok());
    out.not_after = *not_after;
    return out;
}

// The expiry gauge's value for `label` in /metrics text, or -1 without that series.
int64_t expiry(const std::string& metrics, const std::string& label) {
    std::smatch m;
    const std::regex series("edgeserve_tls_certificate_expiry_timestamp_seconds\\{certificate=\"" +
                            label + "\"\\} ([0-9.e+]+)");
    return std::regex_search(metrics, m, series) ? static_cast<int64_t>(std::stod(m[1])) : -1;
}

struct Fixture {
    std::unique_ptr<daemon::Daemon> make(const testing::DaemonYaml& yaml) {
        return testing::make_daemon(testing::daemon_yaml(yaml), dir.file("c.yaml"), generator,
                                    clock);
    }
    testing::TempDir dir;
    ManualClock clock;
    daemon::NullGenerator generator;
};

}  // namespace

TEST_CASE("the expiry gauge shows a chain's intermediate when it lapses before the leaf") {
    Fixture f;
    const Issued intermediate =
        issue(f.dir.path(), "intermediate", "Test intermediate CA", 10, nullptr, true);
    const Issued leaf = issue(f.dir.path(), "leaf", "localhost", 300, &intermediate);
    REQUIRE(leaf.not_after - intermediate.not_after > 200 * kDay);
    // As a CA hands it out: the leaf, then the intermediate it was signed with.
    const std::string chain =
        f.dir.write("fullchain.pem", testing::read_file(leaf.cert_path) +
                                         testing::read_file(intermediate.cert_path));
    testing::DaemonYaml y;
    y.cert_path = chain;
    y.key_path = leaf.key_path;
    auto d = f.make(y);
    CHECK(expiry(d->metrics().serialize(), "localhost") == intermediate.not_after);
}

TEST_CASE("a refused certificate reload leaves the expiry gauge at the served certificate's") {
    Fixture f;
    const Issued served = issue(f.dir.path(), "served", "localhost", 10);
    const Issued renewed = issue(f.dir.path(), "renewed", "localhost", 300);
    const std::string live_cert = f.dir.file("live.crt");
    const std::string live_key = f.dir.file("live.key");
    f.dir.write("live.crt", testing::read_file(served.cert_path));
    testing::write_private_key(live_key, served.key.get());
    testing::DaemonYaml y;
    y.cert_path = live_cert;
    y.key_path = live_key;
    auto d = f.make(y);
    CHECK(expiry(d->metrics().serialize(), "localhost") == served.not_after);

    // The new certificate is on disk, its key not yet: the reload is refused and the old
    // certificate is still the one served, so the gauge (and any alert on it) stays with it.
    f.dir.write("live.crt", testing::read_file(renewed.cert_path));
    CHECK_FALSE(d->reload_certificates().ok());
    CHECK(expiry(d->metrics().serialize(), "localhost") == served.not_after);

    testing::write_private_key(live_key, renewed.key.get());
    REQUIRE(d->reload_certificates().ok());
    CHECK(expiry(d->metrics().serialize(), "localhost") == renewed.not_after);
}

TEST_CASE("the peer gauges: the cluster certificate's chain and the CA bundle's earliest CA") {
    Fixture f;
    // A CA rotation in progress: the bundle trusts the new CA (listed first) and the old one.
    const Issued old_ca = issue(f.dir.path(), "old-ca", "Old cluster CA", 20, nullptr, true);
    const Issued new_ca = issue(f.dir.path(), "new-ca", "New cluster CA", 3650, nullptr, true);
    const std::string bundle =
        f.dir.write("cluster-ca.pem",
                    testing::read_file(new_ca.cert_path) + testing::read_file(old_ca.cert_path));
    const Issued site = issue(f.dir.path(), "site", "site", 397, &new_ca);
    const Issued public_cert = issue(f.dir.path(), "public", "localhost", 90);
    testing::DaemonYaml y;
    y.cert_path = public_cert.cert_path;
    y.key_path = public_cert.key_path;
    y.peer = testing::PeerYaml{bundle, site.cert_path, site.key_path};
    auto d = f.make(y);
    const std::string metrics = d->metrics().serialize();
    CHECK(expiry(metrics, "localhost") == public_cert.not_after);
    CHECK(expiry(metrics, "peer:site.crt") == site.not_after);
    CHECK(expiry(metrics, "peer-ca:cluster-ca.pem") == old_ca.not_after);
}
