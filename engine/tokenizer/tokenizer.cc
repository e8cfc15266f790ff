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
    EDGE_ASSIGN_OR_RETURN(t->bpe_, BpeModel::build(std::move(parsed.vocab), parsed.merges));

    t->vocab_size_ = t->bpe_->id_limit();
    for (const AddedToken& a : parsed.added_tokens) {
        t->vocab_size_ = std::max(t->vocab_size_, a.id + 1);
    }
    t->added_index_by_id_.assign(static_cast<size_t>(t->vocab_size_), -1);
    t->added_ = std::move(parsed.added_tokens);
    std::stable_sort(t->added_.begin(), t->added_.end(), [](const auto& a, const auto& b) {
        return a.content.size() > b.content.size();
    });
    for (size_t i = 0; i < t->added_.size(); ++i) {
        const AddedToken& a = t->added_[i];
        if (!utf8_is_valid(a.content)) {
            return invalid_argument_error("added_tokens: content of id " + std::to_string(a.id) +
                                          " is not valid UTF-8");
        }
        if (t->added_index_by_id_[a.id] >= 0) {
            return invalid_argument_error("added_tokens: id " + std::to_string(a.id) +
                                          " appears twice");
        }
        t->added_index_by_id_[a.id] = static_cast<int>(i);
        t->added_by_first_byte_[static_cast<uint8_t>(a.content[0])].push_back(static_cast<int>(i));
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
        EDGE_RETURN_IF_ERROR(encode_plain(text, &ids));
        return ids;
    }
    size_t plain_start = 0;
    size_t pos = 0;
    while (pos < text.size()) {
        const AddedToken* hit = nullptr;
        for (int index : added_by_first_byte_[static_cast<uint8_t>(text[pos])]) {
            if (text.substr(pos).starts_with(added_[index].content)) {
                hit = &added_[index];  // Longest first, so the first hit is the longest.
                break;
            }
        }
        if (hit == nullptr) {
            ++pos;
            continue;
        }
        EDGE_RETURN_IF_ERROR(encode_plain(text.substr(plain_start, pos - plain_start), &ids));
        ids.push_back(hit->id);
        pos += hit->content.size();
        plain_start = pos;
    }
    EDGE_RETURN_IF_ERROR(encode_plain(text.substr(plain_start), &ids));
    return ids;
}

Status Tokenizer::encode_plain(std::string_view text, std::vector<TokenId>* out) const {
    if (text.empty()) {
        return ok_status();
    }
    EDGE_ASSIGN_OR_RETURN(std::string normalized, normalizer_.normalize(text));
    std::vector<std::string_view> words;
    EDGE_RETURN_IF_ERROR(pre_tokenizer_->split(normalized, &words));
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

bool Tokenizer::is_added(TokenId id) const {
    return id >= 0 && id < vocab_size_ && added_index_by_id_[id] >= 0;
}

bool Tokenizer::is_special(TokenId id) const {
    return is_added(id) && added_[added_index_by_id_[id]].special;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
    if (is_added(id)) {
        return added_[added_index_by_id_[id]].content;
    }
    return bpe_->bytes(id);
}

TokenId Tokenizer::token_id(std::string_view content) const {
    for (const AddedToken& a : added_) {
        if (a.content == content) {
            return a.id;
        }
    }
    return bpe_->find(content);
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
    std::string out;
    for (TokenId id : ids) {
        out.append(token_bytes(id));
    }
    return out;
}

}  // namespace edge::engine::tokenizer
