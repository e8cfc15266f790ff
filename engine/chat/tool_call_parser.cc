#include "engine/chat/tool_call_parser.h"

#include <algorithm>
#include <boost/json.hpp>

#include "common/json_text.h"
#include "engine/chat/marker_parser.h"

namespace edge::engine::chat {

Result<ToolCallFormat> tool_call_format_from_name(std::string_view name) {
    if (name == "hermes" || name == "qwen3") {
        return ToolCallFormat::kHermes;
    }
    if (name == "glm4_5" || name == "glm45") {
        return ToolCallFormat::kGlm45;
    }
    if (name == "kimi_k2") {
        return ToolCallFormat::kKimiK2;
    }
    if (name == "deepseek_v3") {
        return ToolCallFormat::kDeepSeekV3;
    }
    if (name == "deepseek_v3_1") {
        return ToolCallFormat::kDeepSeekV31;
    }
    return invalid_argument_error("tool-call format '" + std::string(name) +
                                  "' is not known (hermes, qwen3, glm4_5, kimi_k2, deepseek_v3, "
                                  "deepseek_v3_1)");
}

std::string_view tool_call_format_name(ToolCallFormat format) {
    switch (format) {
        case ToolCallFormat::kHermes:
            return "hermes";
        case ToolCallFormat::kGlm45:
            return "glm4_5";
        case ToolCallFormat::kKimiK2:
            return "kimi_k2";
        case ToolCallFormat::kDeepSeekV3:
            return "deepseek_v3";
        case ToolCallFormat::kDeepSeekV31:
            return "deepseek_v3_1";
    }
    return "hermes";
}

std::string forced_call_prefix(ToolCallFormat format, std::string_view function,
                               size_t call_index) {
    switch (format) {
        case ToolCallFormat::kGlm45:
            return function.empty() ? "<tool_call>" : "<tool_call>" + std::string(function) + "\n";
        case ToolCallFormat::kKimiK2:
            return function.empty() ? "<|tool_calls_section_begin|><|tool_call_begin|>"
                                    : "<|tool_calls_section_begin|><|tool_call_begin|>functions." +
                                          std::string(function) + ":" + std::to_string(call_index) +
                                          "<|tool_call_argument_begin|>";
        case ToolCallFormat::kDeepSeekV3:
            return function.empty()
                       ? "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
                       : "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>" +
                             std::string(function) + "\n```json\n";
        case ToolCallFormat::kDeepSeekV31:
            return "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>" +
                   (function.empty() ? std::string() : std::string(function) + "<｜tool▁sep｜>");
        case ToolCallFormat::kHermes:
            break;
    }
    return function.empty()
               ? "<tool_call>\n"
               : "<tool_call>\n{\"name\": " + detail::quote(function) + ", \"arguments\":";
}

std::string_view arguments_lead(ToolCallFormat format) {
    return format == ToolCallFormat::kHermes ? " " : "";
}

std::string_view forced_call_lead(ToolCallFormat format) {
    return format == ToolCallFormat::kGlm45 ? "\n" : "";
}

std::string forced_call_tail(ToolCallFormat format) {
    switch (format) {
        case ToolCallFormat::kGlm45:
            return "</tool_call>";
        case ToolCallFormat::kKimiK2:
            return "<|tool_call_end|><|tool_calls_section_end|>";
        case ToolCallFormat::kDeepSeekV3:
            return "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        case ToolCallFormat::kDeepSeekV31:
            return "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        case ToolCallFormat::kHermes:
            break;
    }
    return "}\n</tool_call>";
}

CallHead held_call_head(ToolCallFormat format, std::string_view function) {
    const std::string opening = forced_call_prefix(format, "");
    CallHead head{forced_call_prefix(format, function).substr(opening.size()) +
                  std::string(arguments_lead(format))};
    if (format == ToolCallFormat::kKimiK2) {
        // "functions.f:0<|tool_call_argument_begin|>": the index is the model's to write.
        const size_t at = std::string("functions.").size() + function.size() + 1;
        head.text.erase(at, 1);
        head.number_at = static_cast<int32_t>(at);
    }
    return head;
}

NextCall next_call_in_section(ToolCallFormat format) {
    const std::string tail = forced_call_tail(format);
    switch (format) {
        case ToolCallFormat::kKimiK2:
            return {tail.size() - std::string_view("<|tool_calls_section_end|>").size(),
                    "<|tool_call_begin|>"};
        case ToolCallFormat::kDeepSeekV3:
            // V3's template puts a newline between the calls of a section.
            return {tail.size() - std::string_view("<｜tool▁calls▁end｜>").size(),
                    "\n<｜tool▁call▁begin｜>"};
        case ToolCallFormat::kDeepSeekV31:
            return {tail.size() - std::string_view("<｜tool▁calls▁end｜>").size(),
                    "<｜tool▁call▁begin｜>"};
        case ToolCallFormat::kHermes:
        case ToolCallFormat::kGlm45:
            break;
    }
    return {};
}

bool arguments_as_pairs(ToolCallFormat format) { return format == ToolCallFormat::kGlm45; }

std::vector<std::string> glm45_string_arguments(const ToolSpec& tool) {
    std::vector<std::string> keys;
    std::error_code ec;
    const boost::json::value schema = parse_json(tool.parameters_json, ec);
    const boost::json::object* o = !ec ? schema.if_object() : nullptr;
    const boost::json::value* props = o != nullptr ? o->if_contains("properties") : nullptr;
    if (props == nullptr || !props->is_object()) {
        return keys;
    }
    for (const auto& p : props->get_object()) {
        const boost::json::value* type =
            p.value().is_object() ? p.value().get_object().if_contains("type") : nullptr;
        if (type != nullptr && type->is_string() && type->get_string() == "string") {
            keys.emplace_back(p.key());
        }
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return keys;
}

std::unique_ptr<ToolCallParser> create_tool_call_parser(ToolCallFormat format,
                                                        std::string id_prefix,
                                                        const std::vector<ToolSpec>& tools) {
    switch (format) {
        case ToolCallFormat::kGlm45:
            return detail::make_glm45_parser(std::move(id_prefix), tools);
        case ToolCallFormat::kKimiK2:
            return detail::make_kimi_k2_parser(std::move(id_prefix));
        case ToolCallFormat::kDeepSeekV3:
            return detail::make_deepseek_v3_parser(std::move(id_prefix));
        case ToolCallFormat::kDeepSeekV31:
            return detail::make_deepseek_v3_1_parser(std::move(id_prefix));
        case ToolCallFormat::kHermes:
        default:
            return detail::make_hermes_parser(std::move(id_prefix));
    }
}

}  // namespace edge::engine::chat
