#include "tests/testing/test_certs.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "common/check.h"

namespace edge::testing {

TempDir::TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "edge-test-XXXXXX").string();
    char* made = mkdtemp(tmpl.data());
    EDGE_CHECK(made != nullptr, "mkdtemp failed");
    path_ = made;
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

std::string TempDir::write(const std::string& name, const std::string& contents) const {
    std::string p = file(name);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << contents;
    EDGE_CHECK(out.good(), "cannot write " + p);
    return p;
}

void write_private_key(const std::string& path, EVP_PKEY* key) {
    FILE* f = std::fopen(path.c_str(), "w");
    EDGE_CHECK(f != nullptr, "cannot write " + path);
    PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    // As a deployment keeps a key: the daemon refuses one that every user may read.
    EDGE_CHECK(::chmod(path.c_str(), 0600) == 0, "cannot chmod " + path);
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EDGE_CHECK(in.good(), "cannot read " + path);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    return bytes.str();
}

TestCertificate make_certificate(const std::string& dir, const std::string& stem,
                                 const std::vector<std::string>& dns_names) {
    EDGE_CHECK(!dns_names.empty());
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
    EDGE_CHECK(key != nullptr, "EVP_EC_gen failed");
    std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
    X509_set_version(cert.get(), 2);
    static long serial = 1000;
    ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), ++serial);
    X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert.get()), 2 * 24 * 3600);
    X509_set_pubkey(cert.get(), key.get());
    X509_NAME* name = X509_get_subject_name(cert.get());
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(dns_names[0].c_str()), -1,
                               -1, 0);
    X509_set_issuer_name(cert.get(), name);
    std::string san;
    for (const std::string& n : dns_names) {
        san += (san.empty() ? "DNS:" : ",DNS:") + n;
    }
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name, san.c_str());
    EDGE_CHECK(ext != nullptr, "SAN extension");
    X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
    EDGE_CHECK(X509_sign(cert.get(), key.get(), EVP_sha256()) > 0, "X509_sign failed");

    TestCertificate out{dir + "/" + stem + ".crt", dir + "/" + stem + ".key", dns_names[0]};
    FILE* f = std::fopen(out.cert_path.c_str(), "w");
    EDGE_CHECK(f != nullptr);
    PEM_write_X509(f, cert.get());
    std::fclose(f);
    write_private_key(out.key_path, key.get());
    return out;
}

void encrypt_private_key(const std::string& key_path, const std::string& passphrase) {
    FILE* f = std::fopen(key_path.c_str(), "r");
    EDGE_CHECK(f != nullptr);
    EVP_PKEY* key = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
    std::fclose(f);
    EDGE_CHECK(key != nullptr, "cannot read " + key_path);
    f = std::fopen(key_path.c_str(), "w");
    EDGE_CHECK(f != nullptr);
    const int written =
        PEM_write_PKCS8PrivateKey(f, key, EVP_aes_256_cbc(), passphrase.data(),
                                  static_cast<int>(passphrase.size()), nullptr, nullptr);
    std::fclose(f);
    EVP_PKEY_free(key);
    EDGE_CHECK(written == 1, "cannot encrypt " + key_path);
}

namespace {

using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using CertPtr = std::unique_ptr<X509, decltype(&X509_free)>;

void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    EDGE_CHECK(ext != nullptr, "extension " + value);
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
}

CertPtr new_certificate(EVP_PKEY* key, const std::string& common_name) {
    CertPtr cert(X509_new(), X509_free);
    X509_set_version(cert.get(), 2);
    static long serial = 50'000;
    ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), ++serial);
    X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert.get()), 2 * 24 * 3600);
    X509_set_pubkey(cert.get(), key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(cert.get()), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                               -1, 0);
    return cert;
}

void write_pem(const std::string& cert_path, X509* cert, const std::string& key_path,
               EVP_PKEY* key) {
    FILE* f = std::fopen(cert_path.c_str(), "w");
    EDGE_CHECK(f != nullptr);
    PEM_write_X509(f, cert);
    std::fclose(f);
    write_private_key(key_path, key);
}

}  // namespace

TestCa make_ca(const std::string& dir, const std::string& stem, const std::string& common_name) {
    KeyPtr key(EVP_EC_gen("P-256"), EVP_PKEY_free);
    EDGE_CHECK(key != nullptr, "EVP_EC_gen failed");
    CertPtr cert = new_certificate(key.get(), common_name);
    X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get()));
    add_extension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE");
    add_extension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
    add_extension(cert.get(), cert.get(), NID_subject_key_identifier, "hash");
    EDGE_CHECK(X509_sign(cert.get(), key.get(), EVP_sha256()) > 0, "X509_sign failed");
    TestCa out{dir + "/" + stem + ".crt", dir + "/" + stem + ".key"};
    write_pem(out.cert_path, cert.get(), out.key_path, key.get());
    return out;
}

TestCertificate make_signed_certificate(const TestCa& ca, const std::string& dir,
                                        const std::string& stem,
                                        const std::vector<std::string>& dns_names) {
    EDGE_CHECK(!dns_names.empty());
    FILE* f = std::fopen(ca.cert_path.c_str(), "r");
    EDGE_CHECK(f != nullptr, "cannot open " + ca.cert_path);
    CertPtr ca_cert(PEM_read_X509(f, nullptr, nullptr, nullptr), X509_free);
    std::fclose(f);
    f = std::fopen(ca.key_path.c_str(), "r");
    EDGE_CHECK(f != nullptr, "cannot open " + ca.key_path);
    KeyPtr ca_key(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr), EVP_PKEY_free);
    std::fclose(f);
    EDGE_CHECK(ca_cert != nullptr && ca_key != nullptr, "bad CA files");

    KeyPtr key(EVP_EC_gen("P-256"), EVP_PKEY_free);
    EDGE_CHECK(key != nullptr, "EVP_EC_gen failed");
    CertPtr cert = new_certificate(key.get(), dns_names[0]);
    X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get()));
    std::string san;
    for (const std::string& n : dns_names) {
        san += (san.empty() ? "DNS:" : ",DNS:") + n;
    }
    san += ",IP:127.0.0.1";
    add_extension(cert.get(), ca_cert.get(), NID_subject_alt_name, san);
    add_extension(cert.get(), ca_cert.get(), NID_basic_constraints, "CA:FALSE");
    add_extension(cert.get(), ca_cert.get(), NID_ext_key_usage, "serverAuth,clientAuth");
    add_extension(cert.get(), ca_cert.get(), NID_authority_key_identifier, "keyid");
    EDGE_CHECK(X509_sign(cert.get(), ca_key.get(), EVP_sha256()) > 0, "X509_sign failed");
    TestCertificate out{dir + "/" + stem + ".crt", dir + "/" + stem + ".key", dns_names[0]};
    write_pem(out.cert_path, cert.get(), out.key_path, key.get());
    return out;
}

ssl_ctx_st* make_server_context(const TestCertificate& cert) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    EDGE_CHECK(ctx != nullptr, "SSL_CTX_new failed");
    EDGE_CHECK(SSL_CTX_use_certificate_chain_file(ctx, cert.cert_path.c_str()) == 1,
               "cannot use certificate " + cert.cert_path);
    EDGE_CHECK(SSL_CTX_use_PrivateKey_file(ctx, cert.key_path.c_str(), SSL_FILETYPE_PEM) == 1,
               "cannot use key " + cert.key_path);
    return ctx;
}

}  // namespace edge::testing
