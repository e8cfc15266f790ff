#include "engine/tokenizer/added_vocabulary.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <deque>

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
        pass.build_automaton();
    }
    return v;
}

void AddedVocabulary::Pass::build_automaton() {
    // The trie of the reversed patterns, each node's children unsorted while it grows.
    std::vector<std::vector<Edge>> children(1);
    nodes.assign(1, Node());
    for (size_t p = 0; p < patterns.size(); ++p) {
        const std::string& text = patterns[p].text;
        int node = 0;
        for (auto c = text.rbegin(); c != text.rend(); ++c) {
            const auto byte = static_cast<uint8_t>(*c);
            auto& kids = children[node];
            auto kid = std::find_if(kids.begin(), kids.end(),
                                    [byte](const Edge& e) { return e.byte == byte; });
            if (kid != kids.end()) {
                node = kid->node;
                continue;
            }
            const int created = static_cast<int>(nodes.size());
            kids.push_back({byte, created});
            nodes.emplace_back();
            children.emplace_back();
            node = created;
        }
        // Of two tokens with the same pattern, the first one in the vocabulary wins.
        if (nodes[node].longest < 0) {
            nodes[node].longest = static_cast<int>(p);
        }
    }
    edges.clear();
    for (size_t n = 0; n < nodes.size(); ++n) {
        std::sort(children[n].begin(), children[n].end(),
                  [](const Edge& a, const Edge& b) { return a.byte < b.byte; });
        nodes[n].first_edge = static_cast<uint32_t>(edges.size());
        nodes[n].edge_count = static_cast<uint32_t>(children[n].size());
        edges.insert(edges.end(), children[n].begin(), children[n].end());
    }
    from_root.fill(0);
    for (const Edge& e : children[0]) {
        from_root[e.byte] = e.node;
    }
    // Failure links breadth first, so that a node's fail target (shallower) is complete first.
    // A node's own pattern is longer than any of its fail chain's.
    std::deque<int> queue(children[0].size());
    std::transform(children[0].begin(), children[0].end(), queue.begin(),
                   [](const Edge& e) { return e.node; });
    while (!queue.empty()) {
        const int parent = queue.front();
        queue.pop_front();
        for (const Edge& e : children[parent]) {
            Node& child = nodes[e.node];
            child.fail = parent == 0 ? 0 : next(nodes[parent].fail, e.byte);
            if (child.longest < 0) {
                child.longest = nodes[child.fail].longest;
            }
            queue.push_back(e.node);
        }
    }
}

int AddedVocabulary::Pass::next(int node, uint8_t byte) const {
    // Amortised O(1): each fail link followed is one byte less of depth, and a step adds one.
    while (node != 0) {
        const Node& n = nodes[node];
        const auto begin = edges.begin() + n.first_edge;
        const auto end = begin + n.edge_count;
        const auto kid =
            std::lower_bound(begin, end, byte, [](const Edge& e, uint8_t b) { return e.byte < b; });
        if (kid != end && kid->byte == byte) {
            return kid->node;
        }
        node = n.fail;
    }
    return from_root[byte];
}

void AddedVocabulary::Pass::longest_matches(std::string_view text, std::vector<Match>* out) const {
    out->clear();
    if (patterns.empty()) {
        return;
    }
    // After text[i, end) is fed backwards, the node is the longest suffix of that reversal in
    // the trie: its `longest` is the longest pattern that text[i] starts.
    int node = 0;
    for (size_t i = text.size(); i-- > 0;) {
        node = next(node, static_cast<uint8_t>(text[i]));
        if (nodes[node].longest >= 0) {
            out->push_back({i, nodes[node].longest});
        }
    }
    std::reverse(out->begin(), out->end());
}

void AddedVocabulary::split(std::string_view text, bool normalized, std::vector<Span>* out) const {
    out->clear();
    const Pass& pass = passes_[normalized ? 1 : 0];
    std::vector<Match> matches;
    pass.longest_matches(text, &matches);
    size_t emitted = 0;  // End of the last token span: text before it is in `out`.
    size_t pos = 0;      // Where the leftmost-longest scan goes on.
    // The whitespace run [from, to) an rstrip took last. A later match that ends inside it takes
    // the same run without walking it again (n newlines with an rstrip "\n" token: O(n), not
    // O(n^2)).
    size_t rstrip_from = 1;
    size_t rstrip_to = 0;
    for (const Match& m : matches) {
        if (m.begin < pos) {
            continue;
        }
        const Pattern& hit = pass.patterns[m.pattern];
        const AddedToken& token = tokens_[hit.token];
        size_t begin = m.begin;
        size_t end = m.begin + hit.text.size();
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
            if (end < rstrip_from || end > rstrip_to) {
                rstrip_from = end;
                rstrip_to = strip_right(text, end);
            }
            end = rstrip_to;
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
