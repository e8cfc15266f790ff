#include "engine/sched/prefix_hash.h"

#include <openssl/evp.h>

#include <algorithm>

#include "common/check.h"

namespace edge::engine::sched {

BlockHash tenant_salt(std::string_view secret, std::string_view tenant) {
    static constexpr std::string_view kDomain = "edgeserve prefix salt";
    const uint64_t secret_len = secret.size();  // Length-prefixed: no ambiguity at the seam.
    BlockHash out;
    unsigned int len = 0;
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    EDGE_CHECK(ctx != nullptr);
    EDGE_CHECK(EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1 &&
               EVP_DigestUpdate(ctx, kDomain.data(), kDomain.size()) == 1 &&
               EVP_DigestUpdate(ctx, &secret_len, sizeof(secret_len)) == 1 &&
               EVP_DigestUpdate(ctx, secret.data(), secret.size()) == 1 &&
               EVP_DigestUpdate(ctx, tenant.data(), tenant.size()) == 1 &&
               EVP_DigestFinal_ex(ctx, out.data(), &len) == 1);
    EVP_MD_CTX_free(ctx);
    return out;
}

std::vector<BlockHash> prefix_chain(std::span<const TokenId> tokens, int32_t block_tokens,
                                    const BlockHash& salt, size_t max_blocks) {
    std::vector<BlockHash> chain;
    if (block_tokens <= 0) {
        return chain;
    }
    const size_t bt = static_cast<size_t>(block_tokens);
    const size_t n = std::min(tokens.size() / bt, max_blocks);
    chain.reserve(n);
    BlockHash parent{};
    std::vector<uint8_t> bytes(bt * 4);
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    EDGE_CHECK(ctx != nullptr);
    for (size_t b = 0; b < n; ++b) {
        for (size_t i = 0; i < bt; ++i) {
            const uint32_t t = static_cast<uint32_t>(tokens[b * bt + i]);
            bytes[i * 4] = static_cast<uint8_t>(t);
            bytes[i * 4 + 1] = static_cast<uint8_t>(t >> 8);
            bytes[i * 4 + 2] = static_cast<uint8_t>(t >> 16);
            bytes[i * 4 + 3] = static_cast<uint8_t>(t >> 24);
        }
        BlockHash h;
        unsigned int len = 0;
        EDGE_CHECK(EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1 &&
                   EVP_DigestUpdate(ctx, parent.data(), parent.size()) == 1 &&
                   EVP_DigestUpdate(ctx, bytes.data(), bytes.size()) == 1 &&
                   EVP_DigestUpdate(ctx, salt.data(), salt.size()) == 1 &&
                   EVP_DigestFinal_ex(ctx, h.data(), &len) == 1);
        chain.push_back(h);
        parent = h;
    }
    EVP_MD_CTX_free(ctx);
    return chain;
}

}  // namespace edge::engine::sched
