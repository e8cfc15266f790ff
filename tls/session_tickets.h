#pragma once

// SessionTicketKeys: the keys that encrypt the server's TLS session tickets, made in memory and
// rotated on a schedule. OpenSSL's own ticket key is made once per context and kept for the
// context's life, and contexts live until their certificate files change (weeks or months):
// whoever reads that one key out of the process can decrypt every TLS 1.2 session resumed with a
// ticket in all that time, and every connection's traffic keys are derived from the ticket's
// master secret. With a ring of keys, the key that encrypts new tickets is replaced every
// `rotation`, and the previous ones are kept only as long as a ticket they made can still be
// valid, then erased; so a key taken from memory opens at most the tickets of the last few
// hours. A ticket made by a key that is no longer the newest resumes and is replaced by one made
// with the newest.
//
// One ring serves every context of a TlsContextStore, across reloads: a new certificate keeps the
// tickets handed out under the old one resumable (OpenSSL's per-context key lost them all).
// Contexts that require client certificates (the peer listener) issue and accept no tickets at
// all (see require_client_certificates in tls_context.cc).
//
// Threading: the OpenSSL callback runs on every I/O thread; the ring is guarded by a mutex (one
// short critical section per full handshake or resumption).

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "common/result.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX.

namespace edge::tls {

struct SessionTicketOptions {
    // How long a key makes new tickets before the next one takes over.
    std::chrono::seconds rotation{std::chrono::hours(1)};
    // How long a ticket (and a cached TLS 1.2 session) may be resumed: the lifetime hint sent to
    // clients and the session timeout OpenSSL applies. A key is kept until every ticket it made
    // has expired, so a key lives rotation + lifetime in all.
    std::chrono::seconds lifetime{std::chrono::hours(2)};
    // The time keys are rotated by; steady_clock::now when empty (tests move it by hand).
    std::function<std::chrono::steady_clock::time_point()> clock;
};

class SessionTicketKeys {
  public:
    // Makes the first key. Fails when a lifetime or rotation is not positive, or when OpenSSL
    // gives no random bytes.
    static Result<std::shared_ptr<SessionTicketKeys>> create(SessionTicketOptions options = {});
    ~SessionTicketKeys();
    SessionTicketKeys(const SessionTicketKeys&) = delete;
    SessionTicketKeys& operator=(const SessionTicketKeys&) = delete;

    // Makes `ctx` (a server context) encrypt and decrypt its tickets with these keys and time out
    // sessions after the lifetime. The keys must outlive the context: the caller keeps a
    // shared_ptr beside it.
    Status install(ssl_ctx_st* ctx);

    // Keys made so far (1 after create), and keys held (made and not expired when the last ticket
    // was made or read; expired keys are erased then).
    uint64_t keys_made() const;
    size_t keys_held() const;

    // The OpenSSL ticket callback's work (public for the C callback only): the key for a new
    // ticket (`encrypt`), or the key named `name`. Returns 1 (use it), 2 (use it and issue a new
    // ticket: the key is no longer the newest), 0 (unknown or expired key: full handshake), or
    // -1 (an OpenSSL failure).
    int on_ticket(unsigned char name[16], unsigned char* iv, void* cipher_ctx, void* mac_ctx,
                  bool encrypt);

  private:
    using TimePoint = std::chrono::steady_clock::time_point;
    struct Key {
        std::array<unsigned char, 16> name;
        std::array<unsigned char, 32> aes;
        std::array<unsigned char, 32> hmac;
        TimePoint made;
    };

    explicit SessionTicketKeys(SessionTicketOptions options);
    TimePoint now() const;
    // Makes a new newest key when the newest is `rotation` old and erases keys whose tickets have
    // all expired. Called with mu_ held.
    Status refresh(TimePoint now);
    Status add_key(TimePoint now);

    SessionTicketOptions options_;
    mutable std::mutex mu_;
    std::deque<Key> keys_;  // Newest first. Guarded by mu_.
    uint64_t made_ = 0;     // Guarded by mu_.
};

}  // namespace edge::tls
