#include "engine/chat/tool_call_parser.h"

#include <boost/json.hpp>
#include <map>
#include <set>

#include "engine/chat/json_stream.h"

namespace edge::engine::chat {
namespace {

namespace json = boost::json;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

enum class Lit { kYes, kPartial, kNo };

// Whether `buf` starts with `lit` (kPartial: buf is a proper prefix of it).
Lit starts_with(const std::string& buf, std::string_view lit) {
    const size_t n = std::min(buf.size(), lit.size());
    if (buf.compare(0, n, lit.data(), n) != 0) {
        return Lit::kNo;
    }
    return n == lit.size() ? Lit::kYes : Lit::kPartial;
}

// Length of the longest suffix of `buf` that is a proper prefix of `marker`.
size_t held_prefix(const std::string& buf, const std::string& marker) {
    const size_t max = std::min(buf.size(), marker.size() - 1);
    for (size_t len = max; len > 0; --len) {
        if (buf.compare(buf.size() - len, len, marker, 0, len) == 0) {
            return len;
        }
    }
    return 0;
}

std::string quote(std::string_view s) { return json::serialize(json::value(json::string(s))); }

constexpr size_t kMaxHeader = 1024;  // Bytes of a name or id before its terminator.

// Shared driver: content until the start marker, then the format's step() until the call (or
// Kimi's section of calls) ends.
class MarkerParser : public ToolCallParser {
  public:
    MarkerParser(std::string start, std::string id_prefix)
        : start_(std::move(start)), id_prefix_(std::move(id_prefix)) {}

    ParsedDelta feed(std::string_view text) override {
        buf_.append(text);
        ParsedDelta out;
        run(out);
        return out;
    }

    ParsedDelta finish() override {
        ParsedDelta out;
        run(out);
        if (in_call_) {
            take(buf_.size());
            abandon(out, "the output ended inside a tool call");
            run(out);
        }
        out.content += buf_;
        buf_.clear();
        return out;
    }

  protected:
    enum class Step { kNeedMore, kDone, kMalformed };
    virtual void begin_call() = 0;
    virtual Step step(ParsedDelta& out) = 0;

    std::string take(size_t n) {
        std::string s = buf_.substr(0, n);
        buf_.erase(0, n);
        raw_ += s;
        return s;
    }
    // Skips whitespace; false when the buffer ran out.
    bool skip_space() {
        size_t i = 0;
        while (i < buf_.size() && is_space(buf_[i])) {
            ++i;
        }
        take(i);
        return !buf_.empty();
    }
    Step malformed(std::string reason) {
        reason_ = std::move(reason);
        return Step::kMalformed;
    }
    std::string next_id() const { return id_prefix_ + std::to_string(index_); }
    void emit_start(ParsedDelta& out, std::string id, std::string name) {
        out.tool_calls.push_back({index_, std::move(id), std::move(name), ""});
        started_ = true;
    }
    void emit_args(ParsedDelta& out, std::string_view text) {
        if (out.tool_calls.empty() || out.tool_calls.back().index != index_) {
            out.tool_calls.push_back({index_, "", "", ""});
        }
        out.tool_calls.back().arguments.append(text);
    }
    void finish_call() {
        ++completed_;
        ++index_;
        started_ = false;
        raw_.clear();
    }

    std::string buf_;  // Received, not yet consumed.
    bool started_ = false;
    int32_t index_ = 0;

  private:
    void run(ParsedDelta& out) {
        while (true) {
            if (!in_call_) {
                const size_t at = buf_.find(start_);
                if (at == std::string::npos) {
                    const size_t keep = held_prefix(buf_, start_);
                    out.content.append(buf_, 0, buf_.size() - keep);
                    buf_.erase(0, buf_.size() - keep);
                    return;
                }
                out.content.append(buf_, 0, at);
                buf_.erase(0, at);
                raw_.clear();
                take(start_.size());
                in_call_ = true;
                started_ = false;
                begin_call();
                continue;
            }
            const Step s = step(out);
            if (s == Step::kNeedMore) {
                return;
            }
            if (s == Step::kMalformed) {
                abandon(out, reason_);
                continue;
            }
            in_call_ = false;
            raw_.clear();
        }
    }

    void abandon(ParsedDelta& out, const std::string& reason) {
        out.content += raw_;
        raw_.clear();
        if (started_) {
            std::erase_if(out.tool_calls,
                          [&](const ToolCallDelta& d) { return d.index == index_; });
            out.abandoned_calls.push_back(index_);
            ++index_;
            started_ = false;
        }
        malformed_reason_ = reason;
        in_call_ = false;
    }

    std::string start_;
    std::string id_prefix_;
    std::string raw_;  // Consumed bytes of the current call, given back if it is malformed.
    std::string reason_;
    bool in_call_ = false;
};

// Qwen3 / Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
class HermesParser final : public MarkerParser {
  public:
    explicit HermesParser(std::string id_prefix)
        : MarkerParser("<tool_call>", std::move(id_prefix)) {}

  private:
    enum class State { kLead, kJson, kTail };
    void begin_call() override {
        state_ = State::kLead;
        json_ = JsonStream();
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
                    return malformed("a tool call is not valid JSON");
                }
                if (value_starts && key == "name") {
                    name_on_ = true;
                } else if (value_starts && key == "arguments") {
                    if (c != '{') {
                        return malformed("a tool call's arguments are not a JSON object");
                    }
                    args_on_ = true;
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
                    json::value v = json::parse(name_json_, ec);
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
    JsonStream json_;
    bool name_on_ = false;
    bool args_on_ = false;
    bool args_done_ = false;
    std::string name_json_;
    std::string pending_args_;
};

// GLM-4.5: <tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...</tool_call>.
class Glm45Parser final : public MarkerParser {
  public:
    Glm45Parser(std::string id_prefix, const std::vector<ToolSpec>& tools)
        : MarkerParser("<tool_call>", std::move(id_prefix)) {
        for (const ToolSpec& t : tools) {
            std::error_code ec;
            json::value schema = json::parse(t.parameters_json, ec);
            if (ec || !schema.is_object()) {
                continue;
            }
            const json::value* props = schema.get_object().if_contains("properties");
            if (props == nullptr || !props->is_object()) {
                continue;
            }
            for (const auto& p : props->get_object()) {
                const json::value* type =
                    p.value().is_object() ? p.value().get_object().if_contains("type") : nullptr;
                if (type != nullptr && type->is_string() && type->get_string() == "string") {
                    string_args_.insert(t.name + "\n" + std::string(p.key()));
                }
            }
        }
    }

  private:
    enum class State { kName, kBetween, kKey, kBeforeValue, kValue };
    void begin_call() override {
        state_ = State::kName;
        args_ = 0;
    }

    // The JSON text of one argument value as written between the tags.
    std::string value_json(const std::string& key, const std::string& value) const {
        if (string_args_.count(name_ + "\n" + key) == 0) {
            std::error_code ec;
            json::value v = json::parse(value, ec);
            if (!ec) {
                return json::serialize(v);
            }
        }
        return quote(value);
    }

    // Takes text up to `end` into *out; kNeedMore until `end` arrives.
    Step until(std::string_view end, std::string* out, const char* what) {
        const size_t at = buf_.find(end);
        if (at == std::string::npos) {
            if (buf_.size() > (size_t{1} << 20)) {
                return malformed(std::string("a tool call's ") + what + " has no end");
            }
            return Step::kNeedMore;
        }
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
                    emit_args(out, std::string(args_ == 0 ? "{" : ", ") + quote(key_) + ": " +
                                       value_json(key_, value));
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
    int args_ = 0;
};

// Kimi K2: a section of calls, each functions.name:idx then JSON arguments.
class KimiK2Parser final : public MarkerParser {
  public:
    explicit KimiK2Parser(std::string id_prefix)
        : MarkerParser("<|tool_calls_section_begin|>", std::move(id_prefix)) {}

  private:
    enum class State { kBetween, kId, kLead, kArgs, kEnd };
    void begin_call() override { state_ = State::kBetween; }

    Step expect(std::string_view lit, const char* what) {
        switch (starts_with(buf_, lit)) {
            case Lit::kPartial:
                return Step::kNeedMore;
            case Lit::kNo:
                take(1);
                return malformed(what);
            case Lit::kYes:
                take(lit.size());
                return Step::kDone;
        }
        return Step::kNeedMore;
    }

    Step step(ParsedDelta& out) override {
        static constexpr std::string_view kBegin = "<|tool_call_begin|>";
        static constexpr std::string_view kArgBegin = "<|tool_call_argument_begin|>";
        static constexpr std::string_view kEndCall = "<|tool_call_end|>";
        static constexpr std::string_view kEndSection = "<|tool_calls_section_end|>";
        while (true) {
            switch (state_) {
                case State::kBetween: {
                    if (!skip_space()) {
                        return Step::kNeedMore;
                    }
                    const Lit end = starts_with(buf_, kEndSection);
                    if (end == Lit::kYes) {
                        buf_.erase(0, kEndSection.size());
                        return Step::kDone;
                    }
                    const Lit begin = starts_with(buf_, kBegin);
                    if (end == Lit::kPartial || begin == Lit::kPartial) {
                        return Step::kNeedMore;
                    }
                    if (begin == Lit::kNo) {
                        take(1);
                        return malformed("expected <|tool_call_begin|> in a tool-call section");
                    }
                    take(kBegin.size());
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
                    while (!id.empty() && is_space(id.back())) {
                        id.pop_back();
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
                    if (buf_.empty()) {
                        return Step::kNeedMore;
                    }
                    size_t i = 0;
                    JsonStream::Result r = JsonStream::Result::kOk;
                    while (i < buf_.size() && r == JsonStream::Result::kOk) {
                        r = json_.feed(buf_[i++]);
                    }
                    if (r == JsonStream::Result::kInvalid) {
                        take(i);
                        return malformed("a tool call's arguments are not valid JSON");
                    }
                    emit_args(out, take(i));
                    if (r == JsonStream::Result::kDone) {
                        state_ = State::kEnd;
                    }
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

Result<ToolCallFormat> tool_call_format_from_name(std::string_view name) {
    if (name == "hermes" || name == "qwen3") {
        return ToolCallFormat::kHermes;
    }
    if (name == "glm4_5" || name == "glm45") {
        return ToolCallFormat::kGlm45;
    }
    if (name == "kimi_k2") {
        return ToolCallFormat::kKimiK2;
    }
    return invalid_argument_error("tool-call format '" + std::string(name) +
                                  "' is not known (hermes, qwen3, glm4_5, kimi_k2)");
}

std::string_view tool_call_format_name(ToolCallFormat format) {
    switch (format) {
        case ToolCallFormat::kHermes:
            return "hermes";
        case ToolCallFormat::kGlm45:
            return "glm4_5";
        case ToolCallFormat::kKimiK2:
            return "kimi_k2";
    }
    return "hermes";
}

std::unique_ptr<ToolCallParser> create_tool_call_parser(ToolCallFormat format,
                                                        std::string id_prefix,
                                                        const std::vector<ToolSpec>& tools) {
    switch (format) {
        case ToolCallFormat::kGlm45:
            return std::make_unique<Glm45Parser>(std::move(id_prefix), tools);
        case ToolCallFormat::kKimiK2:
            return std::make_unique<KimiK2Parser>(std::move(id_prefix));
        case ToolCallFormat::kHermes:
        default:
            return std::make_unique<HermesParser>(std::move(id_prefix));
    }
}

}  // namespace edge::engine::chat
