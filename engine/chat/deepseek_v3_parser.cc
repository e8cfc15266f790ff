// Tool-call parsers for the DeepSeek-V3 and V3.1 formats (see engine/chat/tool_call_parser.h).

#include <string>
#include <string_view>

#include "engine/chat/json_stream.h"
#include "engine/chat/marker_parser.h"

namespace edge::engine::chat::detail {
namespace {

// DeepSeek-V3: a section of calls, each "function", the name on its own line, then the JSON
// arguments in a ```json fence. V3.1 (`v3_1`): each call is the name, <｜tool▁sep｜>, then the
// JSON arguments as they are.
//
// V3 also takes a call that opens with <｜tool▁call▁begin｜> and no <｜tool▁calls▁begin｜>: its
// template writes every call of a conversation after the first so ("\n", the call, then
// <｜tool▁calls▁end｜>), and a model that copies that form is calling a tool (vLLM's streaming
// parser starts a call at that marker too). More calls or <｜tool▁calls▁end｜> may follow it;
// anything else after it is content. A bare marker not followed by "function<｜tool▁sep｜>" is
// text that mentions it: content, the response not malformed. V3.1's template always opens the
// section, so V3.1 does not take the bare form.
class DeepSeekV3Parser final : public MarkerParser {
  public:
    DeepSeekV3Parser(std::string id_prefix, bool v3_1)
        : MarkerParser("<｜tool▁calls▁begin｜>", std::move(id_prefix),
                       v3_1 ? "" : std::string(kBegin)),
          v3_1_(v3_1) {}

  private:
    static constexpr std::string_view kBegin = "<｜tool▁call▁begin｜>";
    static constexpr std::string_view kSep = "<｜tool▁sep｜>";
    static constexpr std::string_view kEndCall = "<｜tool▁call▁end｜>";
    static constexpr std::string_view kEndSection = "<｜tool▁calls▁end｜>";

    enum class State {
        kBetween,
        kBareHead,
        kType,
        kSep,
        kName,
        kFence,
        kLead,
        kArgs,
        kClose,
        kEnd
    };
    void begin_call() override { state_ = bare() ? State::kBareHead : State::kBetween; }

    Step step(ParsedDelta& out) override {
        while (true) {
            switch (state_) {
                case State::kBareHead: {
                    static const std::string kHead = "function" + std::string(kSep);
                    switch (starts_with(buf_, kHead)) {
                        case Lit::kPartial:
                            return Step::kNeedMore;
                        case Lit::kNo:
                            return Step::kNotACall;
                        case Lit::kYes:
                            take(kHead.size());
                            state_ = State::kName;
                            break;
                    }
                    break;
                }
                case State::kBetween: {
                    if (bare() && !bare_call_goes_on()) {
                        // Text follows the call (or may: kNeedMore); it is left for content.
                        return after_bare_call_;
                    }
                    if (std::optional<Step> s = between_calls(kBegin, kEndSection)) {
                        return *s;
                    }
                    state_ = v3_1_ ? State::kName : State::kType;
                    break;
                }
                case State::kType: {
                    const Step s = expect("function", "a tool call's type is not \"function\"");
                    if (s != Step::kDone) {
                        return s;
                    }
                    state_ = State::kSep;
                    break;
                }
                case State::kSep: {
                    const Step s =
                        expect(kSep, "a tool call's type is not followed by <｜tool▁sep｜>");
                    if (s != Step::kDone) {
                        return s;
                    }
                    state_ = State::kName;
                    break;
                }
                case State::kName: {
                    if (v3_1_) {
                        const Step s = name_before_sep(out, kSep);
                        if (s != Step::kDone) {
                            return s;
                        }
                        state_ = State::kLead;
                        break;
                    }
                    const size_t at = buf_.find('\n');
                    if (at == std::string::npos) {
                        return buf_.size() > kMaxHeader
                                   ? malformed("a tool call's name is too long")
                                   : Step::kNeedMore;
                    }
                    std::string name = take(at + 1);
                    while (!name.empty() && is_space(name.back())) {
                        name.pop_back();
                    }
                    if (name.empty() || name.find_first_of(" \t\r<`") != std::string::npos) {
                        return malformed("a tool call's name '" + name + "' is not a name");
                    }
                    emit_start(out, next_id(), name);
                    json_ = JsonStream();
                    state_ = State::kFence;
                    break;
                }
                case State::kFence: {
                    if (!skip_space()) {
                        return Step::kNeedMore;
                    }
                    const Step s =
                        expect("```json", "a tool call's arguments do not open with ```json");
                    if (s != Step::kDone) {
                        return s;
                    }
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
                    state_ = v3_1_ ? State::kEnd : State::kClose;
                    break;
                }
                case State::kClose: {
                    if (!skip_space()) {
                        return Step::kNeedMore;
                    }
                    const Step s = expect("```", "a tool call's arguments are not closed by ```");
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
                                          "<｜tool▁call▁end｜>");
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

    // After a bare call: whether a call or <｜tool▁calls▁end｜> follows (whitespace first), for
    // between_calls() to take. If not, nothing is consumed: after_bare_call_ is kDone when other
    // text follows (content), kNeedMore while the buffer may still begin either marker.
    bool bare_call_goes_on() {
        const size_t at = buf_.find_first_not_of(" \t\r\n");
        if (at == std::string::npos) {
            after_bare_call_ = Step::kNeedMore;
            return false;
        }
        const std::string rest = buf_.substr(at, std::max(kBegin.size(), kEndSection.size()));
        const Lit call = starts_with(rest, kBegin);
        const Lit end = starts_with(rest, kEndSection);
        if (call == Lit::kYes || end == Lit::kYes) {
            return true;
        }
        after_bare_call_ =
            call == Lit::kPartial || end == Lit::kPartial ? Step::kNeedMore : Step::kDone;
        return false;
    }

    // V3.1: the name up to <｜tool▁sep｜> (taken with it); starts the call.
    Step name_before_sep(ParsedDelta& out, std::string_view sep) {
        const size_t at = buf_.find(sep);
        if (at == std::string::npos) {
            return buf_.size() > kMaxHeader ? malformed("a tool call's name is too long")
                                            : Step::kNeedMore;
        }
        std::string name = take(at);
        take(sep.size());
        while (!name.empty() && is_space(name.back())) {
            name.pop_back();
        }
        while (!name.empty() && is_space(name.front())) {
            name.erase(name.begin());
        }
        if (name.empty() || name.find_first_of(" \t\r\n<`") != std::string::npos) {
            return malformed("a tool call's name '" + name + "' is not a name");
        }
        emit_start(out, next_id(), name);
        json_ = JsonStream();
        return Step::kDone;
    }

    const bool v3_1_;
    State state_ = State::kBetween;
    Step after_bare_call_ = Step::kNeedMore;  // See bare_call_goes_on().
    JsonStream json_;
};

}  // namespace

std::unique_ptr<ToolCallParser> make_deepseek_v3_parser(std::string id_prefix) {
    return std::make_unique<DeepSeekV3Parser>(std::move(id_prefix), false);
}

std::unique_ptr<ToolCallParser> make_deepseek_v3_1_parser(std::string id_prefix) {
    return std::make_unique<DeepSeekV3Parser>(std::move(id_prefix), true);
}

}  // namespace edge::engine::chat::detail
