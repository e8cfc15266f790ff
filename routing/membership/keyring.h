#pragma once

// Keyring holds the AES-256 keys of the gossip cluster: one primary key that encrypts everything
// sent, and older keys still accepted on receipt, so keys rotate without downtime (add the new key
// everywhere, make it primary everywhere, then remove the old one). seal()/open() wrap a plaintext
// packet or stream frame in AES-256-GCM (OpenSSL EVP) with a fresh random 96-bit nonce and the
// cluster label as additional authenticated data, so a packet of another cluster or a tampered
// one fails authentication and is never parsed. With an empty keyring packets travel in clear,
// prefixed with the label, which is still checked.
// Not synchronized: the membership strand owns the keyring; mutate it only there.

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/status.h"

namespace edge::routing::membership {

using GossipKey = std::array<uint8_t, 32>;

// Parses 64 hex digits.
Result<GossipKey> parse_gossip_key(std::string_view hex);

class Keyring {
public:
    Keyring() = default;
    // The first key is the primary one. Duplicate keys are rejected.
    static Result<Keyring> create(std::vector<GossipKey> keys);

    bool empty() const { return keys_.empty(); }
    const std::vector<GossipKey>& keys() const { return keys_; }

    // Adds an accepted key (no-op if present).
    void add_key(const GossipKey& key);
    // Makes an installed key the primary one.
    [[nodiscard]] Status use_key(const GossipKey& key);
    // Removes a key that is not the primary one.
    [[nodiscard]] Status remove_key(const GossipKey& key);

    // Encrypts with the primary key (or frames in clear when empty).
    Result<std::vector<uint8_t>> seal(std::string_view label,
                                      std::span<const uint8_t> plaintext) const;
    // Authenticates and decrypts with any key; kUnauthenticated when none fits or the label or
    // mode differs, kDataLoss when too short.
    Result<std::vector<uint8_t>> open(std::string_view label,
                                      std::span<const uint8_t> sealed) const;

    // Bytes seal() adds to a plaintext.
    size_t overhead(std::string_view label) const;

private:
    std::vector<GossipKey> keys_;
};

}  // namespace edge::routing::membership
