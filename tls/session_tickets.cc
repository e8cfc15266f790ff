#include "tls/session_tickets.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cstring>

#include "tls/tls_context.h"

namespace edge::tls {
namespace {

// The SSL_CTX slot holding the SessionTicketKeys* the callback reads.
int keys_index() {
    static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
    return index;
}

int ticket_callback(SSL* ssl, unsigned char name[16], unsigned char iv[EVP_MAX_IV_LENGTH],
                    EVP_CIPHER_CTX* cipher_ctx, EVP_MAC_CTX* mac_ctx, int encrypt) {
    // OpenSSL calls this on the context the handshake began with; every context of a store
    // holds the same keys, so an SNI switch in between changes nothing.
    auto* keys =
        static_cast<SessionTicketKeys*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), keys_index()));
    if (keys == nullptr) {
        return -1;
    }
    return keys->on_ticket(name, iv, cipher_ctx, mac_ctx, encrypt != 0);
}

}  // namespace

Result<std::shared_ptr<SessionTicketKeys>> SessionTicketKeys::create(SessionTicketOptions options) {
    if (options.rotation <= std::chrono::seconds::zero() ||
        options.lifetime <= std::chrono::seconds::zero()) {
        return invalid_argument_error(
            "session ticket rotation and lifetime must be positive durations");
    }
    std::shared_ptr<SessionTicketKeys> keys(new SessionTicketKeys(std::move(options)));
    std::lock_guard lock(keys->mu_);
    EDGE_RETURN_IF_ERROR(keys->add_key(keys->now()));
    return keys;
}

SessionTicketKeys::SessionTicketKeys(SessionTicketOptions options) : options_(std::move(options)) {}

SessionTicketKeys::~SessionTicketKeys() {
    for (Key& key : keys_) {
        OPENSSL_cleanse(&key, sizeof(key));
    }
}

SessionTicketKeys::TimePoint SessionTicketKeys::now() const {
    return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
}

Status SessionTicketKeys::add_key(TimePoint now) {
    Key key;
    if (RAND_bytes(key.name.data(), key.name.size()) != 1 ||
        RAND_bytes(key.aes.data(), key.aes.size()) != 1 ||
        RAND_bytes(key.hmac.data(), key.hmac.size()) != 1) {
        OPENSSL_cleanse(&key, sizeof(key));
        return internal_error("cannot make a session ticket key: " + openssl_errors());
    }
    key.made = now;
    keys_.push_front(key);
    OPENSSL_cleanse(&key, sizeof(key));
    ++made_;
    return ok_status();
}

Status SessionTicketKeys::refresh(TimePoint now) {
    // Oldest last: a key's tickets were all made before made + rotation, and each expires
    // `lifetime` after it was made.
    while (!keys_.empty() && now - keys_.back().made >= options_.rotation + options_.lifetime) {
        OPENSSL_cleanse(&keys_.back(), sizeof(Key));
        keys_.pop_back();
    }
    if (keys_.empty() || now - keys_.front().made >= options_.rotation) {
        return add_key(now);
    }
    return ok_status();
}

int SessionTicketKeys::on_ticket(unsigned char name[16], unsigned char* iv, void* cipher_ctx,
                                 void* mac_ctx, bool encrypt) {
    std::lock_guard lock(mu_);
    if (!refresh(now()).ok() && (keys_.empty() || encrypt)) {
        // No random bytes for a new key: never a ticket under an overdue one.
        return -1;
    }
    const Key* key = nullptr;
    int use = 1;
    if (encrypt) {
        key = &keys_.front();
        if (RAND_bytes(iv, EVP_CIPHER_get_iv_length(EVP_aes_256_cbc())) != 1) {
            return -1;
        }
        std::memcpy(name, key->name.data(), key->name.size());
    } else {
        auto found = std::find_if(keys_.begin(), keys_.end(), [&](const Key& k) {
            return CRYPTO_memcmp(k.name.data(), name, k.name.size()) == 0;
        });
        if (found == keys_.end()) {
            return 0;
        }
        key = &*found;
        use = found == keys_.begin() ? 1 : 2;
    }
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_octet_string(
            OSSL_MAC_PARAM_KEY, const_cast<unsigned char*>(key->hmac.data()), key->hmac.size()),
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, const_cast<char*>("SHA256"), 0),
        OSSL_PARAM_construct_end(),
    };
    if (EVP_MAC_CTX_set_params(static_cast<EVP_MAC_CTX*>(mac_ctx), params) != 1) {
        return -1;
    }
    auto* cipher = static_cast<EVP_CIPHER_CTX*>(cipher_ctx);
    const int initialized =
        encrypt ? EVP_EncryptInit_ex(cipher, EVP_aes_256_cbc(), nullptr, key->aes.data(), iv)
                : EVP_DecryptInit_ex(cipher, EVP_aes_256_cbc(), nullptr, key->aes.data(), iv);
    return initialized == 1 ? use : -1;
}

Status SessionTicketKeys::install(ssl_ctx_st* ctx) {
    if (SSL_CTX_set_ex_data(ctx, keys_index(), this) != 1 ||
        SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, ticket_callback) != 1) {
        return internal_error("cannot install the session ticket keys: " + openssl_errors());
    }
    SSL_CTX_set_timeout(ctx, static_cast<long>(options_.lifetime.count()));
    return ok_status();
}

uint64_t SessionTicketKeys::keys_made() const {
    std::lock_guard lock(mu_);
    return made_;
}

size_t SessionTicketKeys::keys_held() const {
    std::lock_guard lock(mu_);
    return keys_.size();
}

}  // namespace edge::tls
