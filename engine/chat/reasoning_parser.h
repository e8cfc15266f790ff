#pragma once

// ReasoningParser splits a thinking model's chat output into its thought and its answer, the way
// OpenAI-compatible servers return them (`reasoning_content` beside `content`). Qwen3, GLM-4.5,
// Kimi K2 Thinking and DeepSeek-V3.1 write the thought between <think> and </think> before the
// answer:
// - the output opens the thought itself with <think> (whitespace before it is dropped), or the
//   prompt already opened it (open_thought(): DeepSeek-V3.1 with thinking on, templates whose
//   assistant opening ends with <think>);
// - newlines at either end of the thought and at the start of the answer are dropped, as the
//   families' templates drop them when they render the message back;
// - an output that does not open a thought is all answer, unchanged; one that ends inside its
//   thought (max_tokens reached) is all thought; after </think> everything is answer, a second
//   <think> included.
// Text is fed as it is decoded, split anywhere (even inside a marker): what may be the start of
// a marker, and newlines that may end the thought, are held back until known (a bounded amount:
// more than 64 bytes of whitespace before <think> make the output an answer, and a thought's run
// of more than 16 newlines is released as its text).
//
// Threading: one parser per response, used by one thread at a time (open_thought() may come
// from the submitting thread, before the engine's first feed()).

#include <string>
#include <string_view>

namespace edge::engine::chat {

struct ReasoningDelta {
    std::string reasoning;  // Text of the thought.
    std::string content;    // Text of the answer.
};

class ReasoningParser {
  public:
    // The prompt ended inside an open thought: the output starts in it. Before the first feed().
    void open_thought();

    ReasoningDelta feed(std::string_view text);
    // The output ended: flushes what was held back.
    ReasoningDelta finish();
    // Inside the thought (opened, not yet closed): what is fed now is thought, or its end.
    bool in_thought() const { return state_ == State::kThought; }
    // Nothing decided yet: what was fed may still open a thought (part of <think>, whitespace).
    bool undecided() const { return state_ == State::kStart; }
    // A thought was opened (by the output or the prompt), whether or not it has closed since.
    bool opened() const { return opened_; }

  private:
    enum class State {
        kStart,        // Nothing decided: the output may open a thought.
        kThought,      // Inside the thought.
        kAnswerStart,  // After </think>: newlines dropped until the answer's first other byte.
        kAnswer,       // Everything else is answer.
    };

    void run(ReasoningDelta& out, bool ended);

    State state_ = State::kStart;
    bool thought_begun_ = false;  // Thought text went out (leading newlines are past).
    bool opened_ = false;
    std::string buf_;             // Held back.
};

}  // namespace edge::engine::chat
