#pragma once

// Bearer credentials (RFC 6750) as the public listener's tenant keys and the admin listener's
// token are sent: `Authorization: Bearer <credentials>`, the scheme in any case. Compared by their
// SHA-256 digests with CRYPTO_memcmp, so neither the time nor a stored copy gives the secret away.

#include <array>
#include <optional>
#include <string_view>

namespace edge::daemon {

using Sha256Digest = std::array<unsigned char, 32>;

Sha256Digest sha256(std::string_view data);

// The credentials of an `Authorization` value ("Bearer abc" -> "abc", spaces after the scheme
// skipped), or nullopt when it is not a bearer value or holds nothing after the scheme.
std::optional<std::string_view> bearer_credentials(std::string_view authorization);

// Whether two digests are equal, in time independent of where they differ.
bool digests_equal(const Sha256Digest& a, const Sha256Digest& b);

}  // namespace edge::daemon
