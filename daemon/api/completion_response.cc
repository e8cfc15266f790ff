#include "daemon/api/completion_response.h"

#include <iterator>
#include <utility>

#include "common/json_text.h"
#include "daemon/api/api_error.h"
#include "daemon/cluster/route_planner.h"

namespace edge::daemon::api {

namespace json = boost::json;

json::object running_usage(int64_t prompt_tokens, int64_t completion_tokens) {
    json::object usage;
    usage["prompt_tokens"] = prompt_tokens;
    usage["completion_tokens"] = completion_tokens;
    usage["total_tokens"] = prompt_tokens + completion_tokens;
    return usage;
}

namespace {

json::value usage_json(const engine::Usage& u) {
    json::object usage = running_usage(u.prompt_tokens, u.completion_tokens);
    json::object details;
    details["cached_tokens"] = u.cached_tokens;
    usage["prompt_tokens_details"] = std::move(details);
    // OpenAI's: a thinking model's thought tokens among completion_tokens.
    json::object completion_details;
    completion_details["reasoning_tokens"] = u.reasoning_tokens;
    usage["completion_tokens_details"] = std::move(completion_details);
    return usage;
}

}  // namespace

Response::Response(const ParsedRequest& request, std::shared_ptr<tls::ResponseChannel> channel,
                   int64_t created, CompletionDone on_done)
    : chat(request.endpoint == Endpoint::kChatCompletions),
      stream(request.stream),
      include_usage(request.include_usage),
      continuous_usage(request.stream && request.continuous_usage),
      report_usage(request.report_usage),
      logprobs(request.generate.sampling.logprobs),
      return_token_ids(request.return_token_ids),
      n(request.n),
      choices(request.choices()),
      model_(request.generate.model),
      id_((chat ? "chatcmpl-" : "cmpl-") + request.generate.request_id),
      created_(created),
      on_done_(std::move(on_done)),
      channel_(channel),
      sse_(std::move(channel)),
      choices_(static_cast<size_t>(request.choices())) {}

void Response::accept(int64_t prompt_tokens, std::vector<int64_t> choice_prompt_tokens) {
    std::lock_guard lock(mu_);
    accepted_ = true;
    prompt_tokens_ = prompt_tokens;
    choice_prompt_tokens_ = std::move(choice_prompt_tokens);
    if (failure_) {
        // Failed before anything went out: the answer is the error's own status, once the
        // other choices, cancelled but ending on engine threads, have ended too
        // (choice_finished answers then).
        early_.clear();
        if (finished_ == choices) {
            answer_locked();
        }
        return;
    }
    begin_locked();
    if (finished_ == choices) {
        answer_locked();
    }
}

void Response::event(const json::object& chunk) {
    std::lock_guard lock(mu_);
    if (refused_ || (failure_ && !begun_)) {
        return;  // The answer is an error with its own status (see accept()).
    }
    if (!accepted_) {
        early_.push_back(json_text(chunk));
        return;
    }
    sse_.event(json_text(chunk));
}

json::object Response::envelope() const {
    json::object o;
    o["id"] = id_;
    o["object"] = chat ? "chat.completion.chunk" : "text_completion";
    o["created"] = created_;
    o["model"] = model_;
    o["system_fingerprint"] = nullptr;
    return o;
}

json::object Response::chunk(int32_t index, json::value payload, const char* finish_reason,
                             json::value logprobs_value) const {
    json::object o = envelope();
    json::object choice;
    choice["index"] = index;
    choice[chat ? "delta" : "text"] = std::move(payload);
    choice["logprobs"] = std::move(logprobs_value);
    choice["finish_reason"] = finish_reason ? json::value(finish_reason) : json::value(nullptr);
    json::array choices;
    choices.push_back(std::move(choice));
    o["choices"] = std::move(choices);
    if (include_usage) {
        o["usage"] = nullptr;
    }
    return o;
}

void Response::add_handle(const std::shared_ptr<engine::GenerationHandle>& handle) {
    bool failed = false;
    {
        std::lock_guard lock(mu_);
        handles_.push_back(handle);
        failed = failure_.has_value();
    }
    if (failed) {
        // A choice failed before this one was submitted: its cancel_all() missed it.
        handle->cancel();
    }
}

void Response::cancel_all() {
    std::vector<std::shared_ptr<engine::GenerationHandle>> handles;
    {
        std::lock_guard lock(mu_);
        handles = handles_;
    }
    for (const auto& h : handles) {
        h->cancel();  // Outside mu_: a cancel may finish the choice at once.
    }
}

void Response::refuse() {
    std::lock_guard lock(mu_);
    refused_ = true;
    on_done_ = nullptr;
    early_.clear();
}

void Response::choice_finished(int32_t index, const engine::Finish& finish, json::value done) {
    bool failed_first = false;
    {
        std::lock_guard lock(mu_);
        if (refused_) {
            return;
        }
        usage_.completion_tokens += finish.usage.completion_tokens;
        usage_.reasoning_tokens += finish.usage.reasoning_tokens;
        if (index % n == 0) {
            // A prompt is the same for each of its choices: counted once, as OpenAI and
            // vLLM do, and a list of prompts counts each.
            usage_.prompt_tokens += finish.usage.prompt_tokens;
            usage_.cached_tokens += finish.usage.cached_tokens;
        }
        if (finish.reason == engine::FinishReason::kError ||
            finish.reason == engine::FinishReason::kCancelled) {
            failed_first = !failure_;
            if (!failure_ || (failure_->reason == engine::FinishReason::kCancelled &&
                              finish.reason == engine::FinishReason::kError)) {
                failure_ = finish;  // An error says more than the cancellations it causes.
            }
        } else if (!stream) {
            choices_[static_cast<size_t>(index)] = std::move(done);
        }
        ++finished_;
    }
    if (failed_first) {
        cancel_all();  // One failed choice fails the response: the others stop.
    }
    std::lock_guard lock(mu_);
    if (finished_ == choices && accepted_) {
        answer_locked();  // Else accept() answers.
    }
}

void Response::begin_locked() {
    std::vector<std::string> opening;
    if (stream && !begun_) {
        begun_ = true;
        std::vector<tls::HttpHeader> headers;
        if (report_usage) {
            headers.push_back(
                {std::string(cluster::kPromptTokensHeader), std::to_string(prompt_tokens_)});
        }
        sse_.begin(std::move(headers));
        if (chat) {
            // Each choice's first chunk carries the role, as OpenAI's do.
            opening.reserve(static_cast<size_t>(choices) + early_.size());
            for (int32_t i = 0; i < choices; ++i) {
                json::object delta;
                delta["role"] = "assistant";
                delta["content"] = "";
                json::object role = chunk(i, std::move(delta), nullptr, json::value(nullptr));
                if (continuous_usage) {
                    role["usage"] =
                        running_usage(choice_prompt_tokens_[static_cast<size_t>(i)], 0);
                }
                opening.push_back(json_text(role));
            }
        }
    }
    // The role chunks and the events of the choices submitted first, generated while the later
    // ones were submitted: one write. This runs inside the handler, before the session can send
    // a byte, so written one by one they would count against the stream buffer together and an
    // opening larger than it (many choices, a small max_stream_buffer_bytes, logprobs) would cut
    // the client as a slow reader before it could read anything.
    opening.insert(opening.end(), std::make_move_iterator(early_.begin()),
                   std::make_move_iterator(early_.end()));
    early_.clear();
    sse_.events(opening);
}

void Response::answer_locked() {
    // Once: accept() and the last choice_finished() can both find every choice ended (two
    // choices ending at once on engine threads, or the last ending while accept() runs),
    // and a second answer would be built from choices the first moved out.
    if (answered_) {
        return;
    }
    answered_ = true;
    engine::Finish total;
    total.usage = usage_;
    if (failure_) {
        total.reason = failure_->reason;
        total.error = failure_->error;
    } else {
        total.reason = engine::FinishReason::kStop;
    }
    if (on_done_) {
        // Before the answer: the caller's notes go into the request's record.
        on_done_(total, false);
        on_done_ = nullptr;
    }
    if (failure_) {
        // Cancelled: the client left (nobody reads this) or the server is shutting down
        // and its drain deadline cut the request.
        ApiError error = api_error_from_status(
            failure_->reason == engine::FinishReason::kError
                ? failure_->error
                : unavailable_error("the request was cancelled: the server is shutting down "
                                    "or the client left"),
            model_);
        if (!stream || !begun_) {
            // Nothing went out yet: the error's own status.
            begun_ = true;
            tls::HttpResponse response = error.to_response();
            if (report_usage) {
                // For the forwarding site, which charges the tenant: what ran here before the
                // end (a drain's deadline or a lost device may end a generation well along), and
                // runs the request at another site only when nothing was generated. The prompt
                // was read once accepted, even where the engine's usage has none.
                const int64_t prompt =
                    usage_.prompt_tokens > 0 ? usage_.prompt_tokens : prompt_tokens_;
                response.headers.push_back(
                    {std::string(cluster::kPromptTokensHeader), std::to_string(prompt)});
                response.headers.push_back({std::string(cluster::kCompletionTokensHeader),
                                            std::to_string(usage_.completion_tokens)});
            }
            channel_->respond(std::move(response));
            return;
        }
        sse_.event(error.to_json());
        // OpenAI may leave the usage out of a stream cut short; what was generated until
        // then is still known here, and a client that asked for it counts it.
        end_stream_locked();
        return;
    }
    if (stream) {
        end_stream_locked();
        return;
    }
    json::object root = envelope();
    root["object"] = chat ? "chat.completion" : "text_completion";
    json::array choices;
    for (json::value& c : choices_) {
        choices.push_back(std::move(c));
    }
    root["choices"] = std::move(choices);
    root["usage"] = usage_json(usage_);
    tls::HttpResponse response;
    response.body = json_text(root);
    channel_->respond(std::move(response));
}

void Response::end_stream_locked() {
    if (include_usage) {
        json::object u = envelope();
        u["choices"] = json::array();
        u["usage"] = usage_json(usage_);
        sse_.event(json_text(u));
    }
    if (report_usage) {
        json::object u;
        u["prompt_tokens"] = usage_.prompt_tokens;
        u["completion_tokens"] = usage_.completion_tokens;
        sse_.comment(std::string(kUsageReportComment) + json_text(u));
    }
    sse_.done();
}

}  // namespace edge::daemon::api
