// libFuzzer: JsonPrefix (the json_object response format's grammar) against Boost.JSON. The
// input is fed in pieces (the first byte sets their length, as a tokenizer's tokens would split
// it); pieces it refuses are skipped. Whatever it accepted and calls complete must be a JSON
// object by Boost.JSON's reading, and a refused piece must leave the prefix as it was. The first
// byte's high bit gives the prefix heads and a tail (a forced tool call's start and end): then
// what is complete is a head, an object, the tail (with bit 0x20, several such calls in a
// section, JsonReply::next). With bit 0x40 too, the heads' arguments
// are GLM-4.5's key/value pairs: what is complete must be one well-formed call by GLM-4.5's
// parser, whose arguments Boost.JSON reads as an object. No object of what is complete may
// have a key twice (Boost.JSON's parse silently keeps one of them; its events tell).
#include <algorithm>
#include <boost/json.hpp>
#include <boost/json/basic_parser_impl.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "common/json_text.h"
#include "engine/chat/tool_call_parser.h"
#include "engine/sampling/json_prefix.h"
#include "tests/fuzz/json_feed.h"

namespace {

// Boost.JSON parser events: whether an object has a key twice, keys compared as decoded.
struct DuplicateKeys {
    using error_code = boost::system::error_code;
    using string_view = boost::json::string_view;
    static constexpr std::size_t max_array_size = -1;
    static constexpr std::size_t max_object_size = -1;
    static constexpr std::size_t max_string_size = -1;
    static constexpr std::size_t max_key_size = -1;
    bool on_document_begin(error_code&) { return true; }
    bool on_document_end(error_code&) { return true; }
    bool on_array_begin(error_code&) { return true; }
    bool on_array_end(std::size_t, error_code&) { return true; }
    bool on_object_begin(error_code&) {
        objects.emplace_back();
        return true;
    }
    bool on_object_end(std::size_t, error_code&) {
        objects.pop_back();
        return true;
    }
    bool on_string_part(string_view, std::size_t, error_code&) { return true; }
    bool on_string(string_view, std::size_t, error_code&) { return true; }
    bool on_key_part(string_view s, std::size_t, error_code&) {
        key.append(s.data(), s.size());
        return true;
    }
    bool on_key(string_view s, std::size_t, error_code&) {
        key.append(s.data(), s.size());
        found = found || !objects.back().insert(key).second;
        key.clear();
        return true;
    }
    bool on_number_part(string_view, error_code&) { return true; }
    bool on_int64(int64_t, string_view, error_code&) { return true; }
    bool on_uint64(uint64_t, string_view, error_code&) { return true; }
    bool on_double(double, string_view, error_code&) { return true; }
    bool on_bool(bool, error_code&) { return true; }
    bool on_null(error_code&) { return true; }
    bool on_comment_part(string_view, error_code&) { return true; }
    bool on_comment(string_view, error_code&) { return true; }

    std::vector<std::set<std::string>> objects;  // The open objects' keys.
    std::string key;
    bool found = false;
};

// Aborts unless `doc` is one JSON value (what may follow it aside) with no key twice in an
// object.
void check_keys_once(std::string_view doc) {
    boost::json::basic_parser<DuplicateKeys> parser(edge::json_parse_options());
    boost::system::error_code ec;
    parser.write_some(false, doc.data(), doc.size(), ec);
    if (ec || !parser.done() || parser.handler().found) {
        std::abort();  // Complete by JsonPrefix, with a key given twice.
    }
}

// GLM-4.5's pairs, as a call to f (any object) or g (a schema), "s" a declared string in both.
int pairs_input(std::string_view rest, size_t piece) {
    namespace chat = edge::engine::chat;
    using edge::engine::sampling::ArgumentPairs;
    using edge::engine::sampling::JsonReply;
    using edge::engine::sampling::JsonSchema;
    static const std::vector<edge::engine::ToolSpec> tools = [] {
        const char* g = R"({"type":"object","properties":{"s":{"type":"string","maxLength":8},)"
                        R"("n":{"type":"integer"},"a":{"type":"array"}},"required":["n"]})";
        return std::vector<edge::engine::ToolSpec>{
            {"f", "", R"({"type":"object","properties":{"s":{"type":"string"}}})", nullptr},
            {"g", "", g, *JsonSchema::compile(boost::json::parse(g))}};
    }();
    static const JsonReply reply = [] {
        JsonReply r;
        for (const edge::engine::ToolSpec& t : tools) {
            r.heads.push_back({t.name + "\n",
                               t.strict_schema ? t.strict_schema : JsonSchema::any_object(),
                               std::make_shared<const ArgumentPairs>(
                                   ArgumentPairs{chat::glm45_string_arguments(t)})});
        }
        r.tail = chat::forced_call_tail(chat::ToolCallFormat::kGlm45);
        return r;
    }();
    edge::engine::sampling::JsonPrefix prefix(reply);
    const std::string accepted = edge::fuzz::feed_in_pieces(prefix, rest, piece);
    if (!prefix.complete()) {
        return 0;
    }
    auto parser = chat::create_tool_call_parser(chat::ToolCallFormat::kGlm45, "call_", tools);
    chat::ParsedDelta d = parser->feed("<tool_call>" + accepted);
    chat::ParsedDelta end = parser->finish();
    if (parser->completed_calls() != 1 || parser->malformed() || !d.content.empty() ||
        !end.content.empty()) {
        std::abort();  // Complete by JsonPrefix, not one call by GLM-4.5's parser.
    }
    std::string args;
    for (const chat::ToolCallDelta& c : d.tool_calls) {
        args += c.arguments;
    }
    std::error_code ec;
    const boost::json::value v = edge::parse_json(args, ec);
    if (ec || !v.is_object() || (accepted.starts_with("g") && !v.as_object().contains("n"))) {
        std::abort();  // Arguments that are not an object, or lack g's required "n".
    }
    check_keys_once(args);
    return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) {
        return 0;
    }
    using edge::engine::sampling::JsonHead;
    using edge::engine::sampling::JsonPrefix;
    using edge::engine::sampling::JsonReply;
    using edge::engine::sampling::JsonSchema;
    const size_t piece = 1 + data[0] % 8;
    const bool framed = (data[0] & 0x80) != 0;
    if (framed && (data[0] & 0x40) != 0) {
        return pairs_input(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1),
                           piece);
    }
    // Framed: heads, an object, the tail; with bit 0x20 a section of such calls, each after the
    // first begun by "<n>" written after the tail's first two bytes (JsonReply::next).
    static const JsonReply one = [] {
        JsonReply r;
        r.heads = {{"<a>", JsonSchema::any_object()},
                   {"<ab>", JsonSchema::any_object()},
                   {"{\"b\": ", JsonSchema::any_object()}};
        r.tail = "}\n</end>";
        return r;
    }();
    static const JsonReply section = [] {
        JsonReply r = one;
        r.next_at = 2;
        r.next = "<n>";
        return r;
    }();
    const JsonReply& reply = (data[0] & 0x20) != 0 ? section : one;
    std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    JsonPrefix prefix = framed ? JsonPrefix(reply) : JsonPrefix();
    const std::string accepted = edge::fuzz::feed_in_pieces(prefix, rest, piece);
    if (!prefix.complete()) {
        return 0;
    }
    std::string_view text = accepted;
    for (;;) {
        if (framed) {
            const auto head =
                std::find_if(reply.heads.begin(), reply.heads.end(),
                             [&](const JsonHead& h) { return text.starts_with(h.text); });
            if (head == reply.heads.end()) {
                std::abort();  // Complete without its head.
            }
            text.remove_prefix(head->text.size());
        }
        // One object by Boost.JSON, as deep as the server reads JSON, and where it ends.
        boost::json::parser parser({}, edge::json_parse_options());
        boost::system::error_code ec;
        const size_t used = parser.write_some(text.data(), text.size(), ec);
        if (ec || !parser.release().is_object()) {
            std::abort();  // Complete by JsonPrefix, not an object by Boost.JSON.
        }
        check_keys_once(text.substr(0, used));
        text.remove_prefix(used);
        if (!framed) {
            break;
        }
        const std::string_view end = std::string_view(reply.tail).substr(0, 2);
        if (!text.starts_with(end)) {
            std::abort();  // The object is not followed by the tail.
        }
        text.remove_prefix(end.size());
        if (text == std::string_view(reply.tail).substr(2)) {
            break;
        }
        if (reply.next.empty() || !text.starts_with(reply.next)) {
            std::abort();  // Neither the tail's rest nor the next call.
        }
        text.remove_prefix(reply.next.size());
    }
    if (!framed) {
        for (const char c : text) {
            if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
                std::abort();  // Only whitespace after the object.
            }
        }
    }
    return 0;
}
