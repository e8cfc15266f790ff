#include "daemon/certificate_expiry.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <ctime>
#include <filesystem>
#include <map>
#include <memory>

#include "daemon/metrics.h"

namespace edge::daemon {

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
    std::tm tm{};
    if (ASN1_TIME_to_tm(X509_get0_notAfter(cert.get()), &tm) != 1) {
        return invalid_argument_error("'" + path + "': unreadable notAfter");
    }
    return static_cast<int64_t>(timegm(&tm));
}

std::vector<std::string> certificate_labels(const std::vector<tls::CertificateConfig>& certs) {
    std::vector<std::string> labels;
    std::map<std::string, int> uses;
    for (const tls::CertificateConfig& cert : certs) {
        labels.push_back(!cert.server_names.empty()
                             ? cert.server_names.front()
                             : std::filesystem::path(cert.cert_path).filename().string());
        ++uses[labels.back()];
    }
    for (size_t i = 0; i < certs.size(); ++i) {
        if (uses[labels[i]] > 1) {
            labels[i] = certs[i].cert_path;
        }
    }
    return labels;
}

void publish_certificate_expiry(const std::vector<tls::CertificateConfig>& certs, Metrics& metrics,
                                const std::string& peer_cert_path,
                                const std::string& peer_ca_path) {
    std::vector<std::string> labels;
    auto publish = [&](const std::string& label, const std::string& path) {
        Result<int64_t> not_after = certificate_not_after(path);
        if (not_after.ok()) {
            metrics.set_certificate_expiry(label, *not_after);
            labels.push_back(label);
        }
    };
    const std::vector<std::string> chain_labels = certificate_labels(certs);
    for (size_t i = 0; i < certs.size(); ++i) {
        publish(chain_labels[i], certs[i].cert_path);
    }
    if (!peer_cert_path.empty()) {
        publish("peer:" + std::filesystem::path(peer_cert_path).filename().string(),
                peer_cert_path);
    }
    if (!peer_ca_path.empty()) {
        publish("peer-ca:" + std::filesystem::path(peer_ca_path).filename().string(), peer_ca_path);
    }
    metrics.retain_certificate_expiry(labels);
}

}  // namespace edge::daemon
