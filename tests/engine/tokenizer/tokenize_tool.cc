// tokenize_tool: the engine's tokenizer behind a line protocol, for tests that compare it with
// another implementation (tests/node/tokenizer_crosscheck.mjs).
//
// Usage: tokenize_tool MODEL_DIR
// Loads MODEL_DIR's tokenizer as engine/engine.cc does (tokenizer.json, else tiktoken.model),
// then answers one JSON line on stdout for each JSON line on stdin:
//   {"op":"encode","text":"...","special":true}  ->  {"ids":[...]}
//   {"op":"split","text":"..."}                  ->  {"pieces":[...]} (Tokenizer::pre_tokenize)
//   {"op":"decode","ids":[...]}                   ->  {"text":"..."} or, when the bytes are not
//                                                     valid UTF-8, {"bytes":[...]}
// A request it cannot serve gets {"error":"..."}; the tool keeps reading.

#include <boost/json.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/tiktoken.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace {

namespace json = boost::json;
using edge::engine::TokenId;
using edge::engine::tokenizer::Tokenizer;

edge::Result<std::unique_ptr<Tokenizer>> load(const std::string& dir) {
    return edge::engine::tokenizer::load_checkpoint_tokenizer(dir);
}

json::object error(const std::string& what) { return json::object{{"error", what}}; }

json::object encode(const Tokenizer& tok, const json::object& req) {
    const json::value* text = req.if_contains("text");
    if (text == nullptr || !text->is_string()) {
        return error("encode needs a string \"text\"");
    }
    bool special = true;
    if (const json::value* s = req.if_contains("special"); s != nullptr && s->is_bool()) {
        special = s->get_bool();
    }
    auto ids = tok.encode(std::string_view(text->get_string()), special);
    if (!ids.ok()) {
        return error(ids.status().to_string());
    }
    json::array out;
    for (TokenId id : *ids) {
        out.push_back(id);
    }
    return json::object{{"ids", std::move(out)}};
}

json::object split(const Tokenizer& tok, const json::object& req) {
    const json::value* text = req.if_contains("text");
    if (text == nullptr || !text->is_string()) {
        return error("split needs a string \"text\"");
    }
    auto pieces = tok.pre_tokenize(std::string_view(text->get_string()));
    if (!pieces.ok()) {
        return error(pieces.status().to_string());
    }
    json::array out;
    for (const std::string& p : *pieces) {
        out.push_back(json::string(p));
    }
    return json::object{{"pieces", std::move(out)}};
}

json::object decode(const Tokenizer& tok, const json::object& req) {
    const json::value* ids = req.if_contains("ids");
    if (ids == nullptr || !ids->is_array()) {
        return error("decode needs an array \"ids\"");
    }
    std::vector<TokenId> list;
    for (const json::value& v : ids->get_array()) {
        if (!v.is_int64()) {
            return error("ids must be integers");
        }
        list.push_back(static_cast<TokenId>(v.get_int64()));
    }
    const std::string text = tok.decode(list);
    if (edge::engine::tokenizer::utf8_is_valid(text)) {
        return json::object{{"text", text}};
    }
    json::array bytes;
    for (char c : text) {
        bytes.push_back(static_cast<uint8_t>(c));
    }
    return json::object{{"bytes", std::move(bytes)}};
}

json::object answer(const Tokenizer& tok, const std::string& line) {
    boost::system::error_code ec;
    json::value req = json::parse(line, ec);
    if (ec || !req.is_object()) {
        return error("not a JSON object");
    }
    const json::value* op = req.get_object().if_contains("op");
    if (op != nullptr && op->is_string() && op->get_string() == "encode") {
        return encode(tok, req.get_object());
    }
    if (op != nullptr && op->is_string() && op->get_string() == "split") {
        return split(tok, req.get_object());
    }
    if (op != nullptr && op->is_string() && op->get_string() == "decode") {
        return decode(tok, req.get_object());
    }
    return error("op must be \"encode\", \"split\" or \"decode\"");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::cerr << "usage: tokenize_tool MODEL_DIR\n";
        return 2;
    }
    auto tok = load(argv[1]);
    if (!tok.ok()) {
        std::cerr << "tokenize_tool: " << tok.status().to_string() << "\n";
        return 1;
    }
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) {
            continue;
        }
        std::cout << json::serialize(answer(**tok, line)) << '\n' << std::flush;
    }
    return 0;
}
