#include "engine/tokenizer/added_vocabulary.h"

#include <unicode/uchar.h>

#include <algorithm>

#include "engine/tokenizer/utf8.h"

namespace edge::engine::tokenizer {

namespace {

// Unicode \w as Rust's regex crate (which Hugging Face's single_word test uses) defines it.
bool is_word_char(uint32_t c) {
    const auto u = static_cast<UChar32>(c);
    return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) ||
           (U_GET_GC_MASK(u) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 ||
           u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL);
}

bool is_white_space(uint32_t c) {
    return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

// The code point that ends valid UTF-8 `text` (non-empty) and the byte where it starts.
uint32_t last_char(std::string_view text, size_t* start) {
    size_t at = text.size() - 1;
    while (at > 0 && (static_cast<uint8_t>(text[at]) & 0xC0) == 0x80) {
        --at;
    }
    *start = at;
    return utf8_decode(text.substr(at), text.size() - at);
}

uint32_t first_char(std::string_view text, size_t* length) {
    *length = utf8_valid_sequence(text);
    return utf8_decode(text, *length);
}

// Start of the whitespace run that ends text[0, end), not before `floor`.
size_t strip_left(std::string_view text, size_t end, size_t floor) {
    while (end > floor) {
        size_t start = 0;
        if (!is_white_space(last_char(text.substr(0, end), &start))) {
            break;
        }
        end = start;
    }
    return std::max(end, floor);
}

// End of the whitespace run that starts at `begin`.
size_t strip_right(std::string_view text, size_t begin) {
    while (begin < text.size()) {
        size_t length = 0;
        if (!is_white_space(first_char(text.substr(begin), &length))) {
            break;
        }
        begin += length;
    }
    return begin;
}

bool touches_word(std::string_view text, size_t begin, size_t end) {
    size_t unused = 0;
    return (begin > 0 && is_word_char(last_char(text.substr(0, begin), &unused))) ||
           (end < text.size() && is_word_char(first_char(text.substr(end), &unused)));
}

}  // namespace

Result<AddedVocabulary> AddedVocabulary::build(std::vector<AddedToken> tokens,
                                               const Normalizer& normalizer) {
    AddedVocabulary v;
    v.tokens_ = std::move(tokens);
    for (Pass& pass : v.passes_) {
        pass.by_first_byte.resize(256);
    }
    for (size_t i = 0; i < v.tokens_.size(); ++i) {
        const AddedToken& a = v.tokens_[i];
        if (a.content.empty() || !utf8_is_valid(a.content)) {
            return invalid_argument_error("added_tokens: content of id " + std::to_string(a.id) +
                                          " is empty or not valid UTF-8");
        }
        if (static_cast<size_t>(a.id) >= v.index_by_id_.size()) {
            v.index_by_id_.resize(static_cast<size_t>(a.id) + 1, -1);
        }
        if (v.index_by_id_[a.id] >= 0) {
            return invalid_argument_error("added_tokens: id " + std::to_string(a.id) +
                                          " appears twice");
        }
        v.index_by_id_[a.id] = static_cast<int>(i);
        Pattern p{a.content, static_cast<int>(i)};
        if (a.normalized) {
            EDGE_ASSIGN_OR_RETURN(p.text, normalizer.normalize(a.content));
        }
        if (!p.text.empty()) {
            v.passes_[a.normalized ? 1 : 0].patterns.push_back(std::move(p));
        }
    }
    for (Pass& pass : v.passes_) {
        // Longest first, so the first pattern that matches at a position is the longest one.
        std::stable_sort(
            pass.patterns.begin(), pass.patterns.end(),
            [](const Pattern& a, const Pattern& b) { return a.text.size() > b.text.size(); });
        for (size_t i = 0; i < pass.patterns.size(); ++i) {
            pass.by_first_byte[static_cast<uint8_t>(pass.patterns[i].text[0])].push_back(
                static_cast<int>(i));
        }
    }
    return v;
}

void AddedVocabulary::split(std::string_view text, bool normalized, std::vector<Span>* out) const {
    out->clear();
    const Pass& pass = passes_[normalized ? 1 : 0];
    size_t emitted = 0;  // End of the last token span: text before it is in `out`.
    size_t pos = 0;
    while (pos < text.size()) {
        const Pattern* hit = nullptr;
        if (!pass.patterns.empty()) {
            for (int index : pass.by_first_byte[static_cast<uint8_t>(text[pos])]) {
                if (text.substr(pos).starts_with(pass.patterns[index].text)) {
                    hit = &pass.patterns[index];
                    break;
                }
            }
        }
        if (hit == nullptr) {
            ++pos;
            continue;
        }
        const AddedToken& token = tokens_[hit->token];
        size_t begin = pos;
        size_t end = pos + hit->text.size();
        // The scan goes on after the match itself, whether it is taken or refused, and whatever
        // whitespace rstrip takes (Hugging Face iterates over non-overlapping matches).
        pos = end;
        if (token.single_word && touches_word(text, begin, end)) {
            continue;
        }
        if (token.lstrip) {
            begin = strip_left(text, begin, emitted);
        }
        if (token.rstrip) {
            end = strip_right(text, end);
        }
        if (begin > emitted) {
            out->push_back({emitted, begin, nullptr});
        }
        // A match inside whitespace an rstrip took starts before `emitted` (only a token whose
        // content starts with whitespace can); it is still taken, as Hugging Face does.
        out->push_back({std::max(begin, emitted), std::max(end, emitted), &token});
        emitted = std::max(end, emitted);
    }
    if (emitted < text.size()) {
        out->push_back({emitted, text.size(), nullptr});
    }
}

const AddedToken* AddedVocabulary::find_id(TokenId id) const {
    if (id < 0 || static_cast<size_t>(id) >= index_by_id_.size() || index_by_id_[id] < 0) {
        return nullptr;
    }
    return &tokens_[index_by_id_[id]];
}

const AddedToken* AddedVocabulary::find_content(std::string_view content) const {
    for (const AddedToken& a : tokens_) {
        if (a.content == content) {
            return &a;
        }
    }
    return nullptr;
}

}  // namespace edge::engine::tokenizer
