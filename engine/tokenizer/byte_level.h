#pragma once

// The GPT-2 byte-level mapping used by byte-level BPE vocabularies: each of the 256 byte values
// is written as one printable Unicode character (printable Latin-1 bytes map to themselves, the
// rest to U+0100 onwards in byte order), so `tokenizer.json` can store arbitrary bytes as text.
// Pure functions over constant tables; thread-safe.

#include <string>
#include <string_view>

#include "common/result.h"

namespace edge::engine::tokenizer {

// The mapped (UTF-8) form of raw `bytes`.
std::string bytes_to_unicode(std::string_view bytes);

// The raw bytes of a mapped string; kInvalidArgument when it holds invalid UTF-8 or a character
// outside the mapping.
Result<std::string> unicode_to_bytes(std::string_view mapped);

}  // namespace edge::engine::tokenizer
