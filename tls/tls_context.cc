#include "tls/tls_context.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <boost/asio/ssl/context.hpp>

namespace edge::tls {
namespace {


bool name_matches(std::string_view pattern, std::string_view name) {
    auto lower_equal = [](std::string_view a, std::string_view b) {
        if (a.size() != b.size()) {
            return false;
        }
        for (size_t i = 0; i < a.size(); ++i) {
            char x = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] + 32) : a[i];
            char y = b[i] >= 'A' && b[i] <= 'Z' ? static_cast<char>(b[i] + 32) : b[i];
            if (x != y) {
                return false;
            }
        }
        return true;
    };
    if (pattern.size() > 2 && pattern.substr(0, 2) == "*.") {
        // "*.example.org" matches exactly one label in front of "example.org".
        size_t dot = name.find('.');
        if (dot == std::string_view::npos || dot == 0) {
            return false;
        }
        return lower_equal(pattern.substr(1), name.substr(dot));
    }
    return lower_equal(pattern, name);
}

int select_alpn(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
                unsigned int inlen, void*) {
    // Only HTTP/1.1 is spoken; a client offering only h2 proceeds without ALPN.
    static constexpr unsigned char kHttp11[] = {'h', 't', 't', 'p', '/', '1', '.', '1'};
    unsigned int i = 0;
    while (i < inlen) {
        unsigned int len = in[i];
        if (i + 1 + len > inlen) {
            break;
        }
        if (len == sizeof(kHttp11) && std::memcmp(in + i + 1, kHttp11, len) == 0) {
            *out = in + i + 1;
            *outlen = static_cast<unsigned char>(len);
            return SSL_TLSEXT_ERR_OK;
        }
        i += 1 + len;
    }
    return SSL_TLSEXT_ERR_NOACK;
}

// The host name of the ClientHello's server_name extension (RFC 6066 3), empty when there is
// none or it is malformed (OpenSSL's own parse refuses the latter afterwards).
std::string_view client_hello_server_name(SSL* ssl) {
    const unsigned char* p = nullptr;
    size_t len = 0;
    if (SSL_client_hello_get0_ext(ssl, TLSEXT_TYPE_server_name, &p, &len) != 1 || len < 2) {
        return {};
    }
    const size_t list = size_t{p[0]} << 8 | p[1];
    if (list != len - 2) {
        return {};
    }
    for (size_t at = 2; at + 3 <= len;) {
        const unsigned char type = p[at];
        const size_t name_len = size_t{p[at + 1]} << 8 | p[at + 2];
        if (at + 3 + name_len > len) {
            return {};
        }
        if (type == TLSEXT_NAMETYPE_host_name) {
            return {reinterpret_cast<const char*>(p + at + 3), name_len};
        }
        at += 3 + name_len;
    }
    return {};
}

// Moves the connection to the context of the chain serving its SNI name. It runs on the
// ClientHello, before the session it offers is looked up: the switch also gives the connection
// that chain's session id context (SSL_set_SSL_CTX), and a session or ticket is resumed only
// under the context it was made in, so a session begun under one name does not resume under a
// name another certificate serves (RFC 6066 3: a full handshake then). The servername callback
// runs after the session is chosen, too late for that.
int select_certificate(SSL* ssl, int*, void* arg) {
    const auto* generation = static_cast<const TlsGeneration*>(arg);
    const std::string_view name = client_hello_server_name(ssl);
    const size_t chain = name.empty() ? 0 : generation->chain_for(name);
    if (chain != 0) {
        // Safe: the generation outlives every connection that started with it.
        SSL_set_SSL_CTX(ssl, generation->native_context(chain));
    }
    return SSL_CLIENT_HELLO_SUCCESS;
}

// The session id context of the chain serving `names`: a session resumes only within one chain's
// names. Made from the names alone, so a chain whose certificate is renewed (or whose place in
// the list moves) keeps its sessions resumable.
std::array<unsigned char, SHA256_DIGEST_LENGTH> session_id_context(
    const std::vector<std::string>& names) {
    std::string joined = "edgeserve";
    for (const std::string& name : names) {
        joined += '\n';
        joined += name;
    }
    std::array<unsigned char, SHA256_DIGEST_LENGTH> digest{};
    SHA256(reinterpret_cast<const unsigned char*>(joined.data()), joined.size(), digest.data());
    return digest;
}

// Mutual TLS: ask for a client certificate, refuse the handshake without a valid one.
Status require_client_certificates(SSL_CTX* ctx, const std::string& ca_path) {
    if (SSL_CTX_load_verify_locations(ctx, ca_path.c_str(), nullptr) != 1) {
        return invalid_argument_error("cannot load client CA '" + ca_path +
                                      "': " + openssl_errors());
    }
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(ca_path.c_str());
    if (names == nullptr) {
        return invalid_argument_error("client CA '" + ca_path +
                                      "' holds no certificate: " + openssl_errors());
    }
    SSL_CTX_set_client_CA_list(ctx, names);  // Takes ownership.
    if (!holds_ca_certificate(ca_path)) {
        // A site's own (leaf) certificate, say: every peer's handshake would fail at run time.
        return invalid_argument_error("client CA '" + ca_path +
                                      "' holds no CA certificate (basicConstraints CA:TRUE); "
                                      "give the cluster CA's certificate, not a site's");
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    SSL_CTX_set_verify_depth(ctx, 4);
    // No resumption: a resumed session skips the client certificate's check and brings back the
    // verify result and certificate stored with it, and neither a CA removed from the file (a CA
    // rotation) nor the certificate's notAfter would end a client that resumes every few hours.
    // So no tickets (TLS 1.2 or 1.3) and no session cache: every handshake checks the
    // certificate against the CA file as loaded now. The sites' own forwarding client never
    // resumes, so this costs the cluster nothing.
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    return ok_status();
}

// A private key file that every user on the machine may read (or replace) is refused: the
// service needs it readable by its own user or group only. stat() follows symbolic links, so
// certbot's live/ links are judged by the archive file they point to. A file that cannot be
// stat'ed is left to the load, which names it.
Status check_private_key_permissions(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        return ok_status();
    }
    const bool readable = (st.st_mode & S_IROTH) != 0;
    const bool writable = (st.st_mode & S_IWOTH) != 0;
    if (!readable && !writable) {
        return ok_status();
    }
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    std::string file = "'" + path + "'";
    std::error_code ec;
    const std::filesystem::path target = std::filesystem::canonical(path, ec);
    if (!ec && target != std::filesystem::path(path)) {
        file += " (-> '" + target.string() + "')";
    }
    const char* who = readable && writable ? "readable and writable"
                      : readable           ? "readable"
                                           : "writable";
    return failed_precondition_error(
        "private key " + file + " is " + who + " by every user on this machine (mode " + mode +
        "); make it private to the service: chmod 0640 '" + path +
        "' with group edgeserve (chgrp edgeserve), or chmod 0600 when the service user owns it");
}

}  // namespace

std::vector<std::string> certificate_dns_names(const void* cert) {
    std::vector<std::string> names;
    auto* sans = static_cast<GENERAL_NAMES*>(
        X509_get_ext_d2i(static_cast<const X509*>(cert), NID_subject_alt_name, nullptr, nullptr));
    if (sans == nullptr) {
        return names;
    }
    for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
        const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
        if (g->type != GEN_DNS) {
            continue;
        }
        const unsigned char* data = ASN1_STRING_get0_data(g->d.dNSName);
        const int len = ASN1_STRING_length(g->d.dNSName);
        if (data != nullptr && len > 0) {
            names.emplace_back(reinterpret_cast<const char*>(data), static_cast<size_t>(len));
        }
    }
    GENERAL_NAMES_free(sans);
    return names;
}

bool holds_ca_certificate(const std::string& path) {
    BIO* bio = BIO_new_file(path.c_str(), "r");
    if (bio == nullptr) {
        ERR_clear_error();
        return false;
    }
    bool found = false;
    while (X509* cert = PEM_read_bio_X509(bio, nullptr, refuse_pem_passphrase, nullptr)) {
        found = X509_check_ca(cert) > 0;
        X509_free(cert);
        if (found) {
            break;
        }
    }
    ERR_clear_error();  // The read that ended the loop.
    BIO_free(bio);
    return found;
}

std::string openssl_errors() {
    std::string out;
    while (unsigned long e = ERR_get_error()) {
        char buf[256];
        ERR_error_string_n(e, buf, sizeof(buf));
        if (!out.empty()) {
            out += "; ";
        }
        out += buf;
    }
    return out.empty() ? "unknown OpenSSL error" : out;
}

int refuse_pem_passphrase(char*, int, int, void* asked) {
    if (asked != nullptr) {
        *static_cast<bool*>(asked) = true;
    }
    return 0;
}

Status use_private_key_file(SSL_CTX* ctx, const std::string& path) {
    EDGE_RETURN_IF_ERROR(check_private_key_permissions(path));
    bool asked = false;
    SSL_CTX_set_default_passwd_cb(ctx, refuse_pem_passphrase);
    SSL_CTX_set_default_passwd_cb_userdata(ctx, &asked);
    const int loaded = SSL_CTX_use_PrivateKey_file(ctx, path.c_str(), SSL_FILETYPE_PEM);
    // Never left set: Asio's ssl::context deletes a non-null userdata as its own callback object.
    SSL_CTX_set_default_passwd_cb_userdata(ctx, nullptr);
    if (loaded == 1) {
        return ok_status();
    }
    if (asked) {
        ERR_clear_error();
        return invalid_argument_error(
            "private key '" + path +
            "' is encrypted (passphrase-protected), which is not supported: decrypt it "
            "(e.g. openssl pkey -in '" +
            path + "' -out decrypted.key) and keep the file readable by the service user only");
    }
    return invalid_argument_error("cannot load private key '" + path + "': " + openssl_errors());
}

Status use_forward_secret_ciphers(SSL_CTX* ctx) {
    if (SSL_CTX_set_cipher_list(ctx, kTls12CipherList) != 1) {
        return internal_error("cannot set the TLS 1.2 cipher list: " + openssl_errors());
    }
    return ok_status();
}

TlsGeneration::~TlsGeneration() = default;

boost::asio::ssl::context& TlsGeneration::default_context() const { return *chains_[0].context; }

size_t TlsGeneration::chain_for(std::string_view server_name) const {
    // An exact name wins over a wildcard wherever the chains list them: "*.example.org" on an
    // earlier chain must not hide a later chain made for "api.example.org".
    for (const bool wildcards : {false, true}) {
        for (size_t i = 0; i < chains_.size(); ++i) {
            for (const std::string& pattern : chains_[i].config.server_names) {
                const bool wildcard = pattern.size() > 2 && pattern.starts_with("*.");
                if (wildcard == wildcards && name_matches(pattern, server_name)) {
                    return i;
                }
            }
        }
    }
    return 0;
}

SSL_CTX* TlsGeneration::native_context(size_t chain) const {
    return chains_[chain].context->native_handle();
}

Result<std::unique_ptr<TlsContextStore>> TlsContextStore::create(
    std::vector<CertificateConfig> certs, ClientAuthConfig client_auth,
    SessionTicketOptions tickets) {
    if (certs.empty()) {
        return invalid_argument_error("no certificates configured for the TLS listener");
    }
    EDGE_ASSIGN_OR_RETURN(std::shared_ptr<SessionTicketKeys> keys,
                          SessionTicketKeys::create(std::move(tickets)));
    std::unique_ptr<TlsContextStore> store(
        new TlsContextStore(std::move(certs), std::move(client_auth), std::move(keys)));
    EDGE_ASSIGN_OR_RETURN(std::shared_ptr<TlsGeneration> generation,
                          build(store->certs_, store->client_auth_, store->tickets_, 1));
    store->current_ = std::move(generation);
    store->next_number_ = 2;
    return store;
}

std::shared_ptr<const TlsGeneration> TlsContextStore::current() const {
    std::lock_guard lock(mu_);
    return current_;
}

Status TlsContextStore::reload() {
    std::vector<CertificateConfig> certs;
    ClientAuthConfig client_auth;
    {
        std::lock_guard lock(mu_);
        certs = certs_;
        client_auth = client_auth_;
    }
    return reload(std::move(certs), std::move(client_auth));
}

Status TlsContextStore::reload(std::vector<CertificateConfig> certs, ClientAuthConfig client_auth) {
    EDGE_ASSIGN_OR_RETURN(std::shared_ptr<TlsGeneration> generation,
                          prepare(certs, client_auth));
    install(std::move(generation));
    return ok_status();
}

Result<std::shared_ptr<TlsGeneration>> TlsContextStore::prepare(
    const std::vector<CertificateConfig>& certs, const ClientAuthConfig& client_auth) const {
    if (certs.empty()) {
        return invalid_argument_error("no certificates configured for the TLS listener");
    }
    return build(certs, client_auth, tickets_, 0);
}

void TlsContextStore::install(std::shared_ptr<TlsGeneration> generation) {
    std::vector<CertificateConfig> certs;
    for (const TlsGeneration::Chain& chain : generation->chains_) {
        certs.push_back(chain.config);
    }
    std::lock_guard lock(mu_);
    // Numbered as it is installed: a reload that fails takes no number, so generations count
    // the certificates actually served, and the log's kept_generation is the last one.
    generation->number_ = next_number_++;
    certs_ = std::move(certs);
    client_auth_ = generation->client_auth_;
    current_ = std::move(generation);
}

Result<std::shared_ptr<TlsGeneration>> TlsContextStore::build(
    const std::vector<CertificateConfig>& certs, const ClientAuthConfig& client_auth,
    const std::shared_ptr<SessionTicketKeys>& tickets, uint64_t number) {
    std::shared_ptr<TlsGeneration> generation(new TlsGeneration());
    generation->number_ = number;
    generation->client_auth_ = client_auth;
    generation->tickets_ = tickets;
    ERR_clear_error();
    for (const CertificateConfig& cert : certs) {
        auto context = std::make_unique<boost::asio::ssl::context>(
            boost::asio::ssl::context::tls_server);
        SSL_CTX* ctx = context->native_handle();
        SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
        SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                     SSL_OP_NO_COMPRESSION);
        EDGE_RETURN_IF_ERROR(use_forward_secret_ciphers(ctx));
        // Idle connections keep no TLS buffers, so many of them cost little memory.
        SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
        const auto sid_context = session_id_context(cert.server_names);
        SSL_CTX_set_session_id_context(ctx, sid_context.data(), sid_context.size());
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
        SSL_CTX_sess_set_cache_size(ctx, 20000);
        EDGE_RETURN_IF_ERROR(tickets->install(ctx));
        SSL_CTX_set_alpn_select_cb(ctx, select_alpn, nullptr);
        // Before the chain too: its PEM blocks are read with the context's passphrase callback.
        SSL_CTX_set_default_passwd_cb(ctx, refuse_pem_passphrase);
        if (SSL_CTX_use_certificate_chain_file(ctx, cert.cert_path.c_str()) != 1) {
            return invalid_argument_error("cannot load certificate chain '" + cert.cert_path +
                                          "': " + openssl_errors());
        }
        EDGE_RETURN_IF_ERROR(use_private_key_file(ctx, cert.key_path));
        if (SSL_CTX_check_private_key(ctx) != 1) {
            return invalid_argument_error("private key '" + cert.key_path +
                                          "' does not match certificate '" + cert.cert_path +
                                          "': " + openssl_errors());
        }
        if (!client_auth.ca_path.empty()) {
            EDGE_RETURN_IF_ERROR(require_client_certificates(ctx, client_auth.ca_path));
        }
        generation->chains_.push_back(TlsGeneration::Chain{cert, std::move(context)});
    }
    SSL_CTX* default_ctx = generation->chains_[0].context->native_handle();
    SSL_CTX_set_client_hello_cb(default_ctx, select_certificate, generation.get());
    return generation;
}

}  // namespace edge::tls
