#include "daemon/certificate_expiry.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <ctime>
#include <filesystem>
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

std::string certificate_label(const tls::CertificateConfig& cert) {
    if (!cert.server_names.empty()) {
        return cert.server_names.front();
    }
    return std::filesystem::path(cert.cert_path).filename().string();
}

void publish_certificate_expiry(const std::vector<tls::CertificateConfig>& certs,
                                Metrics& metrics) {
    std::vector<std::string> labels;
    for (const tls::CertificateConfig& cert : certs) {
        Result<int64_t> not_after = certificate_not_after(cert.cert_path);
        if (not_after.ok()) {
            metrics.set_certificate_expiry(certificate_label(cert), *not_after);
            labels.push_back(certificate_label(cert));
        }
    }
    metrics.retain_certificate_expiry(labels);
}

}  // namespace edge::daemon
