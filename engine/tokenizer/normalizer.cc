#include "engine/tokenizer/normalizer.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

namespace edge::engine::tokenizer {

namespace {

bool all_ascii(std::string_view text) {
    for (char c : text) {
        if (static_cast<unsigned char>(c) >= 0x80) {
            return false;
        }
    }
    return true;
}

// A buffer's capacity as ICU takes it (int32_t): a larger buffer is offered as INT32_MAX units,
// and a result that needs more is ICU's buffer overflow error, never a wrapped size.
int32_t icu_capacity(size_t units) {
    return static_cast<int32_t>(std::min<size_t>(units, INT32_MAX));
}

Status icu_error(const char* step, UErrorCode code) {
    return invalid_argument_error(std::string("NFC normalisation failed in ") + step + ": " +
                                  u_errorName(code));
}

}  // namespace

Result<std::string> Normalizer::normalize(std::string_view text) const {
    // ASCII is already in every normal form, and most prompts are ASCII.
    if (kind_ == NormalizerKind::kNone || all_ascii(text)) {
        return std::string(text);
    }
    if (text.size() > static_cast<size_t>(INT32_MAX / 2)) {
        return invalid_argument_error("text of " + std::to_string(text.size()) +
                                      " bytes is too long to normalise (NFC)");
    }
    UErrorCode err = U_ZERO_ERROR;
    const UNormalizer2* nfc = unorm2_getNFCInstance(&err);
    if (U_FAILURE(err)) {
        return icu_error("unorm2_getNFCInstance", err);
    }
    // UTF-16 never has more units than the UTF-8 has bytes.
    std::vector<UChar> utf16(text.size() + 1);
    int32_t utf16_len = 0;
    u_strFromUTF8(utf16.data(), icu_capacity(utf16.size()), &utf16_len, text.data(),
                  static_cast<int32_t>(text.size()), &err);
    if (U_FAILURE(err)) {
        return icu_error("u_strFromUTF8", err);
    }
    if (unorm2_isNormalized(nfc, utf16.data(), utf16_len, &err) && U_SUCCESS(err)) {
        return std::string(text);
    }
    err = U_ZERO_ERROR;
    // NFC can grow a string (up to 3x for some compositions' decompositions); retry once with
    // the size ICU asks for.
    std::vector<UChar> normalized(static_cast<size_t>(utf16_len) * 3 + 16);
    int32_t norm_len = unorm2_normalize(nfc, utf16.data(), utf16_len, normalized.data(),
                                        icu_capacity(normalized.size()), &err);
    if (err == U_BUFFER_OVERFLOW_ERROR) {
        err = U_ZERO_ERROR;
        normalized.resize(static_cast<size_t>(norm_len) + 1);
        norm_len = unorm2_normalize(nfc, utf16.data(), utf16_len, normalized.data(),
                                    icu_capacity(normalized.size()), &err);
    }
    if (U_FAILURE(err)) {
        return icu_error("unorm2_normalize", err);
    }
    std::string out(static_cast<size_t>(norm_len) * 3 + 4, '\0');
    int32_t out_len = 0;
    u_strToUTF8(out.data(), icu_capacity(out.size()), &out_len, normalized.data(), norm_len,
                &err);
    if (U_FAILURE(err)) {
        return icu_error("u_strToUTF8", err);
    }
    out.resize(static_cast<size_t>(out_len));
    return out;
}

}  // namespace edge::engine::tokenizer
