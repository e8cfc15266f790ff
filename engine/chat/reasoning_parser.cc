#include "engine/chat/reasoning_parser.h"

#include "engine/chat/marker_parser.h"

namespace edge::engine::chat {
namespace {

constexpr std::string_view kOpen = "<think>";
const std::string kClose = "</think>";
// Whitespace before an opening <think> (models write at most a newline or two), and newlines
// held at the end of a thought: past these, the output is answer, the newlines thought text.
// They bound what is held back and scanned again as each token arrives.
constexpr size_t kMaxLeadingSpace = 64;
constexpr size_t kMaxHeldNewlines = 16;

}  // namespace

void ReasoningParser::open_thought() {
    if (state_ == State::kStart && buf_.empty()) {
        state_ = State::kThought;
        opened_ = true;
    }
}

ReasoningDelta ReasoningParser::feed(std::string_view text) {
    buf_.append(text);
    ReasoningDelta out;
    run(out, false);
    return out;
}

ReasoningDelta ReasoningParser::finish() {
    ReasoningDelta out;
    run(out, true);
    return out;
}

void ReasoningParser::run(ReasoningDelta& out, bool ended) {
    for (;;) {
        switch (state_) {
            case State::kStart: {
                size_t at = 0;
                while (at < buf_.size() && detail::is_space(buf_[at])) {
                    ++at;
                }
                // The limit is checked first so that the outcome does not depend on how the text
                // was split: fed piece by piece, the whitespace past the limit is released as
                // answer before the <think> that follows it arrives.
                if (at > kMaxLeadingSpace) {
                    state_ = State::kAnswer;
                    continue;
                }
                const std::string_view rest = std::string_view(buf_).substr(at);
                if (rest.starts_with(kOpen)) {
                    buf_.erase(0, at + kOpen.size());
                    state_ = State::kThought;
                    opened_ = true;
                    continue;
                }
                if (!ended && kOpen.starts_with(rest)) {
                    return;  // Whitespace, or a prefix of <think>: not known yet.
                }
                state_ = State::kAnswer;
                continue;
            }
            case State::kThought: {
                if (!thought_begun_) {
                    buf_.erase(0, buf_.find_first_not_of('\n'));
                }
                const size_t close = buf_.find(kClose);
                size_t end = close;
                if (close == std::string::npos) {
                    end = ended ? buf_.size() : buf_.size() - detail::held_prefix(buf_, kClose);
                }
                // Newlines before the end may be the thought's last: held until more text
                // follows them, dropped at its end.
                size_t text_end = end;
                while (text_end > 0 && buf_[text_end - 1] == '\n' &&
                       (close != std::string::npos || ended || end - text_end < kMaxHeldNewlines)) {
                    --text_end;
                }
                if (text_end > 0) {
                    out.reasoning.append(buf_, 0, text_end);
                    thought_begun_ = true;
                }
                if (close == std::string::npos) {
                    if (ended) {
                        buf_.clear();
                    } else {
                        buf_.erase(0, text_end);
                    }
                    return;
                }
                buf_.erase(0, close + kClose.size());
                state_ = State::kAnswerStart;
                continue;
            }
            case State::kAnswerStart:
                buf_.erase(0, buf_.find_first_not_of('\n'));
                if (buf_.empty()) {
                    return;
                }
                state_ = State::kAnswer;
                continue;
            case State::kAnswer:
                out.content += buf_;
                buf_.clear();
                return;
        }
    }
}

}  // namespace edge::engine::chat
