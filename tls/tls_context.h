#pragma once

// TlsContextStore owns the server's OpenSSL contexts: one per certificate chain, the first being
// the default, with SNI choosing among them by server name (exact or "*.suffix" wildcard). A set of
// contexts is an immutable TlsGeneration; reload() builds a new generation from the files and swaps
// it in only when every chain loads, so a broken key file keeps the old certificates. Connections
// hold the generation they started with (shared_ptr) for their whole life, so open connections are
// never disturbed by a reload; new handshakes get the new one. Every context speaks TLS 1.2 and
// 1.3 only, TLS 1.2 with forward-secret AEAD suites only (kTls12CipherList).
//
// With a ClientAuthConfig (the peer listener between sites), every chain also asks clients for a
// certificate and refuses the handshake unless one is presented that chains to the configured CA
// (mutual TLS).
//
// Session tickets are encrypted with one ring of keys per store, rotated hourly and shared by
// every generation (SessionTicketKeys), so tickets outlive a reload and no key lives for long.
//
// Threading: current() and reload() are thread-safe. A TlsGeneration is immutable and shareable.

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "tls/session_tickets.h"

namespace boost::asio::ssl {
class context;
}
struct ssl_ctx_st;  // OpenSSL's SSL_CTX.

namespace edge::tls {

// Drains this thread's OpenSSL error queue into one "; "-separated line ("unknown OpenSSL error"
// when it is empty), for messages about a failed OpenSSL call.
std::string openssl_errors();

// An OpenSSL pem_password_cb that never prompts: it gives no passphrase, so an encrypted PEM block
// fails to load at once. OpenSSL's default asks on the controlling terminal (and, without one,
// prints "Enter PEM pass phrase:" to stderr), which would block a reload thread for good. `asked`
// (userdata) is a bool* set to true when called, or null.
int refuse_pem_passphrase(char* buf, int size, int rwflag, void* asked);

// Loads the PEM private key at `path` into `ctx` and leaves refuse_pem_passphrase as the context's
// passphrase callback. An encrypted key is an error naming the file and saying how to decrypt it:
// the daemon has no way to be given a passphrase. So is a key file (symbolic links followed) that
// every user may read or write, named with its mode and the chmod that fixes it: such a key is
// no longer private. Group access is fine (0640 root:edgeserve is the packaged setup). Every
// context that loads a key goes through here, so `check-config` and the start refuse such a key
// and a reload that meets one keeps the old certificates, as with a key that does not match.
Status use_private_key_file(ssl_ctx_st* ctx, const std::string& path);

// The TLS 1.2 cipher suites every context offers and accepts (Mozilla's "intermediate" list less
// its DHE suites, for which no parameters are set): ECDHE key exchange, so a stolen key does not
// decrypt recorded sessions, and AEAD ciphers only (AES-GCM, ChaCha20-Poly1305), never CBC with
// SHA-1 or static-RSA key exchange. TLS 1.3 suites are left at OpenSSL's defaults, which already
// are all of that.
inline constexpr char kTls12CipherList[] =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

// Restricts `ctx`'s TLS 1.2 suites to kTls12CipherList; for server and client contexts alike.
Status use_forward_secret_ciphers(ssl_ctx_st* ctx);

// Whether the PEM file at `path` holds a certificate that may sign others (basicConstraints
// CA:TRUE), as a cluster CA file must: a site's own (leaf) certificate copied there would make
// every peer's handshake fail. False when the file cannot be read (its load reports that).
bool holds_ca_certificate(const std::string& path);

// The DNS subjectAltNames of `cert` (an X509*), in the certificate's order; empty when it has
// none.
std::vector<std::string> certificate_dns_names(const void* cert);

struct CertificateConfig {
    std::vector<std::string> server_names;  // SNI names served by this chain ("*.x.org" allowed).
    std::string cert_path;                  // PEM file: leaf certificate then intermediates.
    std::string key_path;                   // PEM file: the leaf's private key.

    bool operator==(const CertificateConfig&) const = default;
};

struct ClientAuthConfig {
    // PEM file of the CA(s) that client certificates must chain to; "" asks for no client
    // certificate (the public listener). Contexts that ask for one resume no sessions: every
    // handshake checks the certificate against this file as last loaded.
    std::string ca_path;
};

class TlsGeneration {
public:
    ~TlsGeneration();
    TlsGeneration(const TlsGeneration&) = delete;
    TlsGeneration& operator=(const TlsGeneration&) = delete;

    // The context a new connection starts with; SNI may move it to another chain's context.
    boost::asio::ssl::context& default_context() const;
    // Index of the chain serving `server_name`: the first chain listing it exactly, else the
    // first whose wildcard matches it, else the default chain, 0.
    size_t chain_for(std::string_view server_name) const;
    // The number of chains (at least one).
    size_t chain_count() const { return chains_.size(); }
    // The OpenSSL context of chain `chain` (< chain_count()).
    ssl_ctx_st* native_context(size_t chain) const;
    // What chain `chain` (< chain_count()) was loaded from: its SNI names and files.
    const CertificateConfig& certificate(size_t chain) const { return chains_[chain].config; }
    // The client CA file every chain requires client certificates to chain to ("" for none).
    const std::string& client_ca_path() const { return client_auth_.ca_path; }
    uint64_t number() const { return number_; }

private:
    friend class TlsContextStore;
    TlsGeneration() = default;

    struct Chain {
        CertificateConfig config;
        std::unique_ptr<boost::asio::ssl::context> context;
    };
    std::vector<Chain> chains_;
    ClientAuthConfig client_auth_;
    std::shared_ptr<SessionTicketKeys> tickets_;  // Installed on every chain's context.
    uint64_t number_ = 0;
};

class TlsContextStore {
public:
    // Loads every chain; any unreadable or mismatched file is an error naming it.
    // `tickets` sets how session ticket keys rotate.
    static Result<std::unique_ptr<TlsContextStore>> create(std::vector<CertificateConfig> certs,
                                                           ClientAuthConfig client_auth = {},
                                                           SessionTicketOptions tickets = {});

    std::shared_ptr<const TlsGeneration> current() const;
    const SessionTicketKeys& session_tickets() const { return *tickets_; }

    // Re-reads the same files. On error, the current generation stays and the error is returned.
    Status reload();
    // Builds a generation from `certs` and `client_auth` instead (a reloaded config that added,
    // removed or moved chains); only when every chain loads do they replace the configured ones
    // (later reload() calls read them). On error nothing changes and the error is returned.
    Status reload(std::vector<CertificateConfig> certs, ClientAuthConfig client_auth);
    // reload(certs, client_auth) in two steps, for a reload that must change this store only
    // together with something else (the peer listener with the forwarding client): prepare()
    // loads every chain and changes nothing (an error names the file); install() then serves
    // what it built, and its files become those later reload() calls read. Any thread.
    Result<std::shared_ptr<TlsGeneration>> prepare(const std::vector<CertificateConfig>& certs,
                                                   const ClientAuthConfig& client_auth) const;
    void install(std::shared_ptr<TlsGeneration> generation);

  private:
    TlsContextStore(std::vector<CertificateConfig> certs, ClientAuthConfig client_auth,
                    std::shared_ptr<SessionTicketKeys> tickets)
        : certs_(std::move(certs)),
          client_auth_(std::move(client_auth)),
          tickets_(std::move(tickets)) {}
    static Result<std::shared_ptr<TlsGeneration>> build(
        const std::vector<CertificateConfig>& certs, const ClientAuthConfig& client_auth,
        const std::shared_ptr<SessionTicketKeys>& tickets, uint64_t number);

    mutable std::mutex mu_;
    std::vector<CertificateConfig> certs_;  // Guarded by mu_.
    ClientAuthConfig client_auth_;          // Guarded by mu_.
    const std::shared_ptr<SessionTicketKeys> tickets_;
    std::shared_ptr<const TlsGeneration> current_;
    uint64_t next_number_ = 1;
};

}  // namespace edge::tls
