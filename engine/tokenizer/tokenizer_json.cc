#include "engine/tokenizer/tokenizer_json.h"

#include <boost/json.hpp>

#include "common/json_text.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/pre_tokenizer.h"

namespace edge::engine::tokenizer {

namespace json = boost::json;

namespace {

Status bad(const std::string& where, const std::string& what) {
    return invalid_argument_error(where + ": " + what);
}

std::string_view type_of(const json::object& o) {
    const json::value* t = o.if_contains("type");
    if (t == nullptr || !t->is_string()) {
        return {};
    }
    return t->get_string();
}

// A literal string as a PCRE2 pattern: every non-alphanumeric ASCII character escaped.
std::string escape_literal(std::string_view s) {
    std::string out;
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x80 && !std::isalnum(u)) {
            out.push_back('\\');
        }
        out.push_back(c);
    }
    return out;
}

Status parse_vocab(const json::value& v, TokenizerJson* out) {
    const json::object* vocab = v.if_object();
    if (vocab == nullptr) {
        return bad("model.vocab", "missing or not an object");
    }
    out->vocab.reserve(vocab->size());
    for (const auto& kv : *vocab) {
        const std::string where = "model.vocab[\"" + std::string(kv.key()) + "\"]";
        if (!kv.value().is_int64() || kv.value().get_int64() < 0 ||
            kv.value().get_int64() >= kMaxTokenId) {
            return bad(where, "id is not an integer in [0, 2^21)");
        }
        const auto id = static_cast<TokenId>(kv.value().get_int64());
        // Hugging Face takes any string as a key. One outside the byte alphabet (the parser has
        // already checked the UTF-8) is kept by its text rather than refusing the file.
        auto raw = unicode_to_bytes(kv.key());
        if (raw.ok()) {
            out->vocab.emplace_back(std::move(raw).value(), id);
        } else {
            out->literal_vocab.emplace_back(std::string(kv.key()), id);
        }
    }
    return ok_status();
}

// `vocab` is model.vocab, which every merge's parts and result must be keys of, as Hugging Face
// requires.
Status parse_merges(const json::value* v, const json::object& vocab, TokenizerJson* out) {
    if (v == nullptr || v->is_null()) {
        return ok_status();
    }
    const json::array* merges = v->if_array();
    if (merges == nullptr) {
        return bad("model.merges", "not an array");
    }
    out->merges.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
        const std::string where = "model.merges[" + std::to_string(i) + "]";
        const json::value& m = (*merges)[i];
        std::string_view left;
        std::string_view right;
        if (m.is_string()) {
            std::string_view s = m.get_string();
            const size_t space = s.find(' ');
            if (space == std::string_view::npos ||
                s.find(' ', space + 1) != std::string_view::npos) {
                return bad(where, "expected \"left right\"");
            }
            left = s.substr(0, space);
            right = s.substr(space + 1);
        } else if (m.is_array() && m.get_array().size() == 2 && m.get_array()[0].is_string() &&
                   m.get_array()[1].is_string()) {
            left = m.get_array()[0].get_string();
            right = m.get_array()[1].get_string();
        } else {
            return bad(where, "expected \"left right\" or [left, right]");
        }
        if (left.empty() || right.empty()) {
            return bad(where, "empty merge part");
        }
        const std::string merged = std::string(left) + std::string(right);
        for (std::string_view token : {left, right, std::string_view(merged)}) {
            if (!vocab.contains(token)) {
                return bad(where, "\"" + std::string(token) + "\" is not in model.vocab");
            }
        }
        auto l = unicode_to_bytes(left);
        auto r = unicode_to_bytes(right);
        if (!l.ok() || !r.ok()) {
            // A part outside the byte alphabet is a literal entry, which byte-level input never
            // holds: the merge can never apply (Hugging Face keeps it, and it never fires).
            continue;
        }
        out->merges.emplace_back(std::move(l).value(), std::move(r).value());
    }
    return ok_status();
}

Status parse_model(const json::value* v, TokenizerJson* out) {
    const json::object* model = v == nullptr ? nullptr : v->if_object();
    if (model == nullptr) {
        return bad("model", "missing or not an object");
    }
    const std::string_view type = type_of(*model);
    if (!type.empty() && type != "BPE") {
        return unimplemented_error("model.type: \"" + std::string(type) +
                                   "\" is not supported (only BPE)");
    }
    if (const json::value* bf = model->if_contains("byte_fallback");
        bf && bf->is_bool() && bf->get_bool()) {
        return unimplemented_error("model.byte_fallback: true is not supported");
    }
    for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        const json::value* f = model->if_contains(field);
        if (f != nullptr && f->is_string() && !f->get_string().empty()) {
            return unimplemented_error(std::string("model.") + field + " is not supported");
        }
    }
    if (const json::value* im = model->if_contains("ignore_merges"); im && im->is_bool()) {
        out->ignore_merges = im->get_bool();
    }
    const json::value* vocab = model->if_contains("vocab");
    if (vocab == nullptr) {
        return bad("model.vocab", "missing");
    }
    EDGE_RETURN_IF_ERROR(parse_vocab(*vocab, out));
    return parse_merges(model->if_contains("merges"), vocab->get_object(), out);
}

Status parse_added_tokens(const json::value* v, TokenizerJson* out) {
    if (v == nullptr || v->is_null()) {
        return ok_status();
    }
    const json::array* added = v->if_array();
    if (added == nullptr) {
        return bad("added_tokens", "not an array");
    }
    for (size_t i = 0; i < added->size(); ++i) {
        const std::string where = "added_tokens[" + std::to_string(i) + "]";
        const json::object* t = (*added)[i].if_object();
        const json::value* id = t ? t->if_contains("id") : nullptr;
        const json::value* content = t ? t->if_contains("content") : nullptr;
        if (id == nullptr || !id->is_int64() || id->get_int64() < 0 ||
            id->get_int64() >= kMaxTokenId) {
            return bad(where, "id missing or not an integer in [0, 2^21)");
        }
        if (content == nullptr || !content->is_string() || content->get_string().empty()) {
            return bad(where, "content missing or empty");
        }
        AddedToken token;
        token.id = static_cast<TokenId>(id->get_int64());
        token.content = std::string(content->get_string());
        // Each flag is a bool when present; lstrip and rstrip were once ignored, so a wrong type
        // is an error rather than another silent default.
        struct Flag {
            const char* name;
            bool* value;
        };
        bool normalized_given = false;
        for (const Flag& f :
             {Flag{"special", &token.special}, Flag{"single_word", &token.single_word},
              Flag{"lstrip", &token.lstrip}, Flag{"rstrip", &token.rstrip},
              Flag{"normalized", &token.normalized}}) {
            const json::value* v = t->if_contains(f.name);
            if (v == nullptr || v->is_null()) {
                continue;
            }
            if (!v->is_bool()) {
                return bad(where + "." + f.name, "not a boolean");
            }
            *f.value = v->get_bool();
            normalized_given |= f.value == &token.normalized;
        }
        if (!normalized_given) {
            token.normalized = !token.special;
        }
        out->added_tokens.push_back(std::move(token));
    }
    return ok_status();
}

using EntryParser = Status (*)(const json::value*, const std::string&, TokenizerJson*);

// A "Sequence" entry: each member of its array `key`, parsed by `parse` at its own path.
Status parse_sequence(const json::object& o, const std::string& key, const std::string& where,
                      TokenizerJson* out, EntryParser parse) {
    const json::value* list = o.if_contains(key);
    if (list == nullptr || !list->is_array()) {
        return bad(where + "." + key, "missing or not an array");
    }
    for (size_t i = 0; i < list->get_array().size(); ++i) {
        EDGE_RETURN_IF_ERROR(
            parse(&list->get_array()[i], where + "." + key + "[" + std::to_string(i) + "]", out));
    }
    return ok_status();
}

Status parse_normalizer(const json::value* v, const std::string& where, TokenizerJson* out) {
    if (v == nullptr || v->is_null()) {
        return ok_status();
    }
    const json::object* o = v->if_object();
    if (o == nullptr) {
        return bad(where, "not an object");
    }
    const std::string_view type = type_of(*o);
    if (type == "NFC") {
        out->normalizer = NormalizerKind::kNfc;
        return ok_status();
    }
    if (type == "Sequence") {
        return parse_sequence(*o, "normalizers", where, out, parse_normalizer);
    }
    return unimplemented_error(where + ": normalizer \"" + std::string(type) +
                               "\" is not supported (only NFC)");
}

Status parse_pre_tokenizer(const json::value* v, const std::string& where, TokenizerJson* out) {
    if (v == nullptr || v->is_null()) {
        return ok_status();
    }
    const json::object* o = v->if_object();
    if (o == nullptr) {
        return bad(where, "not an object");
    }
    const std::string_view type = type_of(*o);
    if (type == "Sequence") {
        return parse_sequence(*o, "pretokenizers", where, out, parse_pre_tokenizer);
    }
    if (out->byte_level) {
        // Hugging Face runs a step after ByteLevel on the byte-level-mapped text (a space is
        // already "Ġ"); the split patterns here all run on the text itself.
        return unimplemented_error(where + ": pre-tokenizer \"" + std::string(type) +
                                   "\" after a ByteLevel step is not supported (ByteLevel must "
                                   "be the last step)");
    }
    if (type == "ByteLevel") {
        out->byte_level = true;
        const json::value* prefix = o->if_contains("add_prefix_space");
        if (prefix != nullptr && prefix->is_bool() && prefix->get_bool()) {
            return unimplemented_error(where + ".add_prefix_space: true is not supported");
        }
        const json::value* use_regex = o->if_contains("use_regex");
        // Hugging Face's default for use_regex is true.
        if (use_regex == nullptr || (use_regex->is_bool() && use_regex->get_bool())) {
            out->split_patterns.emplace_back(PreTokenizer::gpt2_pattern());
        }
        return ok_status();
    }
    if (type == "Split") {
        const json::value* behavior = o->if_contains("behavior");
        if (behavior == nullptr || !behavior->is_string() || behavior->get_string() != "Isolated") {
            return unimplemented_error(where + ".behavior: only \"Isolated\" is supported");
        }
        const json::value* invert = o->if_contains("invert");
        if (invert != nullptr && invert->is_bool() && invert->get_bool()) {
            return unimplemented_error(where + ".invert: true is not supported");
        }
        const json::value* pattern = o->if_contains("pattern");
        const json::object* po = pattern ? pattern->if_object() : nullptr;
        const json::value* regex = po ? po->if_contains("Regex") : nullptr;
        const json::value* literal = po ? po->if_contains("String") : nullptr;
        if (regex != nullptr && regex->is_string()) {
            out->split_patterns.emplace_back(regex->get_string());
        } else if (literal != nullptr && literal->is_string() && !literal->get_string().empty()) {
            out->split_patterns.push_back(escape_literal(literal->get_string()));
        } else {
            return bad(where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
        }
        return ok_status();
    }
    return unimplemented_error(where + ": pre-tokenizer \"" + std::string(type) +
                               "\" is not supported");
}

Result<TokenizerJson> parse_root(const json::object& root) {
    TokenizerJson out;
    EDGE_RETURN_IF_ERROR(parse_model(root.if_contains("model"), &out));
    EDGE_RETURN_IF_ERROR(parse_added_tokens(root.if_contains("added_tokens"), &out));
    EDGE_RETURN_IF_ERROR(parse_normalizer(root.if_contains("normalizer"), "normalizer", &out));
    EDGE_RETURN_IF_ERROR(
        parse_pre_tokenizer(root.if_contains("pre_tokenizer"), "pre_tokenizer", &out));
    return out;
}

}  // namespace

Result<TokenizerJson> parse_tokenizer_json(std::string_view text) {
    try {
        EDGE_ASSIGN_OR_RETURN(const json::object root, parse_json_object(text, ""));
        return parse_root(root);
    } catch (const std::exception& e) {
        // Boost.JSON throws only on allocation failure or its own limits here.
        return invalid_argument_error(std::string("cannot parse: ") + e.what());
    }
}

}  // namespace edge::engine::tokenizer
