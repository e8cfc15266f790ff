#pragma once

// Lower-case hexadecimal text of bytes (digests, random tags). Pure.

#include <span>
#include <string>

namespace edge {

std::string to_hex(std::span<const unsigned char> bytes);

}  // namespace edge
