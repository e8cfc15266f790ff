#include "daemon/api/tool_call_output.h"

#include <algorithm>

namespace edge::daemon::api {
namespace {

namespace json = boost::json;
namespace chat = engine::chat;
using engine::sampling::ArgumentPairs;

// A held call to a tool that is not strict: any object as its arguments, written as under a
// schema (one space at most between tokens), so the call does not run on in whitespace.
const std::shared_ptr<const engine::sampling::JsonSchema>& any_arguments() {
    static const std::shared_ptr<const engine::sampling::JsonSchema> schema =
        *engine::sampling::JsonSchema::compile(json::parse(R"({"type": "object"})"));
    return schema;
}

}  // namespace

std::variant<std::unique_ptr<ToolCallOutput>, ApiError> ToolCallOutput::create(
    ParsedRequest& request, const std::vector<engine::ModelInfo>& models, int32_t choice) {
    if (request.endpoint != Endpoint::kChatCompletions || request.generate.tools.empty() ||
        request.tool_choice == ToolChoice::kNone) {
        return std::unique_ptr<ToolCallOutput>();
    }
    const auto model = std::find_if(models.begin(), models.end(), [&](const auto& m) {
        return m.name == request.generate.model;
    });
    if (model == models.end()) {
        return std::unique_ptr<ToolCallOutput>();
    }
    Result<chat::ToolCallFormat> format = chat::tool_call_format_from_name(model->tool_call_format);
    if (!format.ok()) {
        return invalid_request("model '" + model->name +
                                   "' has no chat format that supports tools; send the request "
                                   "without 'tools'",
                               std::string("tools"));
    }
    const std::string ids = "call_" + request.generate.request_id + "_" +
                            (request.n > 1 ? std::to_string(choice) + "_" : std::string());
    std::unique_ptr<ToolCallOutput> out(
        new ToolCallOutput(chat::create_tool_call_parser(*format, ids, request.generate.tools)));
    if (request.tool_choice == ToolChoice::kRequired ||
        request.tool_choice == ToolChoice::kFunction) {
        const std::string_view function = request.tool_choice == ToolChoice::kFunction
                                              ? std::string_view(request.tool_choice_function)
                                              : std::string_view();
        // Calls already made in the conversation (Kimi K2 numbers a named call after them).
        size_t earlier_calls = 0;
        if (const auto* messages =
                std::get_if<std::vector<engine::ChatMessage>>(&request.generate.prompt)) {
            for (const engine::ChatMessage& m : *messages) {
                earlier_calls += m.tool_calls.size();
            }
        }
        std::string prefix = chat::forced_call_prefix(*format, function, earlier_calls);
        request.generate.assistant_prefix = std::string(chat::forced_call_lead(*format)) + prefix;
        out->prefix_ = std::move(prefix);
        if (choice == 0) {
            hold_calls(*format, function, request);
        }
    } else if (request.generate.sampling.json.schema == nullptr && choice == 0) {
        // "auto": calls the model opens on its own, unless response_format holds the reply
        // (JSON content has no call).
        hold_calls(*format, std::nullopt, request);
    }
    return out;
}

void ToolCallOutput::hold_calls(chat::ToolCallFormat format,
                                std::optional<std::string_view> function, ParsedRequest& request) {
    engine::SamplingParams& sampling = request.generate.sampling;
    if (function) {
        sampling.json.schema.reset();  // A forced call is not content: response_format is out.
    }
    const std::vector<engine::ToolSpec>& tools = request.generate.tools;
    // GLM-4.5 writes the arguments as key/value pairs, its declared strings as raw text.
    auto pairs = [&](const engine::ToolSpec& t) -> std::shared_ptr<const ArgumentPairs> {
        if (!chat::arguments_as_pairs(format)) {
            return nullptr;
        }
        return std::make_shared<const ArgumentPairs>(
            ArgumentPairs{chat::glm45_string_arguments(t)});
    };
    // A strict tool's arguments follow its parameters; any other's are any object.
    auto arguments = [](const engine::ToolSpec& t) {
        return t.strict_schema ? t.strict_schema : any_arguments();
    };
    if (function && !function->empty()) {
        // Named: a forced call is always held, so it parses: the arguments, then the call's end.
        const auto tool = std::find_if(tools.begin(), tools.end(), [&](const engine::ToolSpec& t) {
            return t.name == *function;
        });
        if (tool != tools.end()) {
            const std::string_view lead = chat::arguments_lead(format);
            if (lead.empty()) {
                sampling.json.schema = arguments(*tool);
                sampling.json.pairs = pairs(*tool);
            } else {
                // The reply starts with the lead the prefix leaves to the model (Hermes's space
                // after "arguments":), then the arguments.
                sampling.json.heads.push_back({std::string(lead), arguments(*tool), pairs(*tool)});
            }
            sampling.json.tail = chat::forced_call_tail(format);
        }
        return;
    }
    // "required" and "auto": the model names one of the tools (a head each: the rest of the
    // call's start with its name), then writes its arguments, then the call's end. "required"
    // is always held, from the start (the first opening is forced), so the reply is a call that
    // parses, as vLLM's is; with parallel calls the model may then open more. "auto": from each
    // call's opening the model writes on its own (the trigger), when some tool is strict or the
    // reply may hold one call only (parallel_tool_calls false: it then ends with the call's end).
    const bool strict = std::any_of(tools.begin(), tools.end(), [](const engine::ToolSpec& t) {
        return t.strict_schema != nullptr;
    });
    if (!function && !strict && request.parallel_tool_calls) {
        return;
    }
    for (const engine::ToolSpec& t : tools) {
        chat::CallHead head = chat::held_call_head(format, t.name);
        sampling.json.heads.push_back(
            {std::move(head.text), arguments(t), pairs(t), head.number_at});
    }
    sampling.json.tail = chat::forced_call_tail(format);
    if (request.parallel_tool_calls) {
        // Further calls in the same section, where the format's tail closes one.
        chat::NextCall next = chat::next_call_in_section(format);
        sampling.json.next_at = next.at;
        sampling.json.next = std::move(next.text);
    }
    sampling.json.trigger = chat::forced_call_prefix(format, "");
    sampling.json.held_at_start = function.has_value();
    sampling.json.again = request.parallel_tool_calls;
}

chat::ParsedDelta ToolCallOutput::settle(chat::ParsedDelta out) {
    // A call given up in the same delta that started it never reaches the client: its text is
    // content, as in the non-streamed answer, with no header of a call that is not one. The
    // parser sees to that within one feed(); this covers a call that finish() both starts and
    // gives up (nothing follows it, so the index it leaves out is not a gap).
    std::erase_if(out.abandoned_calls, [&](int32_t index) {
        const bool started_here = std::any_of(
            out.tool_calls.begin(), out.tool_calls.end(),
            [&](const chat::ToolCallDelta& d) { return d.index == index && !d.name.empty(); });
        if (started_here) {
            std::erase_if(out.tool_calls,
                          [&](const chat::ToolCallDelta& d) { return d.index == index; });
        }
        return started_here;
    });
    abandoned_.insert(abandoned_.end(), out.abandoned_calls.begin(), out.abandoned_calls.end());
    return out;
}

chat::ParsedDelta ToolCallOutput::feed(std::string_view text) {
    if (prefix_ && text.empty()) {
        return {};  // The prefix waits for the model's first text: see finish().
    }
    if (prefix_) {
        // The prefix and the model's first text in one feed(): a forced call the model breaks
        // at once is then one the parser drops unseen (not listed as abandoned, its index
        // reused), as the client never received its header.
        std::string first = std::move(*prefix_);
        prefix_.reset();
        first += text;
        return settle(parser_->feed(first));
    }
    return settle(parser_->feed(text));
}

chat::ParsedDelta ToolCallOutput::finish() {
    // The model wrote nothing after a forced call's prefix (an end of sequence at once): the
    // prefix is ours, not the model's, so the reply is empty and ends for the engine's reason,
    // not as a malformed call whose text (the prefix) the client would take for the model's.
    prefix_.reset();
    return settle(parser_->finish());
}

void ToolCallOutput::accumulate(const chat::ParsedDelta& delta) {
    for (const chat::ToolCallDelta& d : delta.tool_calls) {
        if (calls_.empty() || calls_.back().index != d.index) {
            calls_.push_back(Call{d.index, d.id, d.name, ""});
        }
        calls_.back().arguments += d.arguments;
    }
    for (int32_t index : delta.abandoned_calls) {
        std::erase_if(calls_, [&](const Call& c) { return c.index == index; });
    }
}

json::array ToolCallOutput::message_tool_calls() const {
    json::array out;
    for (const Call& c : calls_) {
        json::object fn;
        fn["name"] = c.name;
        fn["arguments"] = c.arguments;
        json::object call;
        call["id"] = c.id;
        call["type"] = "function";
        call["function"] = std::move(fn);
        out.push_back(std::move(call));
    }
    return out;
}

json::array ToolCallOutput::delta_tool_calls(const std::vector<chat::ToolCallDelta>& calls) {
    json::array out;
    for (const chat::ToolCallDelta& d : calls) {
        json::object call;
        call["index"] = d.index;
        json::object fn;
        if (!d.name.empty()) {
            call["id"] = d.id;
            call["type"] = "function";
            fn["name"] = d.name;
        }
        fn["arguments"] = d.arguments;
        call["function"] = std::move(fn);
        out.push_back(std::move(call));
    }
    return out;
}

const char* ToolCallOutput::finish_reason(const char* engine_reason) const {
    if (std::string_view(engine_reason) == "length") {
        return engine_reason;  // Cut off: an unfinished call is content, as the text is.
    }
    if (parser_->malformed()) {
        return "malformed_tool_call";
    }
    if (parser_->completed_calls() > 0) {
        return "tool_calls";
    }
    return engine_reason;
}

}  // namespace edge::daemon::api
