#pragma once

// Runs one parsed completion request against a Generator and answers on the channel: a JSON
// chat.completion / text_completion object, or server-sent chunks ending with [DONE]. The client
// going away cancels the generation. Thread-safe to call from the connection's strand; the
// generation's callbacks arrive on engine threads and only touch the thread-safe channel.

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "daemon/api/openai_request.h"
#include "engine/generator.h"
#include "tls/http_types.h"

namespace edge::daemon::api {

// A stream answered to a forwarding site (ParsedRequest::report_usage) ends, before
// `data: [DONE]`, with the SSE comment `: edgeserve-usage {"prompt_tokens":N,
// "completion_tokens":M}`, so that site charges the tenant the real usage whatever
// stream_options asked; the forwarder consumes it and never relays it to the client
// (forward/usage_scanner.h).
inline constexpr std::string_view kUsageReportComment = "edgeserve-usage ";

// Called exactly once when the request is over: with the engine's Finish and refused false, or
// with reason kError, the submit() error and refused true when the engine refused it (a full
// queue, a prompt beyond the context, a bad field) and it never started.
using CompletionDone = std::function<void(const engine::Finish&, bool refused)>;

// Offered a submit() refusal before it is answered: true takes it (the channel is left
// unanswered and `on_done` is not called; the taker answers), false leaves it to be answered.
using RefusalTaker = std::function<bool(const Status& refusal)>;

// Submits `request` and answers on `channel` (an OpenAI error when submit() fails; for a
// forwarding site, request.report_usage, a refusal of the request itself, a 4xx but 429, that
// comes after the engine tokenized the prompt tells its length in cluster::kPromptTokensHeader).
// `on_accepted`, when set, runs once submit() succeeded, with the prompt's length in tokens (the
// sum over a list of prompts; 0 where the generator does not know it yet). `take_refusal`, when
// set, is offered the engine's refusal of a choice at submit (the choices already queued are
// cancelled first).
void run_completion(engine::Generator& generator, ParsedRequest request,
                    std::shared_ptr<tls::ResponseChannel> channel, int64_t created_unix,
                    CompletionDone on_done = {},
                    std::function<void(int64_t prompt_tokens)> on_accepted = {},
                    RefusalTaker take_refusal = {});

// A logprobs token's text for JSON, which must be valid UTF-8: the bytes of a token that are not
// a whole character (a byte-fallback token, half of a CJK character) are written as the text
// \xNN, and so is a backslash that the token's text has before x and two hex digits (\x5c), so
// that the token \xff and the byte 0xff differ. Distinct tokens keep distinct texts
// (completions' top_logprobs are an object keyed by them); the `bytes` array beside it keeps the
// exact bytes.
std::string logprob_token_text(std::string_view token);

}  // namespace edge::daemon::api
