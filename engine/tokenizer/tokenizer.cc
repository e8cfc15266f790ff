#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/file.h"
#include "engine/tokenizer/utf8.h"

namespace edge::engine::tokenizer {

Result<std::unique_ptr<Tokenizer>> Tokenizer::load_file(const std::string& path) {
    EDGE_ASSIGN_OR_RETURN(std::string text, read_small_file(path));
    auto tokenizer = from_json(text);
    if (!tokenizer.ok()) {
        return tokenizer.status().with_context(path);
    }
    return tokenizer;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(std::string_view json) {
    EDGE_ASSIGN_OR_RETURN(TokenizerJson parsed, parse_tokenizer_json(json));
    std::unique_ptr<Tokenizer> t(new Tokenizer());
    t->normalizer_ = Normalizer(parsed.normalizer);
    t->ignore_merges_ = parsed.ignore_merges;
    EDGE_ASSIGN_OR_RETURN(t->pre_tokenizer_, PreTokenizer::create(parsed.split_patterns));
    EDGE_ASSIGN_OR_RETURN(t->bpe_, BpeModel::build(std::move(parsed.vocab), parsed.merges,
                                                   std::move(parsed.literal_vocab)));

    t->vocab_size_ = t->bpe_->id_limit();
    EDGE_ASSIGN_OR_RETURN(t->added_,
                          AddedVocabulary::build(std::move(parsed.added_tokens), t->normalizer_));
    t->vocab_size_ = std::max(t->vocab_size_, t->added_.id_limit());
    if (!parsed.byte_level) {
        // Text is always mapped to GPT-2's byte alphabet here: a vocabulary of plain text
        // (SentencePiece-style BPE) would silently get the wrong ids.
        return unimplemented_error(
            "pre_tokenizer: no ByteLevel step; only byte-level BPE tokenizers are supported");
    }
    return t;
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text, bool parse_special) const {
    const size_t bad_at = utf8_first_invalid(text);
    if (bad_at != text.size()) {
        return invalid_argument_error("text is not valid UTF-8 at byte " + std::to_string(bad_at));
    }
    std::vector<TokenId> ids;
    if (!parse_special || added_.empty()) {
        EDGE_RETURN_IF_ERROR(encode_plain(text, /*added=*/false, &ids));
        return ids;
    }
    std::vector<AddedVocabulary::Span> spans;
    added_.split(text, /*normalized=*/false, &spans);
    for (const AddedVocabulary::Span& s : spans) {
        if (s.token != nullptr) {
            ids.push_back(s.token->id);
        } else {
            EDGE_RETURN_IF_ERROR(
                encode_plain(text.substr(s.begin, s.end - s.begin), /*added=*/true, &ids));
        }
    }
    return ids;
}

Status Tokenizer::encode_plain(std::string_view text, bool added, std::vector<TokenId>* out) const {
    if (text.empty()) {
        return ok_status();
    }
    EDGE_ASSIGN_OR_RETURN(std::string normalized, normalizer_.normalize(text));
    if (!added) {
        return encode_normalized(normalized, out);
    }
    std::vector<AddedVocabulary::Span> spans;
    added_.split(normalized, /*normalized=*/true, &spans);
    for (const AddedVocabulary::Span& s : spans) {
        if (s.token != nullptr) {
            out->push_back(s.token->id);
        } else {
            EDGE_RETURN_IF_ERROR(encode_normalized(
                std::string_view(normalized).substr(s.begin, s.end - s.begin), out));
        }
    }
    return ok_status();
}

Status Tokenizer::encode_normalized(std::string_view text, std::vector<TokenId>* out) const {
    std::vector<std::string_view> words;
    EDGE_RETURN_IF_ERROR(pre_tokenizer_->split(text, &words));
    for (std::string_view word : words) {
        if (ignore_merges_) {
            if (const TokenId whole = bpe_->find(word); whole >= 0) {
                out->push_back(whole);
                continue;
            }
        }
        bpe_->encode_word(word, out);
    }
    return ok_status();
}

Result<std::vector<std::string>> Tokenizer::pre_tokenize(std::string_view text) const {
    if (!utf8_is_valid(text)) {
        return invalid_argument_error("text is not valid UTF-8");
    }
    EDGE_ASSIGN_OR_RETURN(std::string normalized, normalizer_.normalize(text));
    std::vector<std::string_view> words;
    EDGE_RETURN_IF_ERROR(pre_tokenizer_->split(normalized, &words));
    return std::vector<std::string>(words.begin(), words.end());
}

bool Tokenizer::is_added(TokenId id) const { return added_.find_id(id) != nullptr; }

bool Tokenizer::is_special(TokenId id) const {
    const AddedToken* a = added_.find_id(id);
    return a != nullptr && a->special;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
    if (const AddedToken* a = added_.find_id(id)) {
        return a->content;
    }
    return bpe_->bytes(id);
}

TokenId Tokenizer::token_id(std::string_view content) const {
    if (const AddedToken* a = added_.find_content(content)) {
        return a->id;
    }
    if (const TokenId id = bpe_->find(content); id >= 0) {
        return id;
    }
    return bpe_->find_literal(content);
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
    std::string out;
    for (TokenId id : ids) {
        out.append(token_bytes(id));
    }
    return out;
}

}  // namespace edge::engine::tokenizer
