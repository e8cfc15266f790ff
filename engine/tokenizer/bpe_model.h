#pragma once

// BpeModel is the byte-level BPE vocabulary and merge table of a tokenizer: token bytes <-> ids,
// and merge rules by rank. encode_word() splits one pre-tokenized piece (raw bytes) into ids by
// repeatedly merging the adjacent pair of lowest rank (leftmost first), with a bounded per-word
// cache.
//
// Threading: immutable after build() except the cache, which has its own mutex; encode_word() is
// thread-safe.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"

namespace edge::engine::tokenizer {

class BpeModel {
public:
    // `vocab`: raw token bytes and id; `merges`: pairs of raw token bytes, in rank order;
    // `literals`: entries outside the byte alphabet (TokenizerJson::literal_vocab), as text and
    // id, which encode_word() never produces. kInvalidArgument when an id repeats or is
    // negative, a merge names a token missing from the vocabulary, or a single byte has no token
    // (byte-level BPE needs all 256).
    static Result<std::unique_ptr<BpeModel>> build(
        std::vector<std::pair<std::string, TokenId>> vocab,
        const std::vector<std::pair<std::string, std::string>>& merges,
        std::vector<std::pair<std::string, TokenId>> literals = {});

    // Appends the ids of one piece of raw bytes.
    void encode_word(std::string_view word, std::vector<TokenId>* out) const;

    // Id of exact token bytes, or -1. Never a literal entry.
    TokenId find(std::string_view bytes) const;
    // Id of the literal entry spelled `text`, or -1.
    TokenId find_literal(std::string_view text) const;

    // Raw bytes of `id` (a literal entry's text; empty for ids without a vocabulary entry).
    std::string_view bytes(TokenId id) const;

    // One more than the largest id.
    int32_t id_limit() const { return static_cast<int32_t>(id_to_bytes_.size()); }

private:
    struct Merge {
        int32_t rank = 0;
        TokenId merged = 0;
    };
    static uint64_t pair_key(TokenId a, TokenId b) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    }
    void merge_symbols(std::vector<TokenId>* symbols) const;

    std::unordered_map<std::string, TokenId> bytes_to_id_;
    // Apart from bytes_to_id_: a literal's text may equal the raw bytes of a byte-level token.
    std::unordered_map<std::string, TokenId> literal_to_id_;
    std::vector<std::string> id_to_bytes_;
    std::unordered_map<uint64_t, Merge> merges_;
    TokenId byte_ids_[256] = {};

    static constexpr size_t kCacheEntries = 1 << 16;
    static constexpr size_t kCacheMaxWordBytes = 256;
    mutable std::mutex cache_mu_;
    mutable std::unordered_map<std::string, std::vector<TokenId>> cache_;
};

}  // namespace edge::engine::tokenizer
