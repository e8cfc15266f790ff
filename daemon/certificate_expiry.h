#pragma once

// Certificate expiry for the metrics: reads the leaf (first PEM block) of each configured chain
// and publishes its notAfter as edgeserve_tls_certificate_expiry_timestamp_seconds{certificate}.
// The label is the chain's first SNI name, or the certificate file's name when it has none (a
// bounded set: one per configured chain, two for the peer section; see certificate_labels). Pure
// functions; call from any thread.

#include <string>
#include <vector>

#include "common/result.h"
#include "tls/tls_context.h"

namespace edge::daemon {

class Metrics;

// notAfter of the first certificate in the PEM file at `path`, as Unix seconds.
Result<int64_t> certificate_not_after(const std::string& path);

// The metric labels of the configured chains, one each and all different: a chain's first SNI
// name, or its file's name; where two chains would share one (the same first name, or certbot's
// .../live/<site>/fullchain.pem twice), those take their file's full path, so neither hides the
// other's expiry.
std::vector<std::string> certificate_labels(const std::vector<tls::CertificateConfig>& certs);

// Sets the expiry gauge for every chain that can be read and drops the series of every other
// (unreadable ones are skipped: loading them reports the error; chains no longer configured
// are gone). With a peer section, also the site's cluster certificate and the cluster CA
// (labels "peer:<file name>" and "peer-ca:<file name>"): when either lapses, every forward to and
// from the site fails its handshake.
void publish_certificate_expiry(const std::vector<tls::CertificateConfig>& certs, Metrics& metrics,
                                const std::string& peer_cert_path = "",
                                const std::string& peer_ca_path = "");

}  // namespace edge::daemon
