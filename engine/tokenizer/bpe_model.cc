#include "engine/tokenizer/bpe_model.h"

#include <queue>

#include "engine/tokenizer/tokenizer_json.h"

namespace edge::engine::tokenizer {

Result<std::unique_ptr<BpeModel>> BpeModel::build(
    std::vector<std::pair<std::string, TokenId>> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges,
    std::vector<std::pair<std::string, TokenId>> literals) {
    std::unique_ptr<BpeModel> m(new BpeModel());
    TokenId max_id = -1;
    for (const auto* entries : {&vocab, &literals}) {
        for (const auto& [bytes, id] : *entries) {
            if (id < 0) {
                return invalid_argument_error("vocab: negative id " + std::to_string(id));
            }
            max_id = std::max(max_id, id);
        }
    }
    if (max_id >= kMaxTokenId) {
        return invalid_argument_error("vocab: id " + std::to_string(max_id) + " is too large");
    }
    m->id_to_bytes_.resize(static_cast<size_t>(max_id + 1));
    std::vector<bool> seen(static_cast<size_t>(max_id + 1), false);
    for (auto& [bytes, id] : vocab) {
        if (seen[id]) {
            return invalid_argument_error("vocab: id " + std::to_string(id) + " appears twice");
        }
        seen[id] = true;
        m->id_to_bytes_[id] = bytes;
        m->bytes_to_id_.emplace(std::move(bytes), id);
    }
    for (auto& [text, id] : literals) {
        if (seen[id]) {
            return invalid_argument_error("vocab: id " + std::to_string(id) + " appears twice");
        }
        seen[id] = true;
        m->id_to_bytes_[id] = text;
        m->literal_to_id_.emplace(std::move(text), id);
    }
    for (int b = 0; b < 256; ++b) {
        const char c = static_cast<char>(b);
        const TokenId byte_id = m->find(std::string_view(&c, 1));
        if (byte_id < 0) {
            return invalid_argument_error("vocab: byte " + std::to_string(b) +
                                          " has no token (byte-level BPE needs all 256)");
        }
        m->byte_ids_[b] = byte_id;
    }
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const auto& [left, right] = merges[rank];
        const TokenId a = m->find(left);
        const TokenId b = m->find(right);
        const TokenId merged = m->find(left + right);
        if (a < 0 || b < 0 || merged < 0) {
            return invalid_argument_error("merges[" + std::to_string(rank) +
                                          "]: a part or the merged token is not in the vocab");
        }
        // A pair listed twice takes its last rank, as Hugging Face's tokenizers (Rust and JS)
        // do: they collect the rules into a map, later entries replacing earlier ones.
        m->merges_.insert_or_assign(pair_key(a, b), Merge{static_cast<int32_t>(rank), merged});
    }
    return m;
}

TokenId BpeModel::find(std::string_view bytes) const {
    auto it = bytes_to_id_.find(std::string(bytes));
    return it == bytes_to_id_.end() ? -1 : it->second;
}

TokenId BpeModel::find_literal(std::string_view text) const {
    auto it = literal_to_id_.find(std::string(text));
    return it == literal_to_id_.end() ? -1 : it->second;
}

std::string_view BpeModel::bytes(TokenId id) const {
    if (id < 0 || static_cast<size_t>(id) >= id_to_bytes_.size()) {
        return {};
    }
    return id_to_bytes_[id];
}

void BpeModel::merge_symbols(std::vector<TokenId>* symbols) const {
    // Doubly linked list over the symbols plus a heap of candidate merges keyed by (rank, left
    // position); stale heap entries are detected and skipped. O(n log n) in the word length.
    const int n = static_cast<int>(symbols->size());
    std::vector<TokenId>& ids = *symbols;
    std::vector<int> prev(n), next(n);
    std::vector<bool> alive(n, true);
    for (int i = 0; i < n; ++i) {
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Candidate {
        int32_t rank;
        int left;
        TokenId left_id;
        TokenId right_id;
        bool operator>(const Candidate& o) const {
            return rank != o.rank ? rank > o.rank : left > o.left;
        }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto push = [&](int left) {
        if (left < 0 || next[left] < 0) {
            return;
        }
        auto it = merges_.find(pair_key(ids[left], ids[next[left]]));
        if (it != merges_.end()) {
            heap.push({it->second.rank, left, ids[left], ids[next[left]]});
        }
    };
    for (int i = 0; i + 1 < n; ++i) {
        push(i);
    }
    while (!heap.empty()) {
        const Candidate c = heap.top();
        heap.pop();
        const int right = alive[c.left] ? next[c.left] : -1;
        if (right < 0 || ids[c.left] != c.left_id || ids[right] != c.right_id) {
            continue;  // Stale: one side was merged away since this entry was pushed.
        }
        ids[c.left] = merges_.at(pair_key(c.left_id, c.right_id)).merged;
        alive[right] = false;
        next[c.left] = next[right];
        if (next[right] >= 0) {
            prev[next[right]] = c.left;
        }
        push(prev[c.left]);
        push(c.left);
    }
    std::vector<TokenId> merged;
    for (int i = 0; i >= 0 && i < n; i = next[i]) {
        merged.push_back(ids[i]);
    }
    symbols->swap(merged);
}

void BpeModel::encode_word(std::string_view word, std::vector<TokenId>* out) const {
    if (word.empty()) {
        return;
    }
    if (word.size() == 1) {
        out->push_back(byte_ids_[static_cast<uint8_t>(word[0])]);
        return;
    }
    const bool cacheable = word.size() <= kCacheMaxWordBytes;
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_mu_);
        auto it = cache_.find(std::string(word));
        if (it != cache_.end()) {
            out->insert(out->end(), it->second.begin(), it->second.end());
            return;
        }
    }
    std::vector<TokenId> symbols;
    symbols.reserve(word.size());
    for (char c : word) {
        symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
    }
    merge_symbols(&symbols);
    out->insert(out->end(), symbols.begin(), symbols.end());
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_mu_);
        if (cache_.size() >= kCacheEntries) {
            cache_.clear();  // Crude but bounded; a word cache refills quickly.
        }
        cache_.emplace(std::string(word), std::move(symbols));
    }
}

}  // namespace edge::engine::tokenizer
