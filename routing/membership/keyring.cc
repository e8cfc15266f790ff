#include "routing/membership/keyring.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <memory>

namespace edge::routing::membership {
namespace {

constexpr uint8_t kClearMode = 0;
constexpr uint8_t kAesGcmMode = 1;
constexpr size_t kNonceSize = 12;
constexpr size_t kTagSize = 16;

struct CtxFree {
    void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using CtxPtr = std::unique_ptr<EVP_CIPHER_CTX, CtxFree>;

bool decrypt_with(const GossipKey& key, std::string_view label, std::span<const uint8_t> nonce,
                  std::span<const uint8_t> ciphertext, std::span<const uint8_t> tag,
                  std::vector<uint8_t>& out) {
    CtxPtr ctx(EVP_CIPHER_CTX_new());
    if (!ctx) {
        return false;
    }
    int len = 0;
    out.resize(ciphertext.size());
    if (EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, kNonceSize, nullptr) != 1 ||
        EVP_DecryptInit_ex(ctx.get(), nullptr, nullptr, key.data(), nonce.data()) != 1) {
        return false;
    }
    if (!label.empty() &&
        EVP_DecryptUpdate(ctx.get(), nullptr, &len, reinterpret_cast<const uint8_t*>(label.data()),
                          static_cast<int>(label.size())) != 1) {
        return false;
    }
    if (!ciphertext.empty() &&
        EVP_DecryptUpdate(ctx.get(), out.data(), &len, ciphertext.data(),
                          static_cast<int>(ciphertext.size())) != 1) {
        return false;
    }
    if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagSize,
                            const_cast<uint8_t*>(tag.data())) != 1) {
        return false;
    }
    int final_len = 0;
    return EVP_DecryptFinal_ex(ctx.get(), out.data() + ciphertext.size(), &final_len) == 1;
}

}  // namespace

Result<GossipKey> parse_gossip_key(std::string_view hex) {
    if (hex.size() != 64) {
        return invalid_argument_error("gossip key must be 64 hex digits, got " +
                                      std::to_string(hex.size()) + " characters");
    }
    GossipKey key{};
    auto nibble = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    for (size_t i = 0; i < 32; ++i) {
        const int hi = nibble(hex[2 * i]);
        const int lo = nibble(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return invalid_argument_error("gossip key has a non-hex character at position " +
                                          std::to_string(hi < 0 ? 2 * i : 2 * i + 1));
        }
        key[i] = static_cast<uint8_t>(hi * 16 + lo);
    }
    return key;
}

Result<Keyring> Keyring::create(std::vector<GossipKey> keys) {
    for (size_t i = 0; i < keys.size(); ++i) {
        for (size_t j = i + 1; j < keys.size(); ++j) {
            if (keys[i] == keys[j]) {
                return invalid_argument_error("keyring: key " + std::to_string(j) +
                                              " duplicates key " + std::to_string(i));
            }
        }
    }
    Keyring k;
    k.keys_ = std::move(keys);
    return k;
}

void Keyring::add_key(const GossipKey& key) {
    if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) {
        keys_.push_back(key);
    }
}

Status Keyring::use_key(const GossipKey& key) {
    auto it = std::find(keys_.begin(), keys_.end(), key);
    if (it == keys_.end()) {
        return not_found_error("keyring: cannot use a key that is not installed");
    }
    std::rotate(keys_.begin(), it, it + 1);
    return ok_status();
}

Status Keyring::remove_key(const GossipKey& key) {
    auto it = std::find(keys_.begin(), keys_.end(), key);
    if (it == keys_.end()) {
        return not_found_error("keyring: key to remove is not installed");
    }
    if (it == keys_.begin()) {
        return failed_precondition_error("keyring: cannot remove the primary key");
    }
    keys_.erase(it);
    return ok_status();
}

size_t Keyring::overhead(std::string_view label) const {
    return keys_.empty() ? 2 + label.size() : 1 + kNonceSize + kTagSize;
}

Result<std::vector<uint8_t>> Keyring::seal(std::string_view label,
                                           std::span<const uint8_t> plaintext) const {
    std::vector<uint8_t> out;
    if (keys_.empty()) {
        out.reserve(2 + label.size() + plaintext.size());
        out.push_back(kClearMode);
        out.push_back(static_cast<uint8_t>(label.size()));
        out.insert(out.end(), label.begin(), label.end());
        out.insert(out.end(), plaintext.begin(), plaintext.end());
        return out;
    }
    out.resize(1 + kNonceSize + plaintext.size() + kTagSize);
    out[0] = kAesGcmMode;
    uint8_t* nonce = out.data() + 1;
    if (RAND_bytes(nonce, kNonceSize) != 1) {
        return internal_error("keyring: RAND_bytes failed for a nonce");
    }
    CtxPtr ctx(EVP_CIPHER_CTX_new());
    int len = 0;
    if (!ctx ||
        EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, kNonceSize, nullptr) != 1 ||
        EVP_EncryptInit_ex(ctx.get(), nullptr, nullptr, keys_.front().data(), nonce) != 1) {
        return internal_error("keyring: AES-256-GCM init failed");
    }
    if (!label.empty() &&
        EVP_EncryptUpdate(ctx.get(), nullptr, &len, reinterpret_cast<const uint8_t*>(label.data()),
                          static_cast<int>(label.size())) != 1) {
        return internal_error("keyring: AES-256-GCM AAD failed");
    }
    uint8_t* ct = out.data() + 1 + kNonceSize;
    if (!plaintext.empty() && EVP_EncryptUpdate(ctx.get(), ct, &len, plaintext.data(),
                                                static_cast<int>(plaintext.size())) != 1) {
        return internal_error("keyring: AES-256-GCM encrypt failed");
    }
    int final_len = 0;
    if (EVP_EncryptFinal_ex(ctx.get(), ct + plaintext.size(), &final_len) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagSize,
                            ct + plaintext.size()) != 1) {
        return internal_error("keyring: AES-256-GCM finalize failed");
    }
    return out;
}

Result<std::vector<uint8_t>> Keyring::open(std::string_view label,
                                           std::span<const uint8_t> sealed) const {
    if (sealed.empty()) {
        return data_loss_error("gossip packet is empty");
    }
    if (keys_.empty()) {
        if (sealed[0] != kClearMode) {
            return unauthenticated_error("gossip packet is encrypted but no key is configured");
        }
        if (sealed.size() < 2 || sealed.size() - 2 < sealed[1]) {
            return data_loss_error("gossip packet truncated in its label");
        }
        const std::string_view got(reinterpret_cast<const char*>(sealed.data() + 2), sealed[1]);
        if (got != label) {
            return unauthenticated_error("gossip packet carries another cluster label");
        }
        return std::vector<uint8_t>(sealed.begin() + 2 + sealed[1], sealed.end());
    }
    if (sealed[0] != kAesGcmMode) {
        return unauthenticated_error("gossip packet is not encrypted but encryption is required");
    }
    if (sealed.size() < 1 + kNonceSize + kTagSize) {
        return data_loss_error("encrypted gossip packet shorter than nonce and tag");
    }
    const auto nonce = sealed.subspan(1, kNonceSize);
    const auto ciphertext = sealed.subspan(1 + kNonceSize, sealed.size() - 1 - kNonceSize - kTagSize);
    const auto tag = sealed.subspan(sealed.size() - kTagSize);
    std::vector<uint8_t> out;
    for (const GossipKey& key : keys_) {
        if (decrypt_with(key, label, nonce, ciphertext, tag, out)) {
            return out;
        }
    }
    return unauthenticated_error("gossip packet failed authentication with every installed key");
}

}  // namespace edge::routing::membership
