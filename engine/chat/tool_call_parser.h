#pragma once

// Tool-call parsers: they split a model's streamed output text into plain content and OpenAI
// tool calls, for the formats the served families write:
//   kHermes (Qwen3):  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   kGlm45 (GLM-4.5): <tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n...</tool_call>
//   kKimiK2:          <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0
//                     <|tool_call_argument_begin|>{...}<|tool_call_end|>...
//                     <|tool_calls_section_end|>
//   kDeepSeekV3:      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f
//                     ```json\n{...}\n```<｜tool▁call▁end｜>\n...<｜tool▁calls▁end｜>
// Text is fed as it is decoded (any split, even inside a marker or a UTF-8 character). Content
// that may be the start of a marker is held back until it is known not to be. A call's first
// delta carries its index, id and name (never a partial name); argument text follows as it is
// written, and only once it is a valid JSON prefix (GLM-4.5's key/value pairs are converted to
// JSON one pair at a time). A call that turns out malformed (bad JSON, a missing closing marker,
// output ending inside it) is given back verbatim as content; malformed() is then true with a
// reason. If its first delta went out in an earlier feed(), its index is listed in
// `abandoned_calls`, so a streaming client can drop what it received of it; if not, its deltas
// are dropped from the one returned and the next call takes its index (the indexes a client sees
// count up from 0 with no gap; ids count every call begun, so they do not depend on the split).
// Output that ends between two calls of a section (Kimi K2, DeepSeek), after a whole call, closes
// the section: its calls stand, as vLLM's parsers take them.
// DeepSeek-V3 also takes a call that opens with <｜tool▁call▁begin｜> alone, as its template
// writes a conversation's later calls (more calls or <｜tool▁calls▁end｜> may follow it; other
// text after it is content); that marker without "function<｜tool▁sep｜>" after it is content.
//
// Threading: one parser per response, used from one thread.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"

namespace edge::engine::chat {

enum class ToolCallFormat { kHermes, kGlm45, kKimiK2, kDeepSeekV3, kDeepSeekV31 };

// "hermes" / "qwen3" -> kHermes, "glm4_5" / "glm45" -> kGlm45, "kimi_k2" -> kKimiK2,
// "deepseek_v3" -> kDeepSeekV3, "deepseek_v3_1" -> kDeepSeekV31.
Result<ToolCallFormat> tool_call_format_from_name(std::string_view name);
std::string_view tool_call_format_name(ToolCallFormat format);

using ToolSpec = engine::ToolSpec;  // engine/generator.h

struct ToolCallDelta {
    int32_t index = 0;      // The call's position in the response's tool_calls.
    std::string id;         // Set on the call's first delta only.
    std::string name;       // Set on the call's first delta only.
    std::string arguments;  // JSON text to append to the call's arguments.
};

struct ParsedDelta {
    std::string content;                    // Plain text to pass on.
    std::vector<ToolCallDelta> tool_calls;  // In order; consecutive deltas of one call merged.
    std::vector<int32_t> abandoned_calls;   // Calls found malformed after an earlier delta
                                            // started them.
};

class ToolCallParser {
  public:
    virtual ~ToolCallParser() = default;

    // The next piece of output text.
    virtual ParsedDelta feed(std::string_view text) = 0;
    // The output ended: flushes held-back content; an unfinished call becomes content.
    virtual ParsedDelta finish() = 0;

    // Calls completed and well formed so far.
    int32_t completed_calls() const { return completed_; }
    // A call was malformed and returned as content.
    bool malformed() const { return !malformed_reason_.empty(); }
    const std::string& malformed_reason() const { return malformed_reason_; }

  protected:
    int32_t completed_ = 0;
    std::string malformed_reason_;
};

// A parser for `format`. Call ids are `id_prefix` + index for formats that carry none (Kimi K2's
// own ids, "functions.f:0", are kept). `tools` tells GLM-4.5's parser which arguments are
// declared strings (kept as text rather than read as JSON); it may be empty.
std::unique_ptr<ToolCallParser> create_tool_call_parser(ToolCallFormat format,
                                                        std::string id_prefix,
                                                        const std::vector<ToolSpec>& tools = {});

// The start of the assistant's reply that forces a tool call in `format` (for GenerateRequest::
// assistant_prefix): the opening marker alone (`function` empty: tool_choice "required"), or the
// marker and the named function up to where its arguments begin (tool_choice naming a function;
// arguments_lead() is the model's to write).
// Feed the same text to the response's parser before the model's output: it is where the call
// begins. `function` must be a valid tool name (the API checks it). `call_index`: Kimi K2's ids
// ("functions.f:3") number the calls of the whole conversation, so a named call takes the
// number of calls made before it.
std::string forced_call_prefix(ToolCallFormat format, std::string_view function,
                               size_t call_index = 0);

// What the format's template writes before a call's opening that is not part of the reply the
// parser reads: GLM-4.5 writes "\n" between "<think></think>" and "<tool_call>". A forced call's
// assistant_prefix is this followed by forced_call_prefix(), so the model continues the text
// it was trained on; the parser is fed forced_call_prefix() alone.
std::string_view forced_call_lead(ToolCallFormat format);

// What the format writes between a named call's head and its arguments that the model writes
// itself, as the first bytes of its reply: Hermes's `"arguments": ` ends in a space, which the
// model was trained to write fused with the arguments' first token (" {"). A forced prefix
// ending in it would leave a lone space token at the end of the prompt, a text the model never
// saw; forced_call_prefix() stops before it, held_call_head() includes it, and a call held to
// a strict tool's parameters starts with it. Empty for the other formats.
std::string_view arguments_lead(ToolCallFormat format);

// What closes a call once its arguments are written (JsonReply::tail: a held call is held to
// it): after the JSON object, or after GLM-4.5's last key/value pair.
std::string forced_call_tail(ToolCallFormat format);

// A held call's head (sampling::JsonHead): what follows forced_call_prefix(format, "") up to the
// arguments of a call naming `function` (arguments_lead() included), and where in it the model
// writes a number of its own (Kimi K2's call index, "functions.f:3", which its ids carry and which
// counts up within a reply; -1: none).
struct CallHead {
    std::string text;
    int32_t number_at = -1;
};
CallHead held_call_head(ToolCallFormat format, std::string_view function);

// Where the formats whose tail closes a section of calls (Kimi K2, DeepSeek-V3 and V3.1) may
// instead go on with another call in the same section: the tail's first `at` bytes end the call,
// and `text` begins the next (sampling::JsonReply::next_at / next). `text` empty: each call is
// its own block (Qwen, GLM-4.5).
struct NextCall {
    size_t at = 0;
    std::string text;
};
NextCall next_call_in_section(ToolCallFormat format);

// Whether `format` writes a call's arguments as key/value pairs (GLM-4.5) rather than JSON.
bool arguments_as_pairs(ToolCallFormat format);

// The parameters of `tool` whose values GLM-4.5's calls write as raw text rather than JSON: those
// declared `"type": "string"` in its parameters' `properties`. Sorted, no duplicates.
std::vector<std::string> glm45_string_arguments(const ToolSpec& tool);

}  // namespace edge::engine::chat
