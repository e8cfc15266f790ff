// Tool-call parser for the Kimi K2 format (see engine/chat/tool_call_parser.h).

#include <string>
#include <string_view>

#include "engine/chat/json_stream.h"
#include "engine/chat/marker_parser.h"

namespace edge::engine::chat::detail {
namespace {

namespace json = boost::json;

// Kimi K2: a section of calls, each functions.name:idx then JSON arguments.
class KimiK2Parser final : public MarkerParser {
  public:
    explicit KimiK2Parser(std::string id_prefix)
        : MarkerParser("<|tool_calls_section_begin|>", std::move(id_prefix)) {}

  private:
    enum class State { kBetween, kId, kLead, kArgs, kEnd };
    void begin_call() override { state_ = State::kBetween; }

    Step step(ParsedDelta& out) override {
        static constexpr std::string_view kBegin = "<|tool_call_begin|>";
        static constexpr std::string_view kArgBegin = "<|tool_call_argument_begin|>";
        static constexpr std::string_view kEndCall = "<|tool_call_end|>";
        static constexpr std::string_view kEndSection = "<|tool_calls_section_end|>";
        while (true) {
            switch (state_) {
                case State::kBetween: {
                    if (std::optional<Step> s = between_calls(kBegin, kEndSection)) {
                        return *s;
                    }
                    state_ = State::kId;
                    break;
                }
                case State::kId: {
                    const size_t at = buf_.find(kArgBegin);
                    if (at == std::string::npos) {
                        return buf_.size() > kMaxHeader + kArgBegin.size()
                                   ? malformed("a tool call's id is too long")
                                   : Step::kNeedMore;
                    }
                    std::string id = take(at);
                    take(kArgBegin.size());
                    // Whitespace either side of the id is not part of it (vLLM's pattern allows
                    // it: "<|tool_call_begin|>\nfunctions.f:0").
                    while (!id.empty() && is_space(id.back())) {
                        id.pop_back();
                    }
                    while (!id.empty() && is_space(id.front())) {
                        id.erase(id.begin());
                    }
                    std::string name = id;
                    if (name.rfind("functions.", 0) == 0) {
                        name.erase(0, 10);
                    }
                    const size_t colon = name.rfind(':');
                    if (colon != std::string::npos) {
                        name.erase(colon);
                    }
                    if (name.empty() || name.find_first_of(" \t\r\n<") != std::string::npos) {
                        return malformed("a tool call's id '" + id + "' names no function");
                    }
                    emit_start(out, id, name);
                    json_ = JsonStream();
                    state_ = State::kLead;
                    break;
                }
                case State::kLead:
                    if (!skip_space()) {
                        return Step::kNeedMore;
                    }
                    if (buf_[0] != '{') {
                        take(1);
                        return malformed("a tool call's arguments are not a JSON object");
                    }
                    state_ = State::kArgs;
                    break;
                case State::kArgs: {
                    const Step s = stream_arguments(out, json_);
                    if (s != Step::kDone) {
                        return s;
                    }
                    state_ = State::kEnd;
                    break;
                }
                case State::kEnd: {
                    if (!skip_space()) {
                        return Step::kNeedMore;
                    }
                    const Step s = expect(kEndCall,
                                          "a tool call's arguments are not followed by "
                                          "<|tool_call_end|>");
                    if (s != Step::kDone) {
                        return s;
                    }
                    finish_call();
                    state_ = State::kBetween;
                    break;
                }
            }
        }
    }

    State state_ = State::kBetween;
    JsonStream json_;
};

}  // namespace

std::unique_ptr<ToolCallParser> make_kimi_k2_parser(std::string id_prefix) {
    return std::make_unique<KimiK2Parser>(std::move(id_prefix));
}

}  // namespace edge::engine::chat::detail
