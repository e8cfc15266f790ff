#include "daemon/api/request_prompt.h"

#include <limits>
#include <string>
#include <vector>

namespace edge::daemon::api {

namespace json = boost::json;

namespace {

// Bounds that keep a hostile request cheap before it reaches the engine.
constexpr size_t kMaxPromptTokens = 1 << 20;

// One prompt given as token ids (`name`: the field, for errors).
bool parse_token_ids(Validator& v, const json::array& list, const std::string& name,
                     std::vector<engine::TokenId>& ids) {
    if (list.empty()) {
        return v.fail("'" + name + "' is an empty list of token ids", name);
    }
    if (list.size() > kMaxPromptTokens) {
        return v.fail("'" + name + "' has too many tokens", name);
    }
    ids.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
        std::optional<int64_t> id = v.integer(list[i], name + "[" + std::to_string(i) + "]", 0,
                                              std::numeric_limits<engine::TokenId>::max());
        if (!id) {
            return false;
        }
        ids.push_back(static_cast<engine::TokenId>(*id));
    }
    return true;
}

}  // namespace

// A string, token ids, or a list of prompts (OpenAI's batch: strings, or arrays of token ids,
// not both): the first goes to generate.prompt, the others to more_prompts.
bool parse_prompt(Validator& v, const json::value& value, ParsedRequest& out) {
    engine::GenerateRequest& req = out.generate;
    if (value.is_string()) {
        req.prompt = std::string(value.get_string());
        return true;
    }
    if (!value.is_array() || value.get_array().empty()) {
        return v.fail(
            "'prompt' must be a string, an array of token ids, or an array of prompts (strings, "
            "or arrays of token ids)",
            "prompt");
    }
    const json::array& a = value.get_array();
    if (!a[0].is_string() && !a[0].is_array()) {
        std::vector<engine::TokenId> ids;
        if (!parse_token_ids(v, a, "prompt", ids)) {
            return false;
        }
        req.prompt = std::move(ids);
        return true;
    }
    if (a.size() > static_cast<size_t>(kMaxBatchChoices)) {
        return v.fail("'prompt' holds more than " + std::to_string(kMaxBatchChoices) + " prompts",
                      "prompt");
    }
    // The kind of prompt[0] is the kind of every element (as vLLM's parser takes them).
    const bool text = a[0].is_string();
    out.more_prompts.clear();
    out.prompt_list = true;
    for (size_t i = 0; i < a.size(); ++i) {
        const std::string name = "prompt[" + std::to_string(i) + "]";
        decltype(engine::GenerateRequest::prompt) prompt;
        if (text != a[i].is_string() || (!text && !a[i].is_array())) {
            return v.fail("'" + name + "' must be " +
                              (text ? "a string" : "an array of token ids") +
                              ", as 'prompt[0]' is: a list of prompts holds strings or arrays "
                              "of token ids, not both",
                          name);
        }
        if (text) {
            prompt = std::string(a[i].get_string());
        } else {
            std::vector<engine::TokenId> ids;
            if (!parse_token_ids(v, a[i].get_array(), name, ids)) {
                return false;
            }
            prompt = std::move(ids);
        }
        if (i == 0) {
            req.prompt = std::move(prompt);
        } else {
            out.more_prompts.push_back(std::move(prompt));
        }
    }
    return true;
}

}  // namespace edge::daemon::api
