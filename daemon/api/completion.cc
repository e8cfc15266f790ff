#include "daemon/api/completion.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string_view>
#include <vector>

#include <boost/json.hpp>

#include "common/json_text.h"
#include "daemon/api/tool_call_output.h"
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
    std::string out;
    size_t pos = 0;
    while (pos < token.size()) {
        const size_t n = engine::tokenizer::utf8_valid_sequence(token.substr(pos));
        if (n > 0) {
            out.append(token.substr(pos, n));
            pos += n;
            continue;
        }
        char hex[5];
        std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned char>(token[pos]));
        out.append(hex, 4);
        ++pos;
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

class CompletionSink final : public engine::GenerationSink {
public:
    CompletionSink(ParsedRequest request, std::shared_ptr<tls::ResponseChannel> channel,
                   int64_t created, CompletionDone on_done, std::unique_ptr<ToolCallOutput> tools,
                   bool thinks)
        : on_done_(std::move(on_done)),
          tools_(std::move(tools)),
          thinker_(thinks && request.endpoint == Endpoint::kChatCompletions
                       ? std::make_unique<engine::chat::ReasoningParser>()
                       : nullptr),
          chat_(request.endpoint == Endpoint::kChatCompletions),
          stream_(request.stream),
          include_usage_(request.include_usage),
          report_usage_(request.report_usage),
          logprobs_(request.generate.sampling.logprobs),
          return_token_ids_(request.return_token_ids),
          model_(request.generate.model),
          id_((chat_ ? "chatcmpl-" : "cmpl-") + request.generate.request_id),
          created_(created),
          channel_(channel),
          sse_(std::move(channel)) {}

    // Opens the event stream (the 200 head and, for chat, the role chunk) unless the response
    // has begun. Called once the engine accepted the request, so a request it refuses gets its
    // HTTP status (400, 404, 429 with Retry-After) rather than a 200 with the error inside;
    // also called by the sink's callbacks, which may run before that on the engine's thread.
    void start_stream() {
        std::lock_guard lock(begin_mu_);
        if (!stream_ || begun_) {
            return;
        }
        begun_ = true;
        sse_.begin();
        if (chat_) {
            // The first chunk carries the role, as OpenAI's does.
            json::object delta;
            delta["role"] = "assistant";
            delta["content"] = "";
            sse_.event(json_text(chunk(std::move(delta), nullptr, json::value(nullptr))));
        }
    }

    void on_thought_opened() override {
        if (thinker_) {
            thinker_->open_thought();
        }
    }

    void on_delta(engine::TokenDelta delta) override {
        start_stream();
        if (return_token_ids_) {
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
        if (!stream_) {
            text_ += delta.text;
            append_logprobs(delta, all_logprobs_);
            return;
        }
        if (delta.text.empty() && delta.logprobs.empty()) {
            return;
        }
        json::array lp;
        append_logprobs(delta, lp);
        json::value logprobs = logprobs_ ? logprobs_value(std::move(lp)) : json::value(nullptr);
        if (chat_) {
            json::object d;
            d["content"] = delta.text;
            sse_.event(json_text(with_ids(chunk(std::move(d), nullptr, std::move(logprobs)))));
        } else {
            sse_.event(
                json_text(with_ids(chunk(json::string(delta.text), nullptr, std::move(logprobs)))));
        }
    }

    void on_finish(engine::Finish finish) override {
        if (on_done_) {
            on_done_(finish, false);
            on_done_ = nullptr;
        }
        if (finish.reason == engine::FinishReason::kError ||
            finish.reason == engine::FinishReason::kCancelled) {
            // Cancelled: the client left (nobody reads this) or the server is shutting down and
            // its drain deadline cut the request.
            ApiError error = api_error_from_status(
                finish.reason == engine::FinishReason::kError
                    ? finish.error
                    : unavailable_error("the request was cancelled: the server is shutting down "
                                        "or the client left"),
                model_);
            if (!stream_) {
                channel_->respond(error.to_response());
            } else if (!begin_with_error(error)) {
                sse_.event(error.to_json());
                // OpenAI may leave the usage out of a stream cut short; what was generated until
                // then is still known here, and a client that asked for it counts it.
                usage_chunk(finish.usage);
                report_usage(finish.usage);
                sse_.done();
            }
            return;
        }
        start_stream();
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
        if (stream_) {
            json::object d;
            json::value last = chat_ ? json::value(std::move(d)) : json::value(json::string());
            json::value lp = json::value(nullptr);
            if (logprobs_ && !pending_logprobs_.empty()) {
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
            sse_.event(json_text(end));
            usage_chunk(finish.usage);
            report_usage(finish.usage);
            sse_.done();
            return;
        }
        json::object root = envelope();
        root["object"] = chat_ ? "chat.completion" : "text_completion";
        json::object choice;
        choice["index"] = 0;
        if (chat_) {
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
        choice["logprobs"] = logprobs_ ? logprobs_value(std::move(all_logprobs_))
                                       : json::value(nullptr);
        choice["finish_reason"] = reason;
        if (return_token_ids_) {
            choice["token_ids"] = json::value_from(token_ids_);
        }
        json::array choices;
        choices.push_back(std::move(choice));
        root["choices"] = std::move(choices);
        root["usage"] = usage_json(finish.usage);
        tls::HttpResponse response;
        response.body = json_text(root);
        channel_->respond(std::move(response));
    }

private:
    // The stream's last chunk before [DONE] when stream_options.include_usage asks for it.
    void usage_chunk(const engine::Usage& usage) {
        if (!include_usage_) {
            return;
        }
        json::object u = envelope();
        u["choices"] = json::array();
        u["usage"] = usage_json(usage);
        sse_.event(json_text(u));
    }

    void report_usage(const engine::Usage& usage) {
        if (!report_usage_) {
            return;
        }
        json::object u;
        u["prompt_tokens"] = usage.prompt_tokens;
        u["completion_tokens"] = usage.completion_tokens;
        sse_.comment(std::string(kUsageReportComment) + json_text(u));
    }

    // Answers a stream that has not begun with the error's own status; false once it has begun
    // (the error then goes in-band).
    bool begin_with_error(const ApiError& error) {
        std::lock_guard lock(begin_mu_);
        if (begun_) {
            return false;
        }
        begun_ = true;
        channel_->respond(error.to_response());
        return true;
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
        if (!stream_) {
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
            if (!logprobs_ || pending_logprobs_.empty()) {
                return json::value(nullptr);
            }
            json::array lp = std::move(pending_logprobs_);
            pending_logprobs_ = json::array();
            return logprobs_value(std::move(lp));
        };
        if (!reasoning.empty()) {
            json::object d;
            d["reasoning_content"] = std::move(reasoning);
            sse_.event(json_text(with_ids(chunk(std::move(d), nullptr, take_logprobs()))));
        }
        if (!parsed.content.empty()) {
            json::object d;
            d["content"] = parsed.content;
            sse_.event(json_text(with_ids(chunk(std::move(d), nullptr, take_logprobs()))));
        }
        if (!parsed.tool_calls.empty()) {
            json::object d;
            d["tool_calls"] = ToolCallOutput::delta_tool_calls(parsed.tool_calls);
            sse_.event(json_text(with_ids(chunk(std::move(d), nullptr, take_logprobs()))));
        }
    }

    json::object envelope() const {
        json::object o;
        o["id"] = id_;
        o["object"] = chat_ ? "chat.completion.chunk" : "text_completion";
        o["created"] = created_;
        o["model"] = model_;
        o["system_fingerprint"] = nullptr;
        return o;
    }

    // One streamed chunk: for chat `payload` is the delta object, for completions the text.
    json::object chunk(json::value payload, const char* finish_reason, json::value logprobs) const {
        json::object o = envelope();
        json::object choice;
        choice["index"] = 0;
        choice[chat_ ? "delta" : "text"] = std::move(payload);
        choice["logprobs"] = std::move(logprobs);
        choice["finish_reason"] =
            finish_reason ? json::value(finish_reason) : json::value(nullptr);
        json::array choices;
        choices.push_back(std::move(choice));
        o["choices"] = std::move(choices);
        if (include_usage_) {
            o["usage"] = nullptr;
        }
        return o;
    }

    // Called once for each delta (of any text) when logprobs are asked for.
    // A streamed chunk carries the ids generated since the previous one that carried ids (those of
    // a delta with no text wait for the next chunk). Engine thread only.
    json::object with_ids(json::object chunk) {
        if (return_token_ids_) {
            chunk["choices"].get_array()[0].get_object()["token_ids"] = json::value_from(token_ids_);
            token_ids_.clear();
        }
        return chunk;
    }

    void append_logprobs(const engine::TokenDelta& delta, json::array& out) {
        if (!logprobs_) {
            return;
        }
        for (const engine::TokenLogprob& lp : delta.logprobs) {
            json::object entry;
            entry["token"] = logprob_token_text(lp.token);
            entry["logprob"] = lp.logprob;
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
            if (!chat_) {
                // The legacy text_offset counts characters, as a Python client indexes the text.
                // The engine holds a token's logprob until its text starts showing, so its offset
                // falls inside this delta's text (or at its end).
                const size_t in_delta = std::min(
                    delta.text.size(), lp.text_offset - std::min(lp.text_offset, shown_bytes_));
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
        if (chat_) {
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

    CompletionDone on_done_;
    std::unique_ptr<ToolCallOutput> tools_;  // Set when the request offers tools.
    // Set for chat answers of a model that thinks: splits off the thought.
    std::unique_ptr<engine::chat::ReasoningParser> thinker_;
    json::array pending_logprobs_;  // Streaming through the parsers: not yet sent.
    const bool chat_;
    const bool stream_;
    const bool include_usage_;
    const bool report_usage_;
    const bool logprobs_;
    const bool return_token_ids_;
    const std::string model_;
    const std::string id_;
    const int64_t created_;
    std::shared_ptr<tls::ResponseChannel> channel_;
    std::mutex begin_mu_;
    bool begun_ = false;  // The stream's head (or a whole error response) went out.
    SseWriter sse_;
    std::string text_;
    std::string reasoning_;  // Not streaming: the thought.
    json::array all_logprobs_;
    std::vector<engine::TokenId> token_ids_;  // Not yet sent (all of them when not streaming).
    size_t shown_bytes_ = 0;  // Generated text sent before the current delta, in bytes...
    size_t shown_chars_ = 0;  // ...and in characters.
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

}  // namespace

void run_completion(engine::Generator& generator, ParsedRequest request,
                    std::shared_ptr<tls::ResponseChannel> channel, int64_t created_unix,
                    CompletionDone on_done,
                    std::function<void(int64_t prompt_tokens)> on_accepted) {
    std::string model = request.generate.model;
    const std::vector<engine::ModelInfo> models = generator.models();
    auto tools = ToolCallOutput::create(request, models);
    if (auto* error = std::get_if<ApiError>(&tools)) {
        if (on_done) {
            engine::Finish finish;
            finish.reason = engine::FinishReason::kError;
            finish.error = invalid_argument_error(error->message);
            on_done(finish, true);
        }
        channel->respond(error->to_response());
        return;
    }
    bool thinks = false;
    for (const engine::ModelInfo& m : models) {
        if (m.name == model) {
            thinks = m.thinks;
            apply_sampling_defaults(m.sampling_defaults, request);
        }
    }
    auto sink = std::make_shared<CompletionSink>(
        request, channel, created_unix, on_done,
        std::move(std::get<std::unique_ptr<ToolCallOutput>>(tools)), thinks);
    Result<std::shared_ptr<engine::GenerationHandle>> handle =
        generator.submit(std::move(request.generate), sink);
    if (!handle.ok()) {
        if (on_done) {
            engine::Finish finish;
            finish.reason = engine::FinishReason::kError;
            finish.error = handle.status();
            on_done(finish, true);
        }
        // Nothing went out yet: the error's own status, streaming or not.
        channel->respond(api_error_from_status(handle.status(), model).to_response());
        return;
    }
    // The head goes out before any token, so clients see the stream open at once.
    sink->start_stream();
    if (on_accepted) {
        on_accepted((*handle)->prompt_tokens());
    }
    channel->on_client_gone([handle = *handle] { handle->cancel(); });
}

}  // namespace edge::daemon::api
