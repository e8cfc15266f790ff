#include "engine/tokenizer/incremental_decoder.h"

#include <algorithm>

#include "engine/tokenizer/utf8.h"

namespace edge::engine::tokenizer {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
}  // namespace

bool IncrementalDecoder::shows(TokenId id) const {
    return !skip_special_ || !tokenizer_->is_special(id) ||
           std::find(kept_special_.begin(), kept_special_.end(), id) != kept_special_.end();
}

std::string IncrementalDecoder::push(TokenId id) {
    if (!shows(id)) {
        return {};
    }
    return push_bytes(tokenizer_->token_bytes(id));
}

std::string IncrementalDecoder::push_bytes(std::string_view bytes) {
    pending_.append(bytes);
    std::string out;
    size_t pos = 0;
    while (pos < pending_.size()) {
        std::string_view rest = std::string_view(pending_).substr(pos);
        const size_t n = utf8_valid_sequence(rest);
        if (n > 0) {
            out.append(rest.substr(0, n));
            pos += n;
            continue;
        }
        if (utf8_incomplete_prefix(rest)) {
            break;  // Wait for the next token to complete it.
        }
        out.append(kReplacement);
        pos += utf8_maximal_subpart(rest);
    }
    pending_.erase(0, pos);
    return out;
}

std::string IncrementalDecoder::flush() {
    std::string out;
    if (!pending_.empty()) {
        out.append(kReplacement);
        pending_.clear();
    }
    return out;
}

}  // namespace edge::engine::tokenizer
