#include "daemon/api/choice_sink.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <utility>

#include "daemon/api/completion.h"
#include "engine/tokenizer/utf8.h"

namespace edge::daemon::api {
namespace {

namespace json = boost::json;

const char* finish_reason_name(engine::FinishReason r) {
    switch (r) {
        case engine::FinishReason::kStop:
            return "stop";
        case engine::FinishReason::kLength:
            return "length";
        case engine::FinishReason::kCancelled:
            return "cancelled";
        case engine::FinishReason::kError:
            return "error";
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

// A prompt given as ids, echoed as its tokens' bytes decoded as the completion's are (each maximal
// subpart that is not UTF-8, as the IncrementalDecoder does): it may hold bytes that are not UTF-8
// (a lone byte token), which become U+FFFD, not invalid JSON. The engine's offsets count the raw
// bytes, which each U+FFFD (3 bytes) shifts: they are recounted in the text returned, a token
// starting where the character holding its first byte starts.
std::string decoded_prompt(std::vector<engine::TokenLogprob>& tokens) {
    std::string raw;
    std::vector<size_t> starts;
    for (const engine::TokenLogprob& t : tokens) {
        starts.push_back(raw.size());
        raw += t.token;
    }
    std::string text;
    size_t next = 0;  // The first token whose offset is not yet known.
    for (size_t pos = 0; pos < raw.size();) {
        const std::string_view rest = std::string_view(raw).substr(pos);
        size_t n = engine::tokenizer::utf8_valid_sequence(rest);
        const bool valid = n > 0;
        if (!valid) {
            n = engine::tokenizer::utf8_maximal_subpart(rest);
        }
        for (; next < tokens.size() && starts[next] < pos + n; ++next) {
            tokens[next].text_offset = text.size();
        }
        text.append(valid ? rest.substr(0, n) : std::string_view("\xEF\xBF\xBD"));
        pos += n;
    }
    for (; next < tokens.size(); ++next) {
        tokens[next].text_offset = text.size();  // Tokens with no bytes, at the end.
    }
    return text;
}

// A text prompt, echoed as the client sent it (as OpenAI's and vLLM's echo): its tokens' bytes
// may read otherwise, the tokenizer having added a start-of-text token (DeepSeek's BOS) and
// normalised the text (NFC), and those tokens (the BOS's included) still come with their logprobs.
// Each token's offset is placed in the sent text thus: from where the two texts agree to their
// ends, it counts back from the end; before that, a token whose bytes the sent text has at the
// current position (0 at first) takes it and moves it past them, and one whose bytes are not there
// (the BOS, text the normaliser changed) takes it and leaves it. Then each moves back to the start
// of the character holding it. So the offsets never decrease and all index the text returned.
std::string sent_prompt(std::string sent, std::vector<engine::TokenLogprob>& tokens) {
    std::string read;
    std::vector<size_t> starts;
    for (const engine::TokenLogprob& t : tokens) {
        starts.push_back(read.size());
        read += t.token;
    }
    size_t same_end = 0;  // The bytes both texts end with.
    while (same_end < read.size() && same_end < sent.size() &&
           read[read.size() - 1 - same_end] == sent[sent.size() - 1 - same_end]) {
        ++same_end;
    }
    const size_t read_tail = read.size() - same_end;  // Where those bytes start in each.
    const size_t sent_tail = sent.size() - same_end;
    size_t pos = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
        size_t at = 0;
        if (starts[i] >= read_tail) {
            at = starts[i] - read_tail + sent_tail;
        } else {
            at = std::min(pos, sent_tail);
            if (std::string_view(sent).substr(pos).starts_with(tokens[i].token)) {
                pos += tokens[i].token.size();
            }
        }
        while (at > 0 && at < sent.size() &&
               (static_cast<unsigned char>(sent[at]) & 0xC0) == 0x80) {
            --at;
        }
        tokens[i].text_offset = at;
    }
    return sent;
}

}  // namespace

ChoiceSink::ChoiceSink(std::shared_ptr<Response> response, int32_t index,
                       std::unique_ptr<ToolCallOutput> tools, bool thinks,
                       std::optional<std::string> prompt_text)
    : response_(std::move(response)),
      index_(index),
      tools_(std::move(tools)),
      thinker_(thinks && response_->chat ? std::make_unique<engine::chat::ReasoningParser>()
                                         : nullptr),
      prompt_text_(std::move(prompt_text)) {}

void ChoiceSink::on_thought_opened() {
    if (thinker_) {
        thinker_->open_thought();
    }
}

void ChoiceSink::on_prompt(std::vector<engine::TokenLogprob> tokens) {
    engine::TokenDelta prompt;
    prompt.text = prompt_text_ ? sent_prompt(*prompt_text_, tokens) : decoded_prompt(tokens);
    if (response_->logprobs) {
        prompt.logprobs = std::move(tokens);
    }
    const size_t bytes = prompt.text.size();
    on_delta(std::move(prompt));
    offset_base_ = bytes;  // The completion's tokens count their offsets after it.
}

void ChoiceSink::on_delta(engine::TokenDelta delta) {
    completion_tokens_ += static_cast<int64_t>(delta.token_ids.size());
    if (response_->return_token_ids) {
        token_ids_.insert(token_ids_.end(), delta.token_ids.begin(), delta.token_ids.end());
    }
    if (thinker_ || tools_) {
        engine::chat::ReasoningDelta split;
        if (thinker_) {
            // A token fed inside the thought, or that opened it, is the thought's (the marker
            // tokens included, as OpenAI counts reasoning_tokens: generated, not shown as
            // content).
            // Tokens fed before the output decided (part of a split <think>, whitespace before
            // it) are the thought's once it opens.
            // (One delta may open and close the thought: "ink></think>" after "<th".)
            const bool thinking = thinker_->in_thought();
            const bool opened = thinker_->opened();
            split = thinker_->feed(delta.text);
            const auto tokens = static_cast<int64_t>(delta.token_ids.size());
            if (thinking || thinker_->in_thought() || (!opened && thinker_->opened())) {
                reasoning_tokens_ += undecided_tokens_ + tokens;
                undecided_tokens_ = 0;
            } else if (thinker_->undecided()) {
                undecided_tokens_ += tokens;
            } else {
                undecided_tokens_ = 0;
            }
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
        response_->event(with_ids(chunk(json::string(delta.text), nullptr, std::move(logprobs))));
    }
}

void ChoiceSink::on_finish(engine::Finish finish) {
    finish.usage.reasoning_tokens = std::min(reasoning_tokens_, finish.usage.completion_tokens);
    if (finish.reason == engine::FinishReason::kError ||
        finish.reason == engine::FinishReason::kCancelled) {
        response_->choice_finished(index_, finish, nullptr);
        return;
    }
    const char* reason = finish_reason_name(finish.reason);
    // The choice's last chunks count its tokens as the final usage chunk sums them.
    completion_tokens_ = finish.usage.completion_tokens;
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
    choice["logprobs"] =
        response_->logprobs ? logprobs_value(std::move(all_logprobs_)) : json::value(nullptr);
    choice["finish_reason"] = reason;
    if (response_->return_token_ids) {
        choice["token_ids"] = json::value_from(token_ids_);
    }
    response_->choice_finished(index_, finish, std::move(choice));
}

json::object ChoiceSink::chunk(json::value payload, const char* finish_reason,
                               json::value logprobs) const {
    json::object o =
        response_->chunk(index_, std::move(payload), finish_reason, std::move(logprobs));
    if (response_->continuous_usage) {
        o["usage"] = running_usage(prompt_tokens_, completion_tokens_);
    }
    return o;
}

engine::chat::ParsedDelta ChoiceSink::answer_of(std::string text) {
    if (tools_) {
        return tools_->feed(text);
    }
    engine::chat::ParsedDelta plain;
    plain.content = std::move(text);
    return plain;
}

void ChoiceSink::on_parsed(std::string reasoning, engine::chat::ParsedDelta parsed,
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

json::object ChoiceSink::with_ids(json::object chunk) {
    if (response_->return_token_ids) {
        chunk["choices"].get_array()[0].get_object()["token_ids"] = json::value_from(token_ids_);
        token_ids_.clear();
    }
    return chunk;
}

void ChoiceSink::append_logprobs(const engine::TokenDelta& delta, json::array& out) {
    if (!response_->logprobs) {
        return;
    }
    for (const engine::TokenLogprob& lp : delta.logprobs) {
        json::object entry;
        entry["token"] = logprob_token_text(lp.token);
        // NaN: an echoed prompt's first token, which nothing predicts.
        entry["logprob"] = std::isnan(lp.logprob) ? json::value(nullptr) : json::value(lp.logprob);
        entry["bytes"] = token_bytes(lp.token);
        json::array top;
        for (const engine::TopLogprob& t : lp.top) {
            json::object alt;
            // The legacy top_logprobs are keyed by the tokens' texts, the sampled one among them:
            // a special token left out of the text has an empty `token`, and its alternative
            // keyed by its own text would list it twice. Chat lists alternatives by their text.
            alt["token"] = !response_->chat && t.id == lp.id
                               ? entry["token"]
                               : json::value(logprob_token_text(t.token));
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
            const size_t in_delta = std::min(delta.text.size(), at - std::min(at, shown_bytes_));
            entry["text_offset"] =
                shown_chars_ +
                engine::tokenizer::utf8_length(std::string_view(delta.text).substr(0, in_delta));
        }
        out.push_back(std::move(entry));
    }
    shown_bytes_ += delta.text.size();
    shown_chars_ += engine::tokenizer::utf8_length(delta.text);
}

json::value ChoiceSink::logprobs_value(json::array entries) const {
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

}  // namespace edge::daemon::api
