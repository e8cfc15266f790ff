#include "daemon/certificate_expiry.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "daemon/metrics.h"

namespace edge::daemon {
namespace {

std::optional<int64_t> not_after_of(const X509* cert) {
    std::tm tm{};
    if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) != 1) {
        return std::nullopt;
    }
    return static_cast<int64_t>(timegm(&tm));
}

// Keeps the earlier of `earliest` and `cert`'s notAfter (a certificate whose notAfter cannot be
// read, which OpenSSL would not have loaded, is skipped).
void keep_earliest(std::optional<int64_t>& earliest, const X509* cert) {
    if (std::optional<int64_t> t = not_after_of(cert); t && (!earliest || *t < *earliest)) {
        earliest = t;
    }
}

std::string file_name(const std::string& path) {
    return std::filesystem::path(path).filename().string();
}

}  // namespace

Result<int64_t> certificate_not_after(const std::string& path) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_file(path.c_str(), "r"), BIO_free);
    if (!bio) {
        return not_found_error("cannot open certificate '" + path + "'");
    }
    std::unique_ptr<X509, decltype(&X509_free)> cert(
        PEM_read_bio_X509(bio.get(), nullptr, tls::refuse_pem_passphrase, nullptr), X509_free);
    if (!cert) {
        return invalid_argument_error("'" + path + "' holds no PEM certificate");
    }
    std::optional<int64_t> not_after = not_after_of(cert.get());
    if (!not_after) {
        return invalid_argument_error("'" + path + "': unreadable notAfter");
    }
    return *not_after;
}

Result<int64_t> served_chain_not_after(SSL_CTX* ctx) {
    const X509* leaf = SSL_CTX_get0_certificate(ctx);
    if (leaf == nullptr) {
        return not_found_error("the TLS context holds no certificate");
    }
    std::optional<int64_t> earliest;
    keep_earliest(earliest, leaf);
    // The intermediates SSL_CTX_use_certificate_chain_file read after the leaf.
    STACK_OF(X509)* chain = nullptr;
    if (SSL_CTX_get0_chain_certs(ctx, &chain) == 1 && chain != nullptr) {
        for (int i = 0; i < sk_X509_num(chain); ++i) {
            keep_earliest(earliest, sk_X509_value(chain, i));
        }
    }
    if (!earliest) {
        return invalid_argument_error("the served certificate has an unreadable notAfter");
    }
    return *earliest;
}

Result<int64_t> trusted_ca_not_after(SSL_CTX* ctx) {
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    std::optional<int64_t> earliest;
    if (store != nullptr) {
        STACK_OF(X509_OBJECT)* objects = X509_STORE_get0_objects(store);
        for (int i = 0; i < sk_X509_OBJECT_num(objects); ++i) {
            if (const X509* cert = X509_OBJECT_get0_X509(sk_X509_OBJECT_value(objects, i))) {
                keep_earliest(earliest, cert);
            }
        }
    }
    if (!earliest) {
        return not_found_error("the TLS context trusts no CA certificate");
    }
    return *earliest;
}

std::vector<std::string> certificate_labels(const std::vector<tls::CertificateConfig>& certs) {
    std::vector<std::string> labels;
    std::map<std::string, int> uses;
    for (const tls::CertificateConfig& cert : certs) {
        labels.push_back(!cert.server_names.empty() ? cert.server_names.front()
                                                    : file_name(cert.cert_path));
        ++uses[labels.back()];
    }
    for (size_t i = 0; i < certs.size(); ++i) {
        if (uses[labels[i]] > 1) {
            labels[i] = certs[i].cert_path;
        }
    }
    return labels;
}

void publish_certificate_expiry(const tls::TlsGeneration& served, Metrics& metrics,
                                const tls::TlsGeneration* peer) {
    std::vector<std::string> labels;
    auto publish = [&](const std::string& label, const Result<int64_t>& not_after) {
        if (not_after.ok()) {
            metrics.set_certificate_expiry(label, *not_after);
            labels.push_back(label);
        }
    };
    std::vector<tls::CertificateConfig> certs;
    for (size_t i = 0; i < served.chain_count(); ++i) {
        certs.push_back(served.certificate(i));
    }
    const std::vector<std::string> chain_labels = certificate_labels(certs);
    for (size_t i = 0; i < served.chain_count(); ++i) {
        publish(chain_labels[i], served_chain_not_after(served.native_context(i)));
    }
    if (peer != nullptr) {
        // One chain: the site's cluster certificate, verifying clients with the cluster CA.
        publish("peer:" + file_name(peer->certificate(0).cert_path),
                served_chain_not_after(peer->native_context(0)));
        if (!peer->client_ca_path().empty()) {
            publish("peer-ca:" + file_name(peer->client_ca_path()),
                    trusted_ca_not_after(peer->native_context(0)));
        }
    }
    metrics.retain_certificate_expiry(labels);
}

}  // namespace edge::daemon
