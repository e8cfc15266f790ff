// Tool-call parser for the GLM-4.5 format (see engine/chat/tool_call_parser.h).

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_text.h"
#include "engine/chat/json_stream.h"
#include "engine/chat/marker_parser.h"

namespace edge::engine::chat::detail {
namespace {

namespace json = boost::json;

// GLM-4.5: <tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...</tool_call>.
class Glm45Parser final : public MarkerParser {
  public:
    Glm45Parser(std::string id_prefix, const std::vector<ToolSpec>& tools)
        : MarkerParser("<tool_call>", std::move(id_prefix)) {
        for (const ToolSpec& t : tools) {
            for (const std::string& key : glm45_string_arguments(t)) {
                string_args_.insert(t.name + "\n" + key);
            }
        }
    }

  private:
    enum class State { kName, kBetween, kKey, kBeforeValue, kValue };
    void begin_call() override {
        state_ = State::kName;
        args_ = 0;
        searched_ = 0;
        keys_.clear();
    }

    // The JSON text of one argument value as written between the tags, numbers spelled as
    // Python writes them (as vLLM's parser returns them); the model's own text, trimmed, when
    // a number is past a double's range (written again it would be null). An error when the
    // value is JSON that gives a key twice in one of its objects: Boost.JSON keeps the last
    // ({"b": 1, "b": 2} was written {"b": 2}), another reader may take the first or refuse it;
    // refused, as a key given twice among the pairs is. An error too when the value nests more
    // than kMaxValueDepth containers: the arguments object around it would take it past what the
    // server reads back (a client sending the call in its history would get a 400).
    Result<std::string> value_json(const std::string& key, const std::string& value) const {
        if (string_args_.count(name_ + "\n" + key) == 0) {
            std::error_code ec;
            json::value v = parse_json(value, ec, nullptr, kMaxValueDepth);
            if (ec == json::error::too_deep) {
                return invalid_argument_error(
                    "a tool call's argument " + quote(key) + " nests more than " +
                    std::to_string(kMaxValueDepth) + " arrays and objects (" +
                    std::to_string(kMaxJsonDepth) + " with the arguments object around it)");
            }
            if (!ec) {
                if (v.is_object() || v.is_array()) {
                    JsonStream keys;
                    for (size_t i = 0; i < value.size() && !keys.invalid(); ++i) {
                        static_cast<void>(keys.feed(value[i]));
                    }
                    if (keys.repeated_key()) {
                        return invalid_argument_error("a tool call's argument " + quote(key) +
                                                      " is not valid JSON: " + keys.error());
                    }
                }
                if (finite(v)) {
                    return json_text(v);
                }
                const size_t begin = value.find_first_not_of(" \t\r\n");
                const size_t end = value.find_last_not_of(" \t\r\n");
                return value.substr(begin, end + 1 - begin);
            }
        }
        return quote(value);
    }

    // The arguments object the pairs become is a container around every value.
    static constexpr size_t kMaxValueDepth = kMaxJsonDepth - 1;

    static bool finite(const json::value& v) {
        switch (v.kind()) {
            case json::kind::double_:
                return std::isfinite(v.get_double());
            case json::kind::array:
                return std::all_of(v.get_array().begin(), v.get_array().end(),
                                   [](const json::value& e) { return finite(e); });
            case json::kind::object:
                return std::all_of(v.get_object().begin(), v.get_object().end(),
                                   [](const auto& e) { return finite(e.value()); });
            default:
                return true;
        }
    }

    // Takes text up to `end` into *out; kNeedMore until `end` arrives. The search resumes where
    // the last one stopped (a value arrives a token at a time: searching all of it again at
    // every token was quadratic in its length).
    Step until(std::string_view end, std::string* out, const char* what) {
        const size_t at = buf_.find(end, std::min(searched_, buf_.size()));
        if (at == std::string::npos) {
            if (buf_.size() > (size_t{1} << 20)) {
                return malformed(std::string("a tool call's ") + what + " has no end");
            }
            // `end` cannot begin before the last end.size() - 1 bytes.
            searched_ = buf_.size() >= end.size() ? buf_.size() - end.size() + 1 : 0;
            return Step::kNeedMore;
        }
        searched_ = 0;
        *out = take(at);
        take(end.size());
        return Step::kDone;
    }

    Step step(ParsedDelta& out) override {
        while (true) {
            switch (state_) {
                case State::kName: {
                    const size_t at = buf_.find_first_of("\n<");
                    if (at == std::string::npos) {
                        return buf_.size() > kMaxHeader
                                   ? malformed("a tool call's name is too long")
                                   : Step::kNeedMore;
                    }
                    std::string name = take(at);
                    while (!name.empty() && is_space(name.back())) {
                        name.pop_back();
                    }
                    while (!name.empty() && is_space(name.front())) {
                        name.erase(0, 1);
                    }
                    if (name.empty() || name.find_first_of(" \t\r") != std::string::npos) {
                        return malformed("a tool call has no function name");
                    }
                    name_ = name;
                    emit_start(out, next_id(), name);
                    state_ = State::kBetween;
                    break;
                }
                case State::kBetween:
                    if (!skip_space()) {
                        return Step::kNeedMore;
                    }
                    if (Lit l = starts_with(buf_, "<arg_key>"); l != Lit::kNo) {
                        if (l == Lit::kPartial) {
                            return Step::kNeedMore;
                        }
                        take(9);
                        state_ = State::kKey;
                        break;
                    }
                    switch (starts_with(buf_, "</tool_call>")) {
                        case Lit::kPartial:
                            return Step::kNeedMore;
                        case Lit::kNo:
                            take(1);
                            return malformed("expected <arg_key> or </tool_call> in a tool call");
                        case Lit::kYes:
                            buf_.erase(0, 12);
                            emit_args(out, args_ == 0 ? "{}" : "}");
                            finish_call();
                            return Step::kDone;
                    }
                    break;
                case State::kKey: {
                    const Step s = until("</arg_key>", &key_, "argument key");
                    if (s != Step::kDone) {
                        return s;
                    }
                    // The pairs become one JSON object as they stream: a key given twice would
                    // write {"a": 1, "a": 2}, which readers take as either value or refuse.
                    if (!keys_.insert(key_).second) {
                        return malformed("a tool call gives the argument " + quote(key_) +
                                         " twice");
                    }
                    state_ = State::kBeforeValue;
                    break;
                }
                case State::kBeforeValue:
                    if (!skip_space()) {
                        return Step::kNeedMore;
                    }
                    switch (starts_with(buf_, "<arg_value>")) {
                        case Lit::kPartial:
                            return Step::kNeedMore;
                        case Lit::kNo:
                            take(1);
                            return malformed("an <arg_key> is not followed by <arg_value>");
                        case Lit::kYes:
                            take(11);
                            state_ = State::kValue;
                            break;
                    }
                    break;
                case State::kValue: {
                    std::string value;
                    const Step s = until("</arg_value>", &value, "argument value");
                    if (s != Step::kDone) {
                        return s;
                    }
                    const Result<std::string> json = value_json(key_, value);
                    if (!json.ok()) {
                        return malformed(json.status().message());
                    }
                    emit_args(out,
                              std::string(args_ == 0 ? "{" : ", ") + quote(key_) + ": " + *json);
                    ++args_;
                    state_ = State::kBetween;
                    break;
                }
            }
        }
    }

    std::set<std::string> string_args_;  // "function\nargument" declared as strings.
    State state_ = State::kName;
    std::string name_;
    std::string key_;
    std::set<std::string> keys_;  // The current call's keys so far.
    int args_ = 0;
    size_t searched_ = 0;  // Bytes at the front of buf_ that until() found `end` not to begin at.
};

}  // namespace

std::unique_ptr<ToolCallParser> make_glm45_parser(std::string id_prefix,
                                                  const std::vector<ToolSpec>& tools) {
    return std::make_unique<Glm45Parser>(std::move(id_prefix), tools);
}

}  // namespace edge::engine::chat::detail
