#pragma once

// Certificate expiry for the metrics, read from what is served, never from the files on disk:
// after a reload that failed, the files may hold certificates that were refused while the old
// ones are still served, and the gauge must keep showing the served ones' dates.
//
// edgeserve_tls_certificate_expiry_timestamp_seconds{certificate} is, per served chain, the
// earliest notAfter among the certificates the chain sends (its leaf and the intermediates of its
// chain file): the moment clients start failing that chain's handshake, which is an
// intermediate's date when the intermediate lapses before the leaf. There is no per-leaf series.
// The label is the chain's first SNI name, or the certificate file's name when it has none (a
// bounded set: one per configured chain, two for the peer section; see certificate_labels).
// Pure functions; call from any thread.

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "tls/tls_context.h"

namespace edge::daemon {

class Metrics;

// notAfter of the first certificate in the PEM file at `path`, as Unix seconds. The gauge does
// not use it (it reads the loaded contexts); it is for comparing a file with what is served.
Result<int64_t> certificate_not_after(const std::string& path);

// The earliest notAfter, as Unix seconds, among the certificates `ctx` serves: its certificate
// and that certificate's chain. kNotFound when it holds no certificate.
Result<int64_t> served_chain_not_after(ssl_ctx_st* ctx);

// The earliest notAfter, as Unix seconds, among the CA certificates `ctx` verifies peers with
// (its trust store). kNotFound when it trusts none.
Result<int64_t> trusted_ca_not_after(ssl_ctx_st* ctx);

// The metric labels of the configured chains, one each and all different: a chain's first SNI
// name, or its file's name; where two chains would share one (the same first name, or certbot's
// .../live/<site>/fullchain.pem twice), those take their file's full path, so neither hides the
// other's expiry.
std::vector<std::string> certificate_labels(const std::vector<tls::CertificateConfig>& certs);

// Sets the expiry gauge for every chain of `served` (the public listener's current generation)
// and drops the series of every other label (chains no longer served are gone). With `peer` (the
// peer listener's current generation), also the site's cluster certificate, label
// "peer:<file name>", and the cluster CA, label "peer-ca:<file name>": the earliest notAfter
// among the CA certificates of that file, so a bundle holding an old and a new CA during a
// rotation shows the old one's (a site still on it fails every handshake once it lapses; drop it
// from the bundle when no site uses it). Calling it again with the same generations, as after a
// reload that failed, leaves every series as it was.
void publish_certificate_expiry(const tls::TlsGeneration& served, Metrics& metrics,
                                const tls::TlsGeneration* peer = nullptr);

}  // namespace edge::daemon
