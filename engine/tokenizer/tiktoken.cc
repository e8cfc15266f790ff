#include "engine/tokenizer/tiktoken.h"

#include <algorithm>
#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "common/file.h"
#include "common/json_text.h"
#include "engine/tokenizer/byte_level.h"

namespace edge::engine::tokenizer {
namespace {

namespace json = boost::json;

int base64_value(char c) {
    if (c >= 'A' && c <= 'Z') {
        return c - 'A';
    }
    if (c >= 'a' && c <= 'z') {
        return c - 'a' + 26;
    }
    if (c >= '0' && c <= '9') {
        return c - '0' + 52;
    }
    if (c == '+') {
        return 62;
    }
    if (c == '/') {
        return 63;
    }
    return -1;
}

// Standard base64 with '=' padding; false on any other byte or a bad length.
bool base64_decode(std::string_view in, std::string* out) {
    out->clear();
    if (in.empty() || in.size() % 4 != 0) {
        return false;
    }
    for (size_t i = 0; i < in.size(); i += 4) {
        int v[4];
        int pad = 0;
        for (int j = 0; j < 4; ++j) {
            const char c = in[i + j];
            if (c == '=' && i + 4 == in.size() && j >= 2) {
                v[j] = 0;
                ++pad;
            } else if (pad > 0 || (v[j] = base64_value(c)) < 0) {
                return false;
            }
        }
        const uint32_t n = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
        out->push_back(static_cast<char>((n >> 16) & 0xff));
        if (pad < 2) {
            out->push_back(static_cast<char>((n >> 8) & 0xff));
        }
        if (pad < 1) {
            out->push_back(static_cast<char>(n & 0xff));
        }
    }
    return true;
}

}  // namespace

const char* kimi_k2_pattern() {
    // tokenization_kimi.py's letter classes are intersections, `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&
    // [^\p{Han}]]` and `[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]`, which PCRE2 10.42 cannot write.
    // They are written here as negated classes over the general categories, which partition the
    // code points (L, M, N, P, S, Z, C): "Lu, Lt, Lm, Lo or M, and not Han" is "none of Ll, N, P,
    // S, Z, C, Han". A group with a look-ahead per character, `(?:(?!\p{Han})[...])*`, would say
    // the same, but PCRE2 keeps a backtracking frame per repetition of a group: the JIT's stack
    // ran out at ~10k letters and the interpreter's match limit at ~1 MB of capitals.
    return "[\\p{Han}]+"
           "|[^\\r\\n\\p{L}\\p{N}]?[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{Han}]*"
           "[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{Han}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
           "|[^\\r\\n\\p{L}\\p{N}]?[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{Han}]+"
           "[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{Han}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
           "|\\p{N}{1,3}"
           "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
           "|\\s*[\\r\\n]+"
           "|\\s+(?!\\S)"
           "|\\s+";
}

Result<std::vector<std::pair<std::string, TokenId>>> parse_tiktoken(std::string_view text,
                                                                    const std::string& where) {
    std::vector<std::pair<std::string, TokenId>> out;
    size_t line_no = 0;
    while (!text.empty()) {
        ++line_no;
        const size_t nl = text.find('\n');
        std::string_view line = text.substr(0, nl);
        text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
        if (!line.empty() && line.back() == '\r') {
            line.remove_suffix(1);
        }
        if (line.empty()) {
            continue;
        }
        const std::string at = where + ": line " + std::to_string(line_no);
        const size_t sp = line.find(' ');
        if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos) {
            return invalid_argument_error(at + ": expected \"<base64 token> <rank>\"");
        }
        std::string bytes;
        if (!base64_decode(line.substr(0, sp), &bytes)) {
            return invalid_argument_error(at + ": the token is not valid base64");
        }
        const std::string_view rank_text = line.substr(sp + 1);
        int64_t rank = 0;
        if (rank_text.empty() || rank_text.size() > 9) {
            return invalid_argument_error(at + ": the rank is not a number below 10^9");
        }
        for (char c : rank_text) {
            if (c < '0' || c > '9') {
                return invalid_argument_error(at + ": the rank is not a number");
            }
            rank = rank * 10 + (c - '0');
        }
        out.emplace_back(std::move(bytes), static_cast<TokenId>(rank));
    }
    if (out.empty()) {
        return invalid_argument_error(where + ": no tokens");
    }
    return out;
}

Result<std::unique_ptr<Tokenizer>> tokenizer_from_tiktoken(std::string_view model_text,
                                                           const std::string& pattern,
                                                           const std::vector<AddedToken>& specials,
                                                           const std::string& where) {
    EDGE_ASSIGN_OR_RETURN(auto ranks, parse_tiktoken(model_text, where));
    std::sort(ranks.begin(), ranks.end(),
              [](const auto& a, const auto& b) { return a.second < b.second; });
    std::unordered_map<std::string, TokenId> rank_of;
    json::object vocab;
    for (const auto& [bytes, rank] : ranks) {
        if (!rank_of.emplace(bytes, rank).second) {
            return invalid_argument_error(where + ": token of rank " + std::to_string(rank) +
                                          " appears twice");
        }
        vocab[bytes_to_unicode(bytes)] = rank;
    }
    json::array merges;
    for (const auto& [bytes, rank] : ranks) {
        for (size_t cut = 1; cut < bytes.size(); ++cut) {
            const auto left = rank_of.find(bytes.substr(0, cut));
            const auto right = rank_of.find(bytes.substr(cut));
            if (left != rank_of.end() && right != rank_of.end() && left->second < rank &&
                right->second < rank) {
                merges.push_back(json::value(bytes_to_unicode(left->first) + " " +
                                             bytes_to_unicode(right->first)));
            }
        }
    }
    json::object model;
    model["type"] = "BPE";
    model["vocab"] = std::move(vocab);
    model["merges"] = std::move(merges);
    // tiktoken takes a piece that is itself a token whole before merging anything; the merges
    // alone can miss it ("abcd" with "bc" ranked before "ab" and "cd" stops at a, bc, d).
    model["ignore_merges"] = true;
    json::array added;
    for (const AddedToken& a : specials) {
        json::object t;
        t["id"] = a.id;
        t["content"] = a.content;
        t["special"] = a.special;
        added.push_back(std::move(t));
    }
    json::object split;
    split["type"] = "Split";
    split["pattern"] = json::object{{"Regex", pattern}};
    split["behavior"] = "Isolated";
    split["invert"] = false;
    json::object byte_level;
    byte_level["type"] = "ByteLevel";
    byte_level["add_prefix_space"] = false;
    byte_level["use_regex"] = false;
    json::object pre;
    pre["type"] = "Sequence";
    pre["pretokenizers"] = json::array{split, byte_level};
    json::object root;
    root["model"] = std::move(model);
    root["added_tokens"] = std::move(added);
    root["pre_tokenizer"] = std::move(pre);
    root["decoder"] = json::object{{"type", "ByteLevel"}};
    auto t = Tokenizer::from_json(json::serialize(root));
    if (!t.ok()) {
        return t.status().with_context(where);
    }
    return t;
}

Result<std::unique_ptr<Tokenizer>> load_checkpoint_tokenizer(const std::string& dir) {
    std::error_code ec;
    if (std::filesystem::exists(dir + "/tokenizer.json", ec) ||
        !std::filesystem::exists(dir + "/tiktoken.model", ec)) {
        return Tokenizer::load_file(dir + "/tokenizer.json");
    }
    return load_tiktoken_dir(dir);
}

Result<std::unique_ptr<Tokenizer>> load_tiktoken_dir(const std::string& dir) {
    const std::string model_path = dir + "/tiktoken.model";
    EDGE_ASSIGN_OR_RETURN(std::string model_text, read_small_file(model_path));
    std::vector<AddedToken> specials;
    const std::string config_path = dir + "/tokenizer_config.json";
    // Only an absent config means no special tokens. One that is there but cannot be read (a
    // directory, a dangling link, a read error) is an error: loading on without it would
    // tokenize the chat template's markers as plain text.
    std::error_code ec;
    if (std::filesystem::symlink_status(config_path, ec).type() !=
        std::filesystem::file_type::not_found) {
        EDGE_ASSIGN_OR_RETURN(const std::string config_text, read_small_file(config_path));
        EDGE_ASSIGN_OR_RETURN(const json::object root, parse_json_object(config_text, config_path));
        if (const json::value* dec = root.if_contains("added_tokens_decoder")) {
            if (!dec->is_object()) {
                return invalid_argument_error(config_path + ": field 'added_tokens_decoder' is " +
                                              "not an object");
            }
            for (const auto& kv : dec->get_object()) {
                const std::string where =
                    config_path + ": added_tokens_decoder[\"" + std::string(kv.key()) + "\"]";
                int64_t id = -1;
                const std::string key(kv.key());
                if (key.empty() || key.size() > 9 ||
                    key.find_first_not_of("0123456789") != std::string::npos) {
                    return invalid_argument_error(where + ": the key is not a token id");
                }
                id = std::stoll(key);
                const json::value* content = kv.value().is_object()
                                                 ? kv.value().get_object().if_contains("content")
                                                 : nullptr;
                if (content == nullptr || !content->is_string() || content->get_string().empty()) {
                    return invalid_argument_error(where + ".content: missing or not a string");
                }
                const json::value* special = kv.value().get_object().if_contains("special");
                specials.push_back(
                    {static_cast<TokenId>(id), std::string(content->get_string()),
                     special != nullptr && special->is_bool() && special->get_bool()});
            }
        }
    }
    return tokenizer_from_tiktoken(model_text, kimi_k2_pattern(), specials, model_path);
}

}  // namespace edge::engine::tokenizer
