// Tool-call parser for the Qwen3 / Hermes format (see engine/chat/tool_call_parser.h).

#include <string>
#include <string_view>

#include "common/json_text.h"
#include "engine/chat/json_stream.h"
#include "engine/chat/marker_parser.h"

namespace edge::engine::chat::detail {
namespace {

namespace json = boost::json;

// Qwen3 / Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
class HermesParser final : public MarkerParser {
  public:
    explicit HermesParser(std::string id_prefix)
        : MarkerParser("<tool_call>", std::move(id_prefix)) {}

  private:
    enum class State { kLead, kJson, kTail };
    void begin_call() override {
        state_ = State::kLead;
        // The call object holds the arguments, which may nest as deep as the server reads back.
        json_ = JsonStream(kMaxJsonDepth + 1);
        name_on_ = args_on_ = args_done_ = false;
        name_json_.clear();
        pending_args_.clear();
    }

    Step step(ParsedDelta& out) override {
        while (!buf_.empty()) {
            if (state_ == State::kLead) {
                if (!skip_space()) {
                    return Step::kNeedMore;
                }
                if (buf_[0] != '{') {
                    take(1);
                    return malformed("a tool call does not start with a JSON object");
                }
                state_ = State::kJson;
            }
            if (state_ == State::kJson) {
                const char c = take(1)[0];
                const bool value_starts = json_.expecting_top_value() && !is_space(c);
                const std::string& key = json_.top_key();
                const JsonStream::Result r = json_.feed(c);
                if (r == JsonStream::Result::kInvalid) {
                    // A key given twice, at any depth, included: json_ refuses it at its closing
                    // quote. Last-wins would not do: the first value has streamed (a second
                    // "arguments" would append a second object to the first, a second "name"
                    // would start the call again, {"a": 1, "a": 2} in the arguments is read as
                    // either value or refused).
                    return malformed("a tool call is not valid JSON: " + json_.error());
                }
                if (value_starts && key == "name") {
                    name_on_ = true;
                } else if (value_starts && key == "arguments") {
                    if (c != '{') {
                        return malformed("a tool call's arguments are not a JSON object");
                    }
                    args_on_ = true;
                } else if (value_starts) {
                    // Read as a call with no arguments, {"name": "f", "parameters": {...}}
                    // would run f with none of what the model gave it.
                    return malformed("a tool call has a key other than \"name\" and "
                                     "\"arguments\"");
                }
                if (name_on_) {
                    name_json_ += c;
                }
                if (args_on_) {
                    if (started_) {
                        emit_args(out, std::string_view(&c, 1));
                    } else {
                        pending_args_ += c;
                    }
                }
                if (name_on_ && json_.at_top_value_end()) {
                    name_on_ = false;
                    std::error_code ec;
                    json::value v = parse_json(name_json_, ec);
                    if (ec || !v.is_string() || v.get_string().empty()) {
                        return malformed("a tool call's name is not a non-empty string");
                    }
                    emit_start(out, next_id(), std::string(v.get_string()));
                    if (!pending_args_.empty()) {
                        emit_args(out, pending_args_);
                    }
                } else if (args_on_ && json_.at_top_value_end()) {
                    args_on_ = false;
                    args_done_ = true;
                }
                if (r == JsonStream::Result::kDone) {
                    if (!started_) {
                        return malformed("a tool call has no \"name\"");
                    }
                    if (!args_done_) {
                        emit_args(out, "{}");
                    }
                    state_ = State::kTail;
                }
                continue;
            }
            if (!skip_space()) {
                return Step::kNeedMore;
            }
            switch (starts_with(buf_, "</tool_call>")) {
                case Lit::kPartial:
                    return Step::kNeedMore;
                case Lit::kNo:
                    take(1);
                    return malformed("a tool call's JSON is not followed by </tool_call>");
                case Lit::kYes:
                    buf_.erase(0, 12);
                    finish_call();
                    return Step::kDone;
            }
        }
        return Step::kNeedMore;
    }

    State state_ = State::kLead;
    JsonStream json_;  // The call's object, "arguments" in it.
    bool name_on_ = false;
    bool args_on_ = false;
    bool args_done_ = false;
    std::string name_json_;
    std::string pending_args_;
};

}  // namespace

std::unique_ptr<ToolCallParser> make_hermes_parser(std::string id_prefix) {
    return std::make_unique<HermesParser>(std::move(id_prefix));
}

}  // namespace edge::engine::chat::detail
