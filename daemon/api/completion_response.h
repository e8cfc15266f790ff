#pragma once

// Response is what the choices of one completion share while they run (run_completion's
// internals): the request's settings, the channel, the event stream held back until the engine
// accepted every choice, and the tally that answers when the last choice has ended. Thread-safe;
// owned by shared_ptr by run_completion, each ChoiceSink and the channel's client-gone callback.

#include <boost/json.hpp>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/api/completion.h"
#include "daemon/api/openai_request.h"
#include "daemon/sse_writer.h"
#include "engine/generator.h"
#include "tls/http_types.h"

namespace edge::daemon::api {

// A streamed chunk's `usage` with continuous_usage: one choice's figures so far.
boost::json::object running_usage(int64_t prompt_tokens, int64_t completion_tokens);

// What the choices of one response share: the request's settings, the channel and its event
// stream, and the tally that ends the response when the last choice has finished (usage summed,
// the first error of any choice). Thread-safe: the choices' callbacks may run on different engine
// threads; every write to the stream happens under mu_.
class Response {
  public:
    Response(const ParsedRequest& request, std::shared_ptr<tls::ResponseChannel> channel,
             int64_t created, CompletionDone on_done);

    const bool chat;
    const bool stream;
    const bool include_usage;
    const bool continuous_usage;  // stream_options.continuous_usage_stats.
    const bool report_usage;
    const bool logprobs;
    const bool return_token_ids;
    const int32_t n;        // Choices of each prompt.
    const int32_t choices;  // Of all the prompts.

    // The engine accepted every choice: a stream opens (the 200 head and, for chat, each
    // choice's role chunk) and the events the choices made meanwhile follow. Until then nothing
    // goes out, so a request the engine refuses, even its last choice, gets its HTTP status (400,
    // 404, 429 with Retry-After) rather than a 200 with the error inside.
    // `prompt_tokens`: the prompts' length, told a forwarding site on the stream's head;
    // `choice_prompt_tokens`: each choice's prompt's (its chat role chunk's usage, with
    // continuous_usage).
    void accept(int64_t prompt_tokens, std::vector<int64_t> choice_prompt_tokens);

    // One streamed event (a chunk of choice `index`).
    void event(const boost::json::object& chunk);

    boost::json::object envelope() const;

    // One streamed chunk of choice `index`: for chat `payload` is the delta object, for
    // completions the text.
    boost::json::object chunk(int32_t index, boost::json::value payload, const char* finish_reason,
                              boost::json::value logprobs_value) const;

    // The handles of the running choices, cancelled together (the client left, a choice
    // failed).
    void add_handle(const std::shared_ptr<engine::GenerationHandle>& handle);
    void cancel_all();

    // The engine refused a choice (submit() failed): the response is that error, answered by
    // the caller; what the choices already submitted do from now on is ignored.
    void refuse();

    // Choice `index` ended with `finish`. `done` (not streaming, a normal end): its JSON object
    // for `choices`. The last choice to end answers.
    void choice_finished(int32_t index, const engine::Finish& finish, boost::json::value done);

  private:
    // accept()'s: the stream's head, then its opening (each chat choice's role chunk and early_)
    // as one write, counted once against the connection's stream buffer.
    void begin_locked();

    // Every choice has ended: the whole answer, or the end of the stream.
    void answer_locked();

    // The usage chunk (stream_options.include_usage), the usage report of a forwarded stream,
    // and [DONE].
    void end_stream_locked();

    const std::string model_;
    const std::string id_;
    const int64_t created_;
    std::mutex mu_;
    CompletionDone on_done_;  // Guarded by mu_.
    std::shared_ptr<tls::ResponseChannel> channel_;
    SseWriter sse_;              // Guarded by mu_.
    bool begun_ = false;         // Guarded by mu_: the stream's head (or a whole error) went out.
    bool accepted_ = false;      // Guarded by mu_: see accept().
    int64_t prompt_tokens_ = 0;  // Guarded by mu_: accept()'s.
    bool refused_ = false;       // Guarded by mu_.
    bool answered_ = false;      // Guarded by mu_: see answer_locked().
    // Guarded by mu_: accept()'s, each choice's prompt length.
    std::vector<int64_t> choice_prompt_tokens_;
    std::vector<std::string> early_;           // Guarded by mu_: events made before accept().
    int32_t finished_ = 0;                     // Guarded by mu_.
    engine::Usage usage_;                      // Guarded by mu_.
    std::optional<engine::Finish> failure_;    // Guarded by mu_.
    std::vector<boost::json::value> choices_;  // Guarded by mu_: by index, not streaming.
    std::vector<std::shared_ptr<engine::GenerationHandle>> handles_;  // Guarded by mu_.
};

}  // namespace edge::daemon::api
