#pragma once

// ChoiceSink is the engine's GenerationSink for one choice of a completion (run_completion's
// internals): it turns the generation's deltas into the choice's chunks (streaming) or its JSON
// object (not streaming), through the thought and tool-call parsers. The engine calls it in order,
// one callback at a time; it lives as long as the engine holds it.

#include <boost/json.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/api/completion_response.h"
#include "daemon/api/tool_call_output.h"
#include "engine/chat/reasoning_parser.h"
#include "engine/generator.h"

namespace edge::daemon::api {

// One choice of a response: its generation's deltas through the thought and tool-call parsers,
// its text, logprobs and token ids. The engine calls it in order, one callback at a time.
class ChoiceSink final : public engine::GenerationSink {
  public:
    // `prompt_text`: the client's prompt when it sent text (an echo returns it as sent).
    ChoiceSink(std::shared_ptr<Response> response, int32_t index,
               std::unique_ptr<ToolCallOutput> tools, bool thinks,
               std::optional<std::string> prompt_text = std::nullopt);

    void on_thought_opened() override;

    void on_prompt_tokens(int64_t tokens) override { prompt_tokens_ = tokens; }
    // What on_prompt_tokens() said (0 before, or if the generator never tokenized).
    int64_t prompt_tokens() const { return prompt_tokens_; }

    // `echo` (completions): the prompt goes first, as text (and logprobs) of its own delta: the
    // client's text as sent when it sent text, else its tokens decoded.
    void on_prompt(std::vector<engine::TokenLogprob> tokens) override;

    void on_delta(engine::TokenDelta delta) override;

    void on_finish(engine::Finish finish) override;

  private:
    boost::json::object chunk(boost::json::value payload, const char* finish_reason,
                              boost::json::value logprobs) const;

    // The answer's text through the tool-call parser when the request offers tools.
    engine::chat::ParsedDelta answer_of(std::string text);

    // A delta of a response split by the parsers: the thought, content and tool-call deltas as
    // they released them. Logprobs of tokens they hold back go out with the next chunk that
    // carries anything.
    void on_parsed(std::string reasoning, engine::chat::ParsedDelta parsed,
                   const engine::TokenDelta& delta);

    // A streamed chunk carries the ids generated since the previous one that carried ids (those of
    // a delta with no text wait for the next chunk).
    boost::json::object with_ids(boost::json::object chunk);

    // Called once for each delta (of any text) when logprobs are asked for.
    void append_logprobs(const engine::TokenDelta& delta, boost::json::array& out);

    boost::json::value logprobs_value(boost::json::array entries) const;

    const std::shared_ptr<Response> response_;
    const int32_t index_;
    std::unique_ptr<ToolCallOutput> tools_;  // Set when the request offers tools.
    // Set for chat answers of a model that thinks: splits off the thought.
    std::unique_ptr<engine::chat::ReasoningParser> thinker_;
    const std::optional<std::string> prompt_text_;  // A text prompt as the client sent it.
    boost::json::array pending_logprobs_;  // Streaming through the parsers: not yet sent.
    std::string text_;
    std::string reasoning_;  // Not streaming: the thought.
    boost::json::array all_logprobs_;
    std::vector<engine::TokenId> token_ids_;  // Not yet sent (all of them when not streaming).
    size_t shown_bytes_ = 0;     // Generated text sent before the current delta, in bytes...
    size_t shown_chars_ = 0;     // ...and in characters.
    size_t offset_base_ = 0;     // Bytes of an echoed prompt before the completion's text.
    int64_t prompt_tokens_ = 0;  // Set from submit(), on the submitting thread.
    // Tokens generated so far (the deltas' ids; the engine's count once finished): the usage
    // of each chunk with continuous_usage.
    int64_t completion_tokens_ = 0;
    int64_t reasoning_tokens_ = 0;  // Of those, the thought's (usage.reasoning_tokens).
    int64_t undecided_tokens_ = 0;  // Fed while the output may still open a thought.
};

}  // namespace edge::daemon::api
