#pragma once

// Internal to engine/chat: the shared driver of the tool-call parsers (MarkerParser: plain content
// until the format's start marker, then the format's step() until the call ends, giving a
// malformed call back as content) and the constructors of the formats, one file each
// (hermes_parser.cc, glm45_parser.cc, kimi_k2_parser.cc, deepseek_v3_parser.cc). The public
// interface is engine/chat/tool_call_parser.h. Threading: as ToolCallParser (one per response, one
// thread).

#include <algorithm>
#include <boost/json.hpp>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/json_stream.h"
#include "engine/chat/tool_call_parser.h"

namespace edge::engine::chat::detail {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

enum class Lit { kYes, kPartial, kNo };

// Whether `buf` starts with `lit` (kPartial: buf is a proper prefix of it).
inline Lit starts_with(const std::string& buf, std::string_view lit) {
    const size_t n = std::min(buf.size(), lit.size());
    if (buf.compare(0, n, lit.data(), n) != 0) {
        return Lit::kNo;
    }
    return n == lit.size() ? Lit::kYes : Lit::kPartial;
}

// Length of the longest suffix of `buf` that is a proper prefix of `marker`.
inline size_t held_prefix(const std::string& buf, const std::string& marker) {
    const size_t max = std::min(buf.size(), marker.size() - 1);
    for (size_t len = max; len > 0; --len) {
        if (buf.compare(buf.size() - len, len, marker, 0, len) == 0) {
            return len;
        }
    }
    return 0;
}

inline std::string quote(std::string_view s) {
    return boost::json::serialize(boost::json::value(boost::json::string(s)));
}

constexpr size_t kMaxHeader = 1024;  // Bytes of a name or id before its terminator.

// Shared driver: content until the start marker, then the format's step() until the call (or
// Kimi's section of calls) ends.
class MarkerParser : public ToolCallParser {
  public:
    // `call_start`, if not empty, is a second opening: one call's own marker without the
    // section's (DeepSeek-V3's template writes later calls so); begin_call() reads bare().
    MarkerParser(std::string start, std::string id_prefix, std::string call_start = "")
        : start_(std::move(start)),
          id_prefix_(std::move(id_prefix)),
          call_start_(std::move(call_start)) {}

    ParsedDelta feed(std::string_view text) override {
        buf_.append(text);
        ParsedDelta out;
        run(out);
        shown_ = started_;
        return out;
    }

    ParsedDelta finish() override {
        ParsedDelta out;
        run(out);
        if (in_call_ && after_call_in_section_ &&
            (bare_ || buf_.find_first_not_of(" \t\r\n") == std::string::npos)) {
            // The output ended between two calls of a section (Kimi K2, DeepSeek) with no
            // section end: the calls written stand, as vLLM's parsers take them. DeepSeek-V3's
            // template writes a conversation's first call so, and the model copies it. After a
            // bare call (no section opened) what is left is content (emit_content drops
            // whitespace alone).
            raw_.clear();  // Whitespace after the last call, not content.
            in_call_ = false;
        }
        if (in_call_) {
            take(buf_.size());
            abandon(out, "the output ended inside a tool call");
            run(out);
        }
        emit_content(out, buf_);
        buf_.clear();
        space_after_call_.clear();  // Whitespace after the last call is not content.
        return out;
    }

  protected:
    // kNotACall: what opened looked like a call only by its marker (a bare call_start not
    // followed by a call's head): given back as content, the response not malformed.
    enum class Step { kNeedMore, kDone, kMalformed, kNotACall };
    virtual void begin_call() = 0;
    // The current call opened with call_start, not start.
    bool bare() const { return bare_; }
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
    // Consumes `lit` at the start of the buffer: kDone, kNeedMore, or kMalformed with `what`.
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
    // Streams a call's JSON arguments from the buffer on as `json` takes them: kDone when their
    // value ended, kNeedMore when the buffer ran out first, kMalformed when `json` refused a byte
    // (bad JSON, or a key given twice in one object at any depth), which does not stream.
    Step stream_arguments(ParsedDelta& out, JsonStream& json) {
        if (buf_.empty()) {
            return Step::kNeedMore;
        }
        size_t i = 0;
        JsonStream::Result r = JsonStream::Result::kOk;
        while (i < buf_.size() && r == JsonStream::Result::kOk) {
            r = json.feed(buf_[i++]);
        }
        if (r == JsonStream::Result::kInvalid) {
            take(i);
            return malformed("a tool call's arguments are not valid JSON: " + json.error());
        }
        emit_args(out, take(i));
        return r == JsonStream::Result::kDone ? Step::kDone : Step::kNeedMore;
    }
    // Between the calls of a section whose calls open with `begin` and which closes with
    // `end_section`: kDone when the section closed, nullopt when a call opened (both consumed),
    // else kNeedMore or kMalformed.
    std::optional<Step> between_calls(std::string_view begin, std::string_view end_section) {
        if (!skip_space()) {
            return Step::kNeedMore;
        }
        const Lit end = starts_with(buf_, end_section);
        if (end == Lit::kYes) {
            buf_.erase(0, end_section.size());
            return Step::kDone;
        }
        const Lit call = starts_with(buf_, begin);
        if (end == Lit::kPartial || call == Lit::kPartial) {
            return Step::kNeedMore;
        }
        if (call == Lit::kNo) {
            take(1);
            return malformed("expected " + std::string(begin) + " in a tool-call section");
        }
        take(begin.size());
        after_call_in_section_ = false;
        return std::nullopt;
    }
    // Counts every call begun, shown or not, so a call's id does not depend on how the text was
    // split (index_ does: it is reused by a call given up before the client saw it).
    std::string next_id() const { return id_prefix_ + std::to_string(ids_); }
    void emit_start(ParsedDelta& out, std::string id, std::string name) {
        out.tool_calls.push_back({index_, std::move(id), std::move(name), ""});
        started_ = true;
        ++ids_;
    }
    void emit_args(ParsedDelta& out, std::string_view text) {
        if (out.tool_calls.empty() || out.tool_calls.back().index != index_) {
            out.tool_calls.push_back({index_, "", "", ""});
        }
        out.tool_calls.back().arguments.append(text);
    }
    void finish_call() {
        after_call_ = true;
        after_call_in_section_ = true;
        space_before_call_.clear();  // Between two calls: dropped, as vLLM does.
        ++completed_;
        ++index_;
        started_ = false;
        shown_ = false;
        raw_.clear();
    }

    std::string buf_;  // Received, not yet consumed.
    bool started_ = false;
    int32_t index_ = 0;
    int32_t ids_ = 0;  // Calls begun (emit_start) so far.

  private:
    void run(ParsedDelta& out) {
        while (true) {
            if (!in_call_) {
                size_t at = buf_.find(start_);
                bare_ = false;
                if (!call_start_.empty()) {
                    const size_t bare_at = buf_.find(call_start_);
                    if (bare_at < at) {
                        at = bare_at;
                        bare_ = true;
                    }
                }
                if (at == std::string::npos) {
                    size_t keep = held_prefix(buf_, start_);
                    if (!call_start_.empty()) {
                        keep = std::max(keep, held_prefix(buf_, call_start_));
                    }
                    emit_content(out, std::string_view(buf_).substr(0, buf_.size() - keep));
                    buf_.erase(0, buf_.size() - keep);
                    return;
                }
                emit_content(out, std::string_view(buf_).substr(0, at));
                buf_.erase(0, at);
                space_before_call_ = std::move(space_after_call_);
                space_after_call_.clear();
                raw_.clear();
                take(bare_ ? call_start_.size() : start_.size());
                in_call_ = true;
                after_call_in_section_ = false;
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
            if (s == Step::kNotACall) {
                give_back(out);
                continue;
            }
            in_call_ = false;
            raw_.clear();
        }
    }

    void abandon(ParsedDelta& out, const std::string& reason) {
        give_back(out);
        malformed_reason_ = reason;
    }

    // The current call's text back to content; the call, if begun, given up.
    void give_back(ParsedDelta& out) {
        out.content += space_before_call_;  // Not between two calls after all.
        space_before_call_.clear();
        after_call_ = false;
        out.content += raw_;
        raw_.clear();
        if (started_) {
            std::erase_if(out.tool_calls,
                          [&](const ToolCallDelta& d) { return d.index == index_; });
            // Only a call the client has seen is named as given up; one that never left this
            // delta is gone without a trace, and the next call takes its index (the client's
            // indexes stay 0, 1, 2, ...).
            if (shown_) {
                out.abandoned_calls.push_back(index_);
                ++index_;
            }
            started_ = false;
            shown_ = false;
        }
        in_call_ = false;
    }

    // Content, except whitespace alone after a call: held until text follows it (then it is
    // content) or another call opens or the output ends (then it is dropped). The model's
    // "</tool_call>\n<tool_call>" is not an answer of "\n", which a client would send back.
    void emit_content(ParsedDelta& out, std::string_view text) {
        if (!after_call_) {
            out.content.append(text);
            return;
        }
        if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
            space_after_call_.append(text);
            return;
        }
        out.content += space_after_call_;
        space_after_call_.clear();
        after_call_ = false;
        out.content.append(text);
    }

    std::string start_;
    std::string id_prefix_;
    std::string call_start_;  // See the constructor; empty: none.
    bool bare_ = false;       // The current call opened with call_start_.

    std::string raw_;  // Consumed bytes of the current call, given back if it is malformed.
    bool after_call_ = false;        // A call ended and no content has come since.
    std::string space_after_call_;   // Whitespace since then (emit_content).
    std::string space_before_call_;  // That whitespace, once a call opened after it.
    std::string reason_;
    bool in_call_ = false;
    // A call of the open section ended and the next has not begun: the output may end here.
    bool after_call_in_section_ = false;
    bool shown_ = false;  // The current call's start went out in an earlier feed().
};

std::unique_ptr<ToolCallParser> make_hermes_parser(std::string id_prefix);
std::unique_ptr<ToolCallParser> make_glm45_parser(std::string id_prefix,
                                                  const std::vector<ToolSpec>& tools);
std::unique_ptr<ToolCallParser> make_kimi_k2_parser(std::string id_prefix);
std::unique_ptr<ToolCallParser> make_deepseek_v3_parser(std::string id_prefix);
std::unique_ptr<ToolCallParser> make_deepseek_v3_1_parser(std::string id_prefix);

}  // namespace edge::engine::chat::detail
