#pragma once

// ToolCallOutput turns a chat response's generated text into OpenAI `tool_calls` when the request
// offered tools: it runs the model family's tool-call parser (engine/chat/tool_call_parser.h)
// over the text as it streams, and keeps what a non-streaming answer needs (content, the calls by
// index, the finish reason). For tool_choice "required" or a named function it also sets the
// request's assistant_prefix so the reply starts inside a call, and has the parser read that
// prefix first (the call's header is then the first thing the client receives). A forced call
// is not shaped by response_format. A forced call is held: a named one has its arguments
// follow the tool's parameters when it is strict and be any object when not (the call is then
// the whole reply; GLM-4.5's key/value pairs are held as the JSON object they stand for), and
// "required" has the model name one of the tools and follow that one's arguments likewise.
// Under "auto" each call the model opens is held the same way when some tool is strict. After a
// held call the reply goes on with parallel_tool_calls, and ends without it (which holds calls
// under "auto" to non-strict tools too: one call, its arguments any object).
//
// Finish reasons: "tool_calls" when the reply made at least one well-formed call and ended
// normally; "malformed_tool_call" when the model wrote a call that is not well formed (the call's
// text is then returned as content, and a streamed call that was started and then given up is
// listed in the choice's `abandoned_tool_calls`); otherwise the engine's own reason. A forced
// call's prefix is the server's, not the model's: when the model writes nothing after it (an end
// of sequence at once), the reply is empty, with the engine's reason, and holds no prefix.
//
// Threading: one per response; used by the thread that runs the response's sink callbacks.

#include <boost/json.hpp>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "daemon/api/api_error.h"
#include "daemon/api/openai_request.h"
#include "engine/chat/tool_call_parser.h"
#include "engine/generator.h"

namespace edge::daemon::api {

class ToolCallOutput {
  public:
    // For a request with tools (not tool_choice "none"): the parser of the model's tool-call
    // format, as `models` (the generator's list) says. Sets request.generate.assistant_prefix
    // for forced calls. A 400 naming `tools` when the model has no tool-call format; nullptr
    // (no error) when the request offers no tools or the model is not listed (submit() then
    // answers 404). One per choice: `choice` (its index) keeps call ids apart between the
    // choices of a request with n > 1 (call_<request>_<choice>_<k>; n = 1: call_<request>_<k>),
    // and the request is changed (the held call openings) by choice 0's only.
    static std::variant<std::unique_ptr<ToolCallOutput>, ApiError> create(
        ParsedRequest& request, const std::vector<engine::ModelInfo>& models, int32_t choice = 0);

    // Parses the next generated text (the first that is not empty has the forced prefix parsed
    // before it).
    engine::chat::ParsedDelta feed(std::string_view text);
    // The generation ended: what the parser still held.
    engine::chat::ParsedDelta finish();

    // Non-streaming: records a parsed delta (content is the caller's).
    void accumulate(const engine::chat::ParsedDelta& delta);
    // Non-streaming: the calls made, in OpenAI's message.tool_calls shape (empty when none).
    boost::json::array message_tool_calls() const;
    // Streaming: OpenAI's delta.tool_calls for `calls` (index, and id/type/name on a call's first
    // delta).
    static boost::json::array delta_tool_calls(
        const std::vector<engine::chat::ToolCallDelta>& calls);

    // The finish reason given the engine's (`engine_reason` is "stop", "length", ...).
    const char* finish_reason(const char* engine_reason) const;
    // Calls the parser gave up after their first delta went out (streaming); one given up in
    // the delta that started it is dropped from that delta instead.
    const std::vector<int32_t>& abandoned() const { return abandoned_; }
    bool malformed() const { return parser_->malformed(); }

  private:
    struct Call {
        int32_t index = 0;
        std::string id;
        std::string name;
        std::string arguments;
    };

    explicit ToolCallOutput(std::unique_ptr<engine::chat::ToolCallParser> parser)
        : parser_(std::move(parser)) {}

    // Holds calls (SamplingParams::json: its schema or heads, tail and trigger): forced ones
    // always, their arguments to strict tools' parameters (any object for the others), and the
    // reply to one call without parallel_tool_calls.
    // `function`: a forced call's (empty: "required"; response_format's schema is then dropped),
    // nullopt for "auto" (the calls the model opens).
    static void hold_calls(engine::chat::ToolCallFormat format,
                           std::optional<std::string_view> function, ParsedRequest& request);
    // Drops from `out` the calls started and given up within it (never shown), and records the
    // others given up (abandoned()).
    engine::chat::ParsedDelta settle(engine::chat::ParsedDelta out);

    std::unique_ptr<engine::chat::ToolCallParser> parser_;
    std::optional<std::string> prefix_;  // A forced call's opening, parsed by the first feed().
    std::vector<Call> calls_;
    std::vector<int32_t> abandoned_;
};

}  // namespace edge::daemon::api
