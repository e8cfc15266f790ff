#include "daemon/api/openai_request.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cctype>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <unordered_set>

#include "common/json_text.h"
#include "daemon/api/request_messages.h"
#include "daemon/api/request_prompt.h"
#include "daemon/api/request_sampling.h"
#include "daemon/api/request_tools.h"
#include "daemon/api/request_validator.h"
#include "engine/sampling/json_schema.h"
#include "engine/sampling/sampler.h"

namespace edge::daemon::api {
namespace {

namespace json = boost::json;

// Bounds that keep a hostile request cheap before it reaches the engine.
constexpr int64_t kMaxTokensLimit = 1 << 20;

// Fields that clients commonly send with their default (unused) value; anything else is refused.
// `chat`: the completions-only ones (echo, suffix, best_of) are unknown there, as in OpenAI's API
// (null, as any field sent as null, is absent).
// `json_schema`: set by response_format (parse_response_format).
bool parse_unsupported(Validator& v, const std::string& key, const json::value& value, bool chat,
                       std::shared_ptr<const engine::sampling::JsonSchema>* json_schema) {
    auto refuse = [&] { return v.fail("'" + key + "' is not supported", key); };
    if (chat && (key == "echo" || key == "suffix" || key == "best_of")) {
        return value.is_null() || v.fail("unrecognized request argument '" + key + "' (a /v1/completions field)", key);
    }
    if (key == "best_of") {
        // Server-side best-of (generate several, return the likeliest) is not made: only 1.
        std::optional<int64_t> n =
            value.is_null() ? 1 : v.integer(value, key, INT64_MIN, INT64_MAX);
        return n && (*n == 1 || v.fail("'best_of' must be 1 (use 'n' for several choices)", key));
    }
    if (key == "metadata") {
        if (value.is_null()) {
            return true;
        }
        if (!value.is_object()) {
            return v.fail("'" + key + "' must be an object", key);
        }
        return true;
    }
    if (key == "functions") {
        if (value.is_null()) {
            return true;
        }
        if (!value.is_array()) {
            return v.fail("'" + key + "' must be an array", key);
        }
        return value.get_array().empty() || refuse();
    }
    if (key == "function_call") {
        return value.is_null() || (value.is_string() && value.get_string() == "none") ||
               (value.is_string() && value.get_string() == "auto") || refuse();
    }
    if (key == "response_format") {
        return parse_response_format(v, value, json_schema);
    }
    if (key == "parallel_tool_calls" || key == "store") {
        return value.is_null() || v.boolean(value, key).has_value();
    }
    if (key == "user" || key == "service_tier" || key == "reasoning_effort") {
        return value.is_null() || v.string(value, key) != nullptr;
    }
    if (key == "prompt_cache_key" || key == "safety_identifier") {
        // A caching hint (this server's prefix cache needs none) and the successor of `user`.
        return value.is_null() || v.string(value, key) != nullptr;
    }
    if (chat && key == "modalities") {
        // ["text"] is the default and all this server makes.
        const json::array* a = value.if_array();
        return value.is_null() ||
               (a != nullptr && a->size() == 1 && (*a)[0].is_string() &&
                (*a)[0].get_string() == "text") ||
               refuse();
    }
    if (key == "suffix" || key == "modalities" || key == "prediction" || key == "audio") {
        return value.is_null() || refuse();
    }
    if (value.is_null()) {
        // A field sent as null is absent, known or not: clients built from OpenAI's schema send
        // every optional field they have ("verbosity": null, "web_search_options": null).
        return true;
    }
    return v.fail("unrecognized request argument '" + key + "'", key);
}

// The value of the four hex digits at s[i], or -1.
int hex4(std::string_view s, size_t i) {
    if (i + 4 > s.size()) {
        return -1;
    }
    int v = 0;
    const auto [end, err] = std::from_chars(s.data() + i, s.data() + i + 4, v, 16);
    return err == std::errc() && end == s.data() + i + 4 ? v : -1;
}

// The body with every \uD800..\uDFFF escape that is not half of a pair written as \uFFFD,
// or nullopt when it has none. JSON's grammar allows such escapes and Python's
// parser (so OpenAI's and vLLM's servers) reads them; Boost.JSON refuses them, so the body is
// read again with the replacement character, as a decoder does with a broken sequence.
std::optional<std::string> replace_lone_surrogates(std::string_view body) {
    std::string out;
    bool in_string = false;
    bool changed = false;
    size_t copied = 0;
    for (size_t i = 0; i < body.size(); ++i) {
        if (body[i] == '"') {
            in_string = !in_string;
        } else if (in_string && body[i] == '\\' && i + 1 < body.size()) {
            if (body[i + 1] != 'u') {
                ++i;  // A one-character escape (\" and \\ included).
                continue;
            }
            const int unit = hex4(body, i + 2);
            if (unit >= 0xD800 && unit <= 0xDBFF && i + 8 <= body.size() && body[i + 6] == '\\' &&
                body[i + 7] == 'u') {
                const int low = hex4(body, i + 8);
                if (low >= 0xDC00 && low <= 0xDFFF) {
                    i += 11;  // A pair: both escapes stay.
                    continue;
                }
            }
            if (unit >= 0xD800 && unit <= 0xDFFF) {
                out.append(body.substr(copied, i - copied));
                out.append("\\uFFFD");
                copied = i + 6;
                changed = true;
            }
            i += 5;
        }
    }
    if (!changed) {
        return std::nullopt;
    }
    out.append(body.substr(copied));
    return out;
}

}  // namespace

std::string ParsedRequest::prompt_field(int32_t prompt) const {
    if (endpoint == Endpoint::kChatCompletions) {
        return "messages";
    }
    return prompt_list ? "prompt[" + std::to_string(prompt) + "]" : "prompt";
}

std::variant<ParsedRequest, ApiError> parse_openai_request(Endpoint endpoint,
                                                           std::string_view body) {
    std::error_code ec;
    std::string why;
    json::value root = parse_json(body, ec, &why);
    if (ec) {
        // The replacement keeps every byte's place, so the fixed body's error is where the
        // body's own is (not at a lone surrogate the parser would have stopped at first).
        if (const std::optional<std::string> fixed = replace_lone_surrogates(body)) {
            root = parse_json(*fixed, ec, &why);
        }
    }
    if (ec) {
        return invalid_request("the request body is not valid JSON at " + why, std::nullopt);
    }
    if (!root.is_object()) {
        return invalid_request("the request body must be a JSON object", std::nullopt);
    }
    const json::object& obj = root.get_object();
    const bool chat = endpoint == Endpoint::kChatCompletions;
    ParsedRequest out;
    out.endpoint = endpoint;
    engine::GenerateRequest& req = out.generate;
    engine::SamplingParams& s = req.sampling;
    // Unset, a chat reply may run to the end of the context, a completion to OpenAI's 16 tokens;
    // the engine lowers either to what the context leaves after the prompt.
    s.max_tokens = chat ? static_cast<int32_t>(kMaxTokensLimit) : 16;
    req.max_tokens_is_default = true;
    Validator v;
    bool have_prompt = false;
    bool want_logprobs = false;
    std::optional<int64_t> top_logprobs;
    bool tool_choice_given = false;
    bool stream_options_given = false;  // Not null: null is absent, as for every field.
    for (const auto& kv : obj) {
        std::string key(kv.key());
        const json::value& value = kv.value();
        bool ok = true;
        if (key == "model") {
            const json::string* m = v.string(value, key);
            ok = m != nullptr;
            if (ok) {
                req.model = std::string(*m);
            }
        } else if (chat && key == "messages") {
            std::vector<engine::ChatMessage> messages;
            ok = parse_messages(v, value, messages);
            req.prompt = std::move(messages);
            have_prompt = true;
        } else if (!chat && key == "prompt") {
            ok = parse_prompt(v, value, out);
            have_prompt = true;
        } else if (key == "max_tokens" || key == "max_completion_tokens") {
            // max_completion_tokens, OpenAI's newer name, wins over max_tokens in either order.
            if (!value.is_null()) {
                auto n = v.integer(value, key, 1, kMaxTokensLimit);
                ok = n.has_value();
                if (ok && (key == "max_completion_tokens" || out.max_tokens_param.empty())) {
                    s.max_tokens = static_cast<int32_t>(*n);
                    req.max_tokens_is_default = false;
                    req.max_tokens_field = key;
                    out.max_tokens_param = key;
                }
            }
        } else if (key == "temperature") {
            if (!value.is_null()) {
                auto t = v.number(value, key, 0, 2);
                ok = t.has_value();
                s.temperature = static_cast<float>(t.value_or(1));
                out.temperature_set = true;
            }
        } else if (key == "top_p") {
            if (!value.is_null()) {
                auto p = v.number(value, key, 0, 1);
                ok = p.has_value();
                // 0 (as OpenAI takes it) or a positive value below float's range keeps only the
                // most likely token: the smallest positive float's nucleus is that one.
                s.top_p =
                    std::max(static_cast<float>(p.value_or(1)), std::numeric_limits<float>::min());
                out.top_p_set = true;
            }
        } else if (key == "top_k") {
            if (!value.is_null()) {
                // -1 is vLLM's "off", as 0 is here.
                auto k = v.integer(value, key, -1, 1 << 20);
                ok = k.has_value();
                s.top_k = static_cast<int32_t>(std::max<int64_t>(k.value_or(0), 0));
                out.top_k_set = true;
            }
        } else if (key == "seed") {
            if (!value.is_null()) {
                auto seed = v.integer(value, key, std::numeric_limits<int64_t>::min(),
                                      std::numeric_limits<int64_t>::max());
                ok = seed.has_value();
                if (ok) {
                    s.seed = static_cast<uint64_t>(*seed);
                }
            }
        } else if (key == "presence_penalty" || key == "frequency_penalty") {
            if (!value.is_null()) {
                auto p = v.number(value, key, -2, 2);
                ok = p.has_value();
                (key == "presence_penalty" ? s.presence_penalty : s.frequency_penalty) =
                    static_cast<float>(p.value_or(0));
            }
        } else if (!chat && key == "echo") {
            // The prompt comes back before the completion, with its logprobs when asked for.
            if (!value.is_null()) {
                auto b = v.boolean(value, key);
                ok = b.has_value();
                req.echo_prompt = b.value_or(false);
            }
        } else if (key == "repetition_penalty") {
            // vLLM's extensions (repetition_penalty, min_p, min_tokens): see SamplingParams.
            if (!value.is_null()) {
                auto r = v.number(value, key, 0, 2);
                ok = r.has_value() &&
                     (*r > 0 || v.fail("'repetition_penalty' must be greater than 0", key));
                s.repetition_penalty = static_cast<float>(r.value_or(1));
            }
        } else if (key == "min_p") {
            if (!value.is_null()) {
                auto p = v.number(value, key, 0, 1);
                ok = p.has_value();
                s.min_p = static_cast<float>(p.value_or(0));
            }
        } else if (key == "stop_token_ids") {
            if (!value.is_null()) {
                const json::array* ids = value.if_array();
                if (ids == nullptr) {
                    ok = v.fail("'stop_token_ids' must be an array of token ids", key);
                } else if (ids->size() > engine::sampling::kMaxStopTokenIds) {
                    ok = v.fail("'stop_token_ids' may hold at most " +
                                    std::to_string(engine::sampling::kMaxStopTokenIds) + " ids",
                                key);
                }
                for (size_t i = 0; ok && ids != nullptr && i < ids->size(); ++i) {
                    auto id = v.integer((*ids)[i], key + "[" + std::to_string(i) + "]", 0,
                                        std::numeric_limits<int32_t>::max());
                    ok = id.has_value();
                    s.stop_token_ids.push_back(static_cast<engine::TokenId>(id.value_or(0)));
                }
            }
        } else if (key == "min_tokens") {
            if (!value.is_null()) {
                auto n = v.integer(value, key, 0, 1 << 30);
                ok = n.has_value();
                s.min_tokens = static_cast<int32_t>(n.value_or(0));
            }
        } else if (chat && key == "tools") {
            ok = parse_tools(v, value, req.tools);
        } else if (chat && key == "tool_choice") {
            ok = parse_tool_choice(v, value, out, tool_choice_given);
        } else if (chat && key == "parallel_tool_calls") {
            if (!value.is_null()) {
                auto b = v.boolean(value, key);
                ok = b.has_value();
                out.parallel_tool_calls = b.value_or(true);
            }
        } else if (key == "stop") {
            ok = parse_stop(v, value, s.stop);
        } else if (key == "logprobs") {
            if (value.is_null()) {
                continue;
            }
            if (chat) {
                auto b = v.boolean(value, key);
                ok = b.has_value();
                want_logprobs = b.value_or(false);
            } else {
                // Completions: an integer count of alternatives (0..5).
                auto n = v.integer(value, key, 0, 5);
                ok = n.has_value();
                want_logprobs = ok;
                top_logprobs = n;
            }
        } else if (chat && key == "top_logprobs") {
            if (!value.is_null()) {
                top_logprobs = v.integer(value, key, 0, 20);
                ok = top_logprobs.has_value();
            }
        } else if (key == "stream") {
            if (!value.is_null()) {
                auto b = v.boolean(value, key);
                ok = b.has_value();
                out.stream = b.value_or(false);
            }
        } else if (key == "stream_options") {
            stream_options_given = !value.is_null();
            if (value.is_null()) {
                // Unset.
            } else if (!value.is_object()) {
                ok = v.fail("'stream_options' must be an object", key);
            } else {
                for (const auto& opt : value.get_object()) {
                    std::string name = "stream_options." + std::string(opt.key());
                    const bool known = opt.key() == "include_usage" ||
                                       opt.key() == "include_obfuscation" ||
                                       opt.key() == "continuous_usage_stats";
                    if (known && opt.value().is_null()) {
                        // Unset, as at the top level (clients that always send every key).
                    } else if (opt.key() == "include_usage") {
                        auto b = v.boolean(opt.value(), name);
                        ok = ok && b.has_value();
                        out.include_usage = b.value_or(false);
                    } else if (opt.key() == "include_obfuscation") {
                        ok = ok && v.boolean(opt.value(), name).has_value();
                    } else if (opt.key() == "continuous_usage_stats") {
                        auto b = v.boolean(opt.value(), name);
                        ok = ok && b.has_value();
                        out.continuous_usage = b.value_or(false);
                    } else {
                        ok = v.fail("unrecognized field '" + name + "'", name);
                    }
                }
            }
        } else if (key == "n") {
            if (!value.is_null()) {
                std::optional<int64_t> n = v.integer(value, key, 1, kMaxChoices);
                ok = n.has_value();
                out.n = static_cast<int32_t>(n.value_or(1));
            }
        } else if (key == "ignore_eos") {
            auto b = value.is_null() ? false : v.boolean(value, key);
            ok = b.has_value();
            s.ignore_eos = b.value_or(false);
        } else if (key == "return_token_ids") {
            auto b = value.is_null() ? false : v.boolean(value, key);
            ok = b.has_value();
            out.return_token_ids = b.value_or(false);
        } else if (key == "logit_bias") {
            ok = parse_logit_bias(v, value, s.logit_bias);
        } else if (key == "chat_template_kwargs" && chat) {
            // vLLM's and SGLang's switches of the chat template; we render each family in
            // code, so only the thinking switch (Qwen3's and GLM-4.5's enable_thinking,
            // DeepSeek-V3.1's thinking) is known. Null is unset, as for every other field.
            if (value.is_null()) {
                // Unset.
            } else if (!value.is_object()) {
                ok = v.fail("'chat_template_kwargs' must be an object", key);
            } else {
                for (const auto& kw : value.get_object()) {
                    const std::string name = "chat_template_kwargs." + std::string(kw.key());
                    const bool known = kw.key() == "enable_thinking" || kw.key() == "thinking";
                    if (known && kw.value().is_null()) {
                        // Unset, as at the top level.
                    } else if (known) {
                        std::optional<bool> b = v.boolean(kw.value(), name);
                        ok = ok && b.has_value();
                        if (ok && req.thinking && *req.thinking != *b) {
                            // The two names of one switch, set both ways: which was meant?
                            ok = v.fail(
                                "'chat_template_kwargs.enable_thinking' and "
                                "'chat_template_kwargs.thinking' disagree",
                                name);
                        }
                        req.thinking = b;
                    } else {
                        ok = v.fail("'" + name +
                                        "' is not supported (supported: enable_thinking, "
                                        "thinking)",
                                    name);
                    }
                }
            }
        } else {
            ok = parse_unsupported(v, key, value, chat, &s.json.schema);
        }
        if (!ok) {
            return *v.error;
        }
    }
    if (req.model.empty()) {
        return invalid_request("'model' is required", std::string("model"));
    }
    if (!have_prompt) {
        std::string field = chat ? "messages" : "prompt";
        return invalid_request("'" + field + "' is required", field);
    }
    if (out.choices() > kMaxBatchChoices) {
        return invalid_request("'prompt' holds " + std::to_string(out.prompts()) +
                                   " prompts and 'n' is " + std::to_string(out.n) + ": at most " +
                                   std::to_string(kMaxBatchChoices) +
                                   " choices per request (n for each prompt)",
                               std::string("prompt"));
    }
    if (top_logprobs && chat && !want_logprobs && *top_logprobs > 0) {
        return invalid_request("'top_logprobs' requires 'logprobs' to be true",
                               std::string("top_logprobs"));
    }
    // Unset on a completion, max_tokens is OpenAI's 16, not the context's room (which the
    // engine checks min_tokens against, and whose error would then name the room as 16 tokens).
    if (s.min_tokens > s.max_tokens && (!out.max_tokens_param.empty() || !chat)) {
        const bool unset = out.max_tokens_param.empty();
        return invalid_request("'min_tokens' (" + std::to_string(s.min_tokens) +
                                   ") must not exceed '" +
                                   (unset ? std::string("max_tokens") : out.max_tokens_param) +
                                   "' (" + std::to_string(s.max_tokens) +
                                   (unset ? ", its default for /v1/completions" : "") + ")",
                               std::string("min_tokens"));
    }
    // Any stream_options, {} and include_usage false too: OpenAI refuses them all without a
    // stream, and so does the message below.
    if (stream_options_given && !out.stream) {
        return invalid_request("'stream_options' is only allowed when 'stream' is true",
                               std::string("stream_options"));
    }
    if (!tool_choice_given && !req.tools.empty()) {
        out.tool_choice = ToolChoice::kAuto;  // OpenAI's default when tools are present.
    }
    if (req.tools.empty() && out.tool_choice == ToolChoice::kAuto) {
        out.tool_choice = ToolChoice::kNone;  // Nothing to choose from; as OpenAI, not an error.
    }
    if (out.tool_choice != ToolChoice::kNone && req.tools.empty()) {
        return invalid_request("'tool_choice' requires 'tools'", std::string("tool_choice"));
    }
    if (out.tool_choice == ToolChoice::kFunction) {
        const bool declared = std::any_of(req.tools.begin(), req.tools.end(), [&](const auto& t) {
            return t.name == out.tool_choice_function;
        });
        if (!declared) {
            return invalid_request("'tool_choice' names function '" + out.tool_choice_function +
                                       "', which is not in 'tools'",
                                   std::string("tool_choice.function.name"));
        }
    }
    if (out.tool_choice == ToolChoice::kNone) {
        req.tools.clear();  // Not offered: the prompt carries no tools and nothing is parsed.
    }
    s.logprobs = want_logprobs;
    s.top_logprobs = static_cast<int32_t>(top_logprobs.value_or(0));
    return out;
}

}  // namespace edge::daemon::api
