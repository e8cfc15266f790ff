#include "daemon/bearer.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>

namespace edge::daemon {

Sha256Digest sha256(std::string_view data) {
    Sha256Digest out{};
    unsigned int len = 0;
    EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr);
    return out;
}

std::optional<std::string_view> bearer_credentials(std::string_view authorization) {
    // The scheme is case-insensitive (RFC 7235 2.1): "Bearer", "bearer" and "BEARER" all work.
    constexpr std::string_view kBearer = "bearer ";
    if (authorization.size() <= kBearer.size() ||
        !std::equal(kBearer.begin(), kBearer.end(), authorization.begin(), [](char a, char b) {
            return a == std::tolower(static_cast<unsigned char>(b));
        })) {
        return std::nullopt;
    }
    std::string_view credentials = authorization.substr(kBearer.size());
    while (!credentials.empty() && credentials.front() == ' ') {
        credentials.remove_prefix(1);
    }
    if (credentials.empty()) {
        return std::nullopt;
    }
    return credentials;
}

bool digests_equal(const Sha256Digest& a, const Sha256Digest& b) {
    return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace edge::daemon
