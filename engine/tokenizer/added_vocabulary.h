#pragma once

// AddedVocabulary finds a tokenizer's added tokens in text with the semantics of Hugging Face's
// tokenizers (its AddedVocabulary), so that prompts tokenize as they did in training:
//   - Two passes. Tokens with `normalized` false are found in the raw text; the text between
//     them is normalised, and tokens with `normalized` true are found in that, against their
//     normalised content.
//   - In each pass, matches are leftmost-longest and never overlap. A match that is then refused
//     (single_word) is skipped whole: the scan resumes after it, not inside it.
//   - single_word: refused when a word character (Unicode \w: alphabetic, mark, decimal digit,
//     connector punctuation, join control) is right before or right after it in the piece of text
//     being searched.
//   - lstrip / rstrip: the token also takes the whitespace (Unicode White_Space) before / after
//     it; lstrip stops at the end of the previous token of the same pass.
// split() takes time linear in the text whatever the number and length of the added tokens: a
// prompt is untrusted, and DeepSeek-V3 has ~800 added tokens that all start with "<". build()
// makes the tokens of each pass one automaton.
//
// Threading: immutable after build(); split() is thread-safe.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/tokenizer_json.h"

namespace edge::engine::tokenizer {

class AddedVocabulary {
  public:
    // A run of the searched text: an added token (with any whitespace it stripped) or the text
    // between tokens (`token` null), as byte offsets [begin, end).
    struct Span {
        size_t begin = 0;
        size_t end = 0;
        const AddedToken* token = nullptr;
    };

    AddedVocabulary() = default;
    AddedVocabulary(AddedVocabulary&&) = default;
    AddedVocabulary& operator=(AddedVocabulary&&) = default;

    // `tokens` with `normalizer` applied to the content of the normalized ones. kInvalidArgument
    // when a content is empty or not valid UTF-8, or an id appears twice.
    static Result<AddedVocabulary> build(std::vector<AddedToken> tokens,
                                         const Normalizer& normalizer);

    // Splits valid UTF-8 `text` by the tokens of one pass (`normalized` false: the raw-text pass;
    // true: the pass over text the normaliser produced). The spans cover `text` in order; empty
    // gaps are left out, so an empty `out` means empty text.
    void split(std::string_view text, bool normalized, std::vector<Span>* out) const;

    bool empty() const { return tokens_.empty(); }
    // The token with this id or exactly this content, or null.
    const AddedToken* find_id(TokenId id) const;
    const AddedToken* find_content(std::string_view content) const;
    // One more than the largest id, 0 when empty.
    TokenId id_limit() const { return static_cast<TokenId>(index_by_id_.size()); }

  private:
    // The string a pass matches for one token: its content, normalised in the second pass.
    struct Pattern {
        std::string text;
        int token = 0;  // Index into tokens_.
    };
    // Where a pattern occurs in the searched text.
    struct Match {
        size_t begin = 0;  // Byte offset.
        int pattern = 0;   // Index into Pass::patterns.
    };
    // One pass's patterns, in token order, and an Aho-Corasick automaton over their reversed
    // bytes: fed the text backwards, it names at each byte the longest pattern that starts there,
    // which is what a leftmost-longest scan takes.
    struct Pass {
        struct Node {
            int fail = 0;  // Node of the longest proper suffix of this node's string (0: root).
            // The longest pattern whose reversal is a suffix of this node's string, or -1.
            int longest = -1;
            uint32_t first_edge = 0;  // Children: edges[first_edge, first_edge + edge_count).
            uint32_t edge_count = 0;
        };
        struct Edge {
            uint8_t byte = 0;
            int node = 0;
        };

        // Builds the automaton over `patterns`.
        void build_automaton();
        // Every position where a pattern starts, in order, each with the longest one there.
        void longest_matches(std::string_view text, std::vector<Match>* out) const;
        int next(int node, uint8_t byte) const;

        std::vector<Pattern> patterns;
        std::vector<Node> nodes;           // [0]: the root (the empty string).
        std::vector<Edge> edges;           // Grouped by parent, by byte within a group.
        std::array<int, 256> from_root{};  // The root's transitions, by byte (0 back to the root).
    };

    std::vector<AddedToken> tokens_;
    std::vector<int> index_by_id_;  // -1 or index into tokens_, by id.
    Pass passes_[2];                // [0]: raw text, [1]: normalised text.
};

}  // namespace edge::engine::tokenizer
