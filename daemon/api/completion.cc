#include "daemon/api/completion.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "common/json_text.h"
#include "daemon/api/tool_call_output.h"
#include "daemon/cluster/route_planner.h"
#include "daemon/sse_writer.h"
#include "engine/chat/reasoning_parser.h"
#include "engine/tokenizer/utf8.h"

namespace edge::daemon::api {
namespace {

namespace json = boost::json;

const char* finish_reason_name(engine::FinishReason r) {
    switch (r) {
        case engine::FinishReason::kStop: return "stop";
        case engine::FinishReason::kLength: return "length";
        case engine::FinishReason::kCancelled: return "cancelled";
        case engine::FinishReason::kError: return "error";
    }
    return "stop";
}

json::array token_bytes(const std::string& token) {
    json::array bytes;
    for (unsigned char c : token) {
        bytes.push_back(static_cast<int64_t>(c));
    }
    return bytes;
}

}  // namespace

std::string logprob_token_text(std::string_view token) {
    auto is_hex = [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    };
    auto escape = [](std::string& out, unsigned char byte) {
        char hex[5];
        std::snprintf(hex, sizeof(hex), "\\x%02x", byte);
        out.append(hex, 4);
    };
    std::string out;
    size_t pos = 0;
    while (pos < token.size()) {
        const size_t n = engine::tokenizer::utf8_valid_sequence(token.substr(pos));
        if (n == 0) {
            escape(out, static_cast<unsigned char>(token[pos]));
            ++pos;
            continue;
        }
        // A backslash that reads as the start of an escape is one itself (\x5c): the token
        // whose text is \xff would else be written as the byte 0xff is, and completions'
        // top_logprobs (keyed by this text) would merge the two. Other text stays as it is, so
        // the tokens still join to the returned text.
        if (token[pos] == '\\' && pos + 3 < token.size() && token[pos + 1] == 'x' &&
            is_hex(token[pos + 2]) && is_hex(token[pos + 3])) {
            escape(out, '\\');
        } else {
            out.append(token.substr(pos, n));
        }
        pos += n;
    }
    return out;
}

namespace {

json::value usage_json(const engine::Usage& u) {
    json::object usage;
    usage["prompt_tokens"] = u.prompt_tokens;
    usage["completion_tokens"] = u.completion_tokens;
    usage["total_tokens"] = u.prompt_tokens + u.completion_tokens;
    json::object details;
    details["cached_tokens"] = u.cached_tokens;
    usage["prompt_tokens_details"] = std::move(details);
    return usage;
}

// What the choices of one response share: the request's settings, the channel and its event
// stream, and the tally that ends the response when the last choice has finished (usage summed,
// the first error of any choice). Thread-safe: the choices' callbacks may run on different engine
// threads; every write to the stream happens under mu_.
class Response {
public:
    Response(const ParsedRequest& request, std::shared_ptr<tls::ResponseChannel> channel,
             int64_t created, CompletionDone on_done)
        : chat(request.endpoint == Endpoint::kChatCompletions),
          stream(request.stream),
          include_usage(request.include_usage),
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

    const bool chat;
    const bool stream;
    const bool include_usage;
    const bool report_usage;
    const bool logprobs;
    const bool return_token_ids;
    const int32_t n;        // Choices of each prompt.
    const int32_t choices;  // Of all the prompts.

    // The engine accepted every choice: a stream opens (the 200 head and, for chat, each
    // choice's role chunk) and the events the choices made meanwhile follow. Until then nothing
    // goes out, so a request the engine refuses, even its last choice, gets its HTTP status (400,
    // 404, 429 with Retry-After) rather than a 200 with the error inside.
    // `prompt_tokens`: the prompts' length, told a forwarding site on the stream's head.
    void accept(int64_t prompt_tokens) {
        std::lock_guard lock(mu_);
        accepted_ = true;
        prompt_tokens_ = prompt_tokens;
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
        for (const std::string& e : early_) {
            sse_.event(e);
        }
        early_.clear();
        if (finished_ == choices) {
            answer_locked();
        }
    }

    // One streamed event (a chunk of choice `index`).
    void event(const json::object& chunk) {
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

    json::object envelope() const {
        json::object o;
        o["id"] = id_;
        o["object"] = chat ? "chat.completion.chunk" : "text_completion";
        o["created"] = created_;
        o["model"] = model_;
        o["system_fingerprint"] = nullptr;
        return o;
    }

    // One streamed chunk of choice `index`: for chat `payload` is the delta object, for
    // completions the text.
    json::object chunk(int32_t index, json::value payload, const char* finish_reason,
                       json::value logprobs_value) const {
        json::object o = envelope();
        json::object choice;
        choice["index"] = index;
        choice[chat ? "delta" : "text"] = std::move(payload);
        choice["logprobs"] = std::move(logprobs_value);
        choice["finish_reason"] =
            finish_reason ? json::value(finish_reason) : json::value(nullptr);
        json::array choices;
        choices.push_back(std::move(choice));
        o["choices"] = std::move(choices);
        if (include_usage) {
            o["usage"] = nullptr;
        }
        return o;
    }

    // The handles of the running choices, cancelled together (the client left, a choice
    // failed).
    void add_handle(const std::shared_ptr<engine::GenerationHandle>& handle) {
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
    void cancel_all() {
        std::vector<std::shared_ptr<engine::GenerationHandle>> handles;
        {
            std::lock_guard lock(mu_);
            handles = handles_;
        }
        for (const auto& h : handles) {
            h->cancel();  // Outside mu_: a cancel may finish the choice at once.
        }
    }

    // The engine refused a choice (submit() failed): the response is that error, answered by
    // the caller; what the choices already submitted do from now on is ignored.
    void refuse() {
        std::lock_guard lock(mu_);
        refused_ = true;
        on_done_ = nullptr;
        early_.clear();
    }

    // Choice `index` ended with `finish`. `done` (not streaming, a normal end): its JSON object
    // for `choices`. The last choice to end answers.
    void choice_finished(int32_t index, const engine::Finish& finish, json::value done) {
        bool failed_first = false;
        {
            std::lock_guard lock(mu_);
            if (refused_) {
                return;
            }
            usage_.completion_tokens += finish.usage.completion_tokens;
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

private:
    void begin_locked() {
        if (!stream || begun_) {
            return;
        }
        begun_ = true;
        std::vector<tls::HttpHeader> headers;
        if (report_usage) {
            headers.push_back(
                {std::string(cluster::kPromptTokensHeader), std::to_string(prompt_tokens_)});
        }
        sse_.begin(std::move(headers));
        if (chat) {
            // Each choice's first chunk carries the role, as OpenAI's do.
            for (int32_t i = 0; i < choices; ++i) {
                json::object delta;
                delta["role"] = "assistant";
                delta["content"] = "";
                sse_.event(json_text(chunk(i, std::move(delta), nullptr, json::value(nullptr))));
            }
        }
    }

    // Every choice has ended: the whole answer, or the end of the stream.
    void answer_locked() {
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
                channel_->respond(error.to_response());
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

    // The usage chunk (stream_options.include_usage), the usage report of a forwarded stream,
    // and [DONE].
    void end_stream_locked() {
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

    const std::string model_;
    const std::string id_;
    const int64_t created_;
    std::mutex mu_;
    CompletionDone on_done_;                      // Guarded by mu_.
    std::shared_ptr<tls::ResponseChannel> channel_;
    SseWriter sse_;                               // Guarded by mu_.
    bool begun_ = false;  // Guarded by mu_: the stream's head (or a whole error) went out.
    bool accepted_ = false;                       // Guarded by mu_: see accept().
    int64_t prompt_tokens_ = 0;                   // Guarded by mu_: accept()'s.
    bool refused_ = false;                        // Guarded by mu_.
    bool answered_ = false;                       // Guarded by mu_: see answer_locked().
    std::vector<std::string> early_;  // Guarded by mu_: events made before accept().
    int32_t finished_ = 0;                        // Guarded by mu_.
    engine::Usage usage_;                         // Guarded by mu_.
    std::optional<engine::Finish> failure_;       // Guarded by mu_.
    std::vector<json::value> choices_;            // Guarded by mu_: by index, not streaming.
    std::vector<std::shared_ptr<engine::GenerationHandle>> handles_;  // Guarded by mu_.
};

// One choice of a response: its generation's deltas through the thought and tool-call parsers,
// its text, logprobs and token ids. The engine calls it in order, one callback at a time.
class ChoiceSink final : public engine::GenerationSink {
public:
    ChoiceSink(std::shared_ptr<Response> response, int32_t index,
               std::unique_ptr<ToolCallOutput> tools, bool thinks)
        : response_(std::move(response)),
          index_(index),
          tools_(std::move(tools)),
          thinker_(thinks && response_->chat
                       ? std::make_unique<engine::chat::ReasoningParser>()
                       : nullptr) {}

    void on_thought_opened() override {
        if (thinker_) {
            thinker_->open_thought();
        }
    }

    void on_prompt_tokens(int64_t tokens) override { prompt_tokens_ = tokens; }
    // What on_prompt_tokens() said (0 before, or if the generator never tokenized).
    int64_t prompt_tokens() const { return prompt_tokens_; }

    // `echo` (completions): the prompt goes first, as text (and logprobs) of its own delta.
    void on_prompt(std::vector<engine::TokenLogprob> tokens) override {
        engine::TokenDelta prompt;
        // Token bytes, decoded as the completion's are (each maximal subpart that is not UTF-8,
        // as the IncrementalDecoder does): a prompt given as ids may hold bytes that are not UTF-8
        // (a lone byte token), which become U+FFFD, not invalid JSON. The engine's offsets count
        // the raw bytes, which each U+FFFD (3 bytes) shifts: they are recounted in the text sent,
        // a token starting where the character holding its first byte starts.
        std::string raw;
        std::vector<size_t> starts;
        for (const engine::TokenLogprob& t : tokens) {
            starts.push_back(raw.size());
            raw += t.token;
        }
        size_t next = 0;  // The first token whose offset is not yet known.
        for (size_t pos = 0; pos < raw.size();) {
            const std::string_view rest = std::string_view(raw).substr(pos);
            size_t n = engine::tokenizer::utf8_valid_sequence(rest);
            const bool valid = n > 0;
            if (!valid) {
                n = engine::tokenizer::utf8_maximal_subpart(rest);
            }
            for (; next < tokens.size() && starts[next] < pos + n; ++next) {
                tokens[next].text_offset = prompt.text.size();
            }
            prompt.text.append(valid ? rest.substr(0, n) : std::string_view("\xEF\xBF\xBD"));
            pos += n;
        }
        for (; next < tokens.size(); ++next) {
            tokens[next].text_offset = prompt.text.size();  // Tokens with no bytes, at the end.
        }
        if (response_->logprobs) {
            prompt.logprobs = std::move(tokens);
        }
        const size_t bytes = prompt.text.size();
        on_delta(std::move(prompt));
        offset_base_ = bytes;  // The completion's tokens count their offsets after it.
    }

    void on_delta(engine::TokenDelta delta) override {
        if (response_->return_token_ids) {
            token_ids_.insert(token_ids_.end(), delta.token_ids.begin(), delta.token_ids.end());
        }
        if (thinker_ || tools_) {
            engine::chat::ReasoningDelta split;
            if (thinker_) {
                split = thinker_->feed(delta.text);
            } else {
                split.content = delta.text;
            }
            on_parsed(std::move(split.reasoning), answer_of(std::move(split.content)), delta);
            return;
        }
        if (!response_->stream) {
            text_ += delta.text;
            append_logprobs(delta, all_logprobs_);
            return;
        }
        if (delta.text.empty() && delta.logprobs.empty()) {
            return;
        }
        json::array lp;
        append_logprobs(delta, lp);
        json::value logprobs =
            response_->logprobs ? logprobs_value(std::move(lp)) : json::value(nullptr);
        if (response_->chat) {
            json::object d;
            d["content"] = delta.text;
            response_->event(with_ids(chunk(std::move(d), nullptr, std::move(logprobs))));
        } else {
            response_->event(
                with_ids(chunk(json::string(delta.text), nullptr, std::move(logprobs))));
        }
    }

    void on_finish(engine::Finish finish) override {
        if (finish.reason == engine::FinishReason::kError ||
            finish.reason == engine::FinishReason::kCancelled) {
            response_->choice_finished(index_, finish, nullptr);
            return;
        }
        const char* reason = finish_reason_name(finish.reason);
        if (thinker_) {
            engine::chat::ReasoningDelta rest = thinker_->finish();
            on_parsed(std::move(rest.reasoning), answer_of(std::move(rest.content)),
                      engine::TokenDelta());
        }
        if (tools_) {
            on_parsed({}, tools_->finish(), engine::TokenDelta());
            reason = tools_->finish_reason(reason);
        }
        if (response_->stream) {
            json::object d;
            json::value last =
                response_->chat ? json::value(std::move(d)) : json::value(json::string());
            json::value lp = json::value(nullptr);
            if (response_->logprobs && !pending_logprobs_.empty()) {
                lp = logprobs_value(std::move(pending_logprobs_));
            }
            json::object end = with_ids(chunk(std::move(last), reason, std::move(lp)));
            if (tools_ && !tools_->abandoned().empty()) {
                json::array abandoned;
                for (int32_t i : tools_->abandoned()) {
                    abandoned.push_back(i);
                }
                end["choices"].get_array()[0].get_object()["abandoned_tool_calls"] =
                    std::move(abandoned);
            }
            response_->event(end);
            response_->choice_finished(index_, finish, nullptr);
            return;
        }
        json::object choice;
        choice["index"] = index_;
        if (response_->chat) {
            json::object message;
            message["role"] = "assistant";
            json::array calls = tools_ ? tools_->message_tool_calls() : json::array();
            message["content"] =
                text_.empty() && !calls.empty() ? json::value(nullptr) : json::value(text_);
            message["refusal"] = nullptr;
            if (thinker_) {
                message["reasoning_content"] =
                    reasoning_.empty() ? json::value(nullptr) : json::value(reasoning_);
            }
            if (!calls.empty()) {
                message["tool_calls"] = std::move(calls);
            }
            choice["message"] = std::move(message);
        } else {
            choice["text"] = text_;
        }
        choice["logprobs"] = response_->logprobs ? logprobs_value(std::move(all_logprobs_))
                                                 : json::value(nullptr);
        choice["finish_reason"] = reason;
        if (response_->return_token_ids) {
            choice["token_ids"] = json::value_from(token_ids_);
        }
        response_->choice_finished(index_, finish, std::move(choice));
    }

private:
    json::object chunk(json::value payload, const char* finish_reason,
                       json::value logprobs) const {
        return response_->chunk(index_, std::move(payload), finish_reason, std::move(logprobs));
    }

    // The answer's text through the tool-call parser when the request offers tools.
    engine::chat::ParsedDelta answer_of(std::string text) {
        if (tools_) {
            return tools_->feed(text);
        }
        engine::chat::ParsedDelta plain;
        plain.content = std::move(text);
        return plain;
    }

    // A delta of a response split by the parsers: the thought, content and tool-call deltas as
    // they released them. Logprobs of tokens they hold back go out with the next chunk that
    // carries anything.
    void on_parsed(std::string reasoning, engine::chat::ParsedDelta parsed,
                   const engine::TokenDelta& delta) {
        if (!response_->stream) {
            reasoning_ += reasoning;
            text_ += parsed.content;
            append_logprobs(delta, all_logprobs_);
            if (tools_) {
                tools_->accumulate(parsed);
            }
            return;
        }
        append_logprobs(delta, pending_logprobs_);
        auto take_logprobs = [&] {
            if (!response_->logprobs || pending_logprobs_.empty()) {
                return json::value(nullptr);
            }
            json::array lp = std::move(pending_logprobs_);
            pending_logprobs_ = json::array();
            return logprobs_value(std::move(lp));
        };
        if (!reasoning.empty()) {
            json::object d;
            d["reasoning_content"] = std::move(reasoning);
            response_->event(with_ids(chunk(std::move(d), nullptr, take_logprobs())));
        }
        if (!parsed.content.empty()) {
            json::object d;
            d["content"] = parsed.content;
            response_->event(with_ids(chunk(std::move(d), nullptr, take_logprobs())));
        }
        if (!parsed.tool_calls.empty()) {
            json::object d;
            d["tool_calls"] = ToolCallOutput::delta_tool_calls(parsed.tool_calls);
            response_->event(with_ids(chunk(std::move(d), nullptr, take_logprobs())));
        }
    }

    // A streamed chunk carries the ids generated since the previous one that carried ids (those of
    // a delta with no text wait for the next chunk).
    json::object with_ids(json::object chunk) {
        if (response_->return_token_ids) {
            chunk["choices"].get_array()[0].get_object()["token_ids"] =
                json::value_from(token_ids_);
            token_ids_.clear();
        }
        return chunk;
    }

    // Called once for each delta (of any text) when logprobs are asked for.
    void append_logprobs(const engine::TokenDelta& delta, json::array& out) {
        if (!response_->logprobs) {
            return;
        }
        for (const engine::TokenLogprob& lp : delta.logprobs) {
            json::object entry;
            entry["token"] = logprob_token_text(lp.token);
            // NaN: an echoed prompt's first token, which nothing predicts.
            entry["logprob"] =
                std::isnan(lp.logprob) ? json::value(nullptr) : json::value(lp.logprob);
            entry["bytes"] = token_bytes(lp.token);
            json::array top;
            for (const engine::TopLogprob& t : lp.top) {
                json::object alt;
                alt["token"] = logprob_token_text(t.token);
                alt["logprob"] = t.logprob;
                alt["bytes"] = token_bytes(t.token);
                top.push_back(std::move(alt));
            }
            entry["top_logprobs"] = std::move(top);
            if (!response_->chat) {
                // The legacy text_offset counts characters, as a Python client indexes the text.
                // The engine holds a token's logprob until its text starts showing, so its offset
                // falls inside this delta's text (or at its end).
                const size_t at = lp.text_offset + offset_base_;
                const size_t in_delta =
                    std::min(delta.text.size(), at - std::min(at, shown_bytes_));
                entry["text_offset"] =
                    shown_chars_ + engine::tokenizer::utf8_length(
                                       std::string_view(delta.text).substr(0, in_delta));
            }
            out.push_back(std::move(entry));
        }
        shown_bytes_ += delta.text.size();
        shown_chars_ += engine::tokenizer::utf8_length(delta.text);
    }

    json::value logprobs_value(json::array entries) const {
        if (response_->chat) {
            json::object o;
            o["content"] = std::move(entries);
            return o;
        }
        // Completions' legacy shape.
        json::array tokens;
        json::array token_logprobs;
        json::array top_logprobs;
        json::array text_offset;
        for (const json::value& e : entries) {
            const json::object& eo = e.get_object();
            tokens.push_back(eo.at("token"));
            text_offset.push_back(eo.at("text_offset"));
            token_logprobs.push_back(eo.at("logprob"));
            if (eo.at("logprob").is_null()) {
                top_logprobs.push_back(nullptr);  // As OpenAI's for the echoed first token.
                continue;
            }
            json::object top;
            for (const json::value& t : eo.at("top_logprobs").get_array()) {
                top[t.get_object().at("token").get_string()] = t.get_object().at("logprob");
            }
            // As OpenAI's: the sampled token is always among them (up to logprobs + 1 entries;
            // with logprobs 0, it alone).
            if (!top.contains(eo.at("token").get_string())) {
                top[eo.at("token").get_string()] = eo.at("logprob");
            }
            top_logprobs.push_back(std::move(top));
        }
        json::object o;
        o["tokens"] = std::move(tokens);
        o["token_logprobs"] = std::move(token_logprobs);
        o["top_logprobs"] = std::move(top_logprobs);
        o["text_offset"] = std::move(text_offset);
        return o;
    }

    const std::shared_ptr<Response> response_;
    const int32_t index_;
    std::unique_ptr<ToolCallOutput> tools_;  // Set when the request offers tools.
    // Set for chat answers of a model that thinks: splits off the thought.
    std::unique_ptr<engine::chat::ReasoningParser> thinker_;
    json::array pending_logprobs_;  // Streaming through the parsers: not yet sent.
    std::string text_;
    std::string reasoning_;  // Not streaming: the thought.
    json::array all_logprobs_;
    std::vector<engine::TokenId> token_ids_;  // Not yet sent (all of them when not streaming).
    size_t shown_bytes_ = 0;  // Generated text sent before the current delta, in bytes...
    size_t shown_chars_ = 0;  // ...and in characters.
    size_t offset_base_ = 0;  // Bytes of an echoed prompt before the completion's text.
    int64_t prompt_tokens_ = 0;  // Set from submit(), on the submitting thread.
};

}  // namespace

namespace {

// The model's recommended sampling (generation_config.json) for the fields the client left unset.
void apply_sampling_defaults(const engine::SamplingDefaults& d, ParsedRequest& r) {
    engine::SamplingParams& s = r.generate.sampling;
    if (d.temperature && !r.temperature_set) {
        s.temperature = *d.temperature;
    }
    if (d.top_p && !r.top_p_set) {
        s.top_p = *d.top_p;
    }
    if (d.top_k && !r.top_k_set) {
        s.top_k = *d.top_k;
    }
}

// An engine error about a prompt of a list names its element: the engine says "prompt", the
// client's field is "prompt[i]".
void name_batch_element(ApiError& error, int32_t prompt) {
    if (!error.param || error.param->rfind("prompt", 0) != 0) {
        return;
    }
    const std::string field = "prompt[" + std::to_string(prompt) + "]";
    if (error.message.rfind(*error.param, 0) == 0) {
        error.message = field + error.message.substr(error.param->size());
    }
    error.param = field + error.param->substr(6);
}

}  // namespace

void run_completion(engine::Generator& generator, ParsedRequest request,
                    std::shared_ptr<tls::ResponseChannel> channel, int64_t created_unix,
                    CompletionDone on_done,
                    std::function<void(int64_t prompt_tokens)> on_accepted) {
    std::string model = request.generate.model;
    const std::vector<engine::ModelInfo> models = generator.models();
    // The request fails at once, nothing having run: `on_done` hears it as refused, with the
    // prompt's length when the engine had tokenized it.
    auto refuse = [&](const Status& status, const ApiError& error, int64_t prompt_tokens = 0) {
        if (on_done) {
            engine::Finish finish;
            finish.reason = engine::FinishReason::kError;
            finish.error = status;
            finish.usage.prompt_tokens = prompt_tokens;
            on_done(finish, true);
        }
        channel->respond(error.to_response());
    };
    // Each choice parses its own tool calls.
    std::vector<std::unique_ptr<ToolCallOutput>> tools;
    for (int32_t i = 0; i < request.choices(); ++i) {
        auto t = ToolCallOutput::create(request, models, i);
        if (auto* error = std::get_if<ApiError>(&t)) {
            refuse(invalid_argument_error(error->message), *error);
            return;
        }
        tools.push_back(std::move(std::get<std::unique_ptr<ToolCallOutput>>(t)));
    }
    bool thinks = false;
    for (const engine::ModelInfo& m : models) {
        if (m.name == model) {
            thinks = m.thinks;
            apply_sampling_defaults(m.sampling_defaults, request);
        }
    }
    auto response = std::make_shared<Response>(request, channel, created_unix, on_done);
    const int32_t n = request.n;
    const int32_t choices = request.choices();
    const bool batch = request.prompts() > 1;
    const int64_t max_prompt_tokens = request.generate.max_prompt_tokens;
    std::vector<decltype(engine::GenerateRequest::prompt)> more_prompts =
        std::move(request.more_prompts);
    int64_t prompt_tokens = 0;  // Of the prompts submitted so far, each counted once...
    int64_t earlier_tokens = 0;  // ...and of those before the current one.
    // The request is refused (`status`, `error`): the choices already running are stopped and
    // their ends ignored, and the answer is this refusal, with its own status, streaming or not
    // (nothing went out yet).
    auto refuse_running = [&](const Status& status, const ApiError& error, int64_t tokens) {
        response->refuse();
        response->cancel_all();
        refuse(status, error, tokens);
    };
    for (int32_t c = 0; c < choices; ++c) {
        const int32_t prompt = c / n;
        const int32_t i = c % n;
        engine::GenerateRequest generate =
            c + 1 < choices ? request.generate : std::move(request.generate);
        if (i == 0) {
            earlier_tokens = prompt_tokens;
        }
        if (prompt > 0) {
            auto& own = more_prompts[static_cast<size_t>(prompt - 1)];
            generate.prompt = i + 1 < n ? own : std::move(own);
        }
        if (generate.sampling.seed) {
            // Choices of a seeded prompt differ from each other, and each is reproducible (the
            // same as that prompt alone with n 1 and this seed).
            *generate.sampling.seed += static_cast<uint64_t>(i);
        }
        auto sink = std::make_shared<ChoiceSink>(
            response, c, std::move(tools[static_cast<size_t>(c)]), thinks);
        Result<std::shared_ptr<engine::GenerationHandle>> handle =
            generator.submit(std::move(generate), sink);
        if (!handle.ok()) {
            ApiError error = api_error_from_status(handle.status(), model);
            if (batch) {
                name_batch_element(error, prompt);
            }
            refuse_running(handle.status(), error, earlier_tokens + sink->prompt_tokens());
            return;
        }
        response->add_handle(*handle);
        if (i != 0) {
            continue;
        }
        prompt_tokens += (*handle)->prompt_tokens();
        if (batch && max_prompt_tokens > 0 && prompt_tokens > max_prompt_tokens) {
            // Each prompt fits the tenant's input_tokens_per_minute (the engine checked it), but
            // together they could never be admitted either.
            const std::string message =
                "the prompts (" + std::to_string(prompt_tokens) + " tokens in prompt[0.." +
                std::to_string(prompt) + "]) exceed this tenant's input_tokens_per_minute of " +
                std::to_string(max_prompt_tokens);
            refuse_running(invalid_argument_error("prompt: " + message),
                           invalid_request(message, std::string("prompt")), prompt_tokens);
            return;
        }
    }
    // The head goes out before any token, so clients see the stream open at once.
    response->accept(prompt_tokens);
    if (on_accepted) {
        on_accepted(prompt_tokens);
    }
    channel->on_client_gone([response] { response->cancel_all(); });
}

}  // namespace edge::daemon::api
