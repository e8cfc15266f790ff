#pragma once

// Unicode normalisation applied to text before pre-tokenization, as `tokenizer.json`'s
// `normalizer` asks (today: none or NFC, through ICU). Immutable after construction and
// thread-safe.

#include <string>
#include <string_view>

#include "common/result.h"

namespace edge::engine::tokenizer {

enum class NormalizerKind { kNone, kNfc };

class Normalizer {
public:
    explicit Normalizer(NormalizerKind kind = NormalizerKind::kNone) : kind_(kind) {}

    NormalizerKind kind() const { return kind_; }

    // The normalised form of valid UTF-8 `text`; kInvalidArgument when ICU rejects it.
    Result<std::string> normalize(std::string_view text) const;

private:
    NormalizerKind kind_;
};

}  // namespace edge::engine::tokenizer
