#include "engine/sched/local_generator.h"

#include <algorithm>
#include <cstdio>

#include "common/log.h"
#include "engine/sampling/sampler.h"
#include "engine/sched/prompt_budget.h"

namespace edge::engine::sched {

namespace {

// What errors about the request's prompt call it (GenerateRequest::prompt_field).
std::string prompt_field(const GenerateRequest& request) {
    if (!request.prompt_field.empty()) {
        return request.prompt_field;
    }
    return std::holds_alternative<std::vector<ChatMessage>>(request.prompt) ? "messages" : "prompt";
}

std::vector<TokenId> eos_ids(const ServedModel& m) {
    std::vector<TokenId> ids = m.model->spec().eos_token_ids;
    const int64_t vocab = m.model->spec().vocab_size;
    for (TokenId id : m.tokenizer_config.generation_eos_ids) {
        if (id < 0 || id >= vocab) {
            // Never sampled: it could not end a reply. Said, as a checkpoint mix-up would be.
            log::warn("eos_ignored", {{"model", m.config.name},
                                      {"eos_token_id", static_cast<int64_t>(id)},
                                      {"vocab_size", vocab},
                                      {"detail", "generation_config.json names an id outside "
                                                 "the vocabulary"}});
            continue;
        }
        ids.push_back(id);
    }
    if (!m.tokenizer_config.eos_token.empty()) {
        const TokenId id = m.tokenizer->token_id(m.tokenizer_config.eos_token);
        if (id < 0) {
            log::warn("eos_ignored", {{"model", m.config.name},
                                      {"eos_token", m.tokenizer_config.eos_token},
                                      {"detail", "tokenizer_config.json names a token the "
                                                 "tokenizer does not have"}});
        }
        ids.push_back(id);
    }
    std::erase(ids, -1);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
}

}  // namespace

Result<std::unique_ptr<LocalGenerator>> LocalGenerator::create(std::vector<ServedModel> models,
                                                               const EngineConfig& config,
                                                               uint64_t seed) {
    std::unique_ptr<LocalGenerator> gen(new LocalGenerator());
    gen->seed_rng_.seed(seed);
    for (ServedModel& m : models) {
        const std::string where = "models[\"" + m.config.name + "\"]";
        if (gen->models_.count(m.config.name) > 0) {
            return invalid_argument_error(where + ": name served twice");
        }
        if (m.model == nullptr || m.tokenizer == nullptr) {
            return invalid_argument_error(where + ": no model or tokenizer");
        }
        auto rt = std::make_unique<Runtime>();
        const ModelSpec& spec = m.model->spec();
        rt->context = spec.max_context;
        if (m.config.max_context > 0) {
            rt->context = std::min<int64_t>(rt->context, m.config.max_context);
        }
        rt->info =
            ModelInfo{m.config.name, spec.version, spec.architecture, rt->context, m.created_unix};
        rt->vocab_size = spec.vocab_size;
        rt->info.max_request_sequences =
            config.max_queue_per_tenant > 0
                ? std::min(config.max_queue, config.max_queue_per_tenant)
                : config.max_queue;
        rt->info.sampling_defaults = m.tokenizer_config.sampling;
        if (const SamplingDefaults& d = rt->info.sampling_defaults;
            d.temperature || d.top_p || d.top_k) {
            // As vLLM says it: the checkpoint, not OpenAI's defaults, decides unset fields.
            // As the file writes them (0.6, not the float's 0.6000000238).
            auto shown = [](std::optional<float> v, float unset) {
                char text[32];
                std::snprintf(text, sizeof(text), "%g", static_cast<double>(v.value_or(unset)));
                return std::string(text);
            };
            log::info("sampling_defaults",
                      {{"model", m.config.name},
                       {"temperature", shown(d.temperature, 1.0f)},
                       {"top_p", shown(d.top_p, 1.0f)},
                       {"top_k", static_cast<int64_t>(d.top_k.value_or(0))},
                       {"detail", "generation_config.json's values apply to requests that "
                                  "leave these fields unset"}});
        }
        const KvCacheStats kv = m.model->kv_stats();
        rt->kv_tokens = int64_t{kv.blocks_total} * kv.block_tokens;
        log::info("model_ready", {{"model", m.config.name},
                                  {"architecture", spec.architecture},
                                  {"context", rt->context},
                                  {"kv_cache_tokens", rt->kv_tokens}});
        if (rt->kv_tokens > 0 && rt->kv_tokens < rt->context) {
            log::warn("kv_cache_below_context",
                      {{"model", m.config.name},
                       {"context", rt->context},
                       {"kv_cache_tokens", rt->kv_tokens},
                       {"detail", "requests longer than the KV cache are refused; raise "
                                  "engine.kv_cache_bytes or lower models[].max_context"}});
        }
        rt->add_bos = m.tokenizer_config.add_bos_token;
        rt->bos = spec.bos_token_id >= 0 ? spec.bos_token_id : m.tokenizer_config.generation_bos_id;
        if (!m.tokenizer_config.bos_token.empty()) {
            const TokenId named = m.tokenizer->token_id(m.tokenizer_config.bos_token);
            if (named < 0) {
                log::warn("bos_token_unknown",
                          {{"model", m.config.name},
                           {"bos_token", m.tokenizer_config.bos_token},
                           {"using", static_cast<int64_t>(rt->bos)},
                           {"detail", "tokenizer_config.json names a token the tokenizer does "
                                      "not have; the id from config.json or "
                                      "generation_config.json stays"}});
            }
            rt->bos = named >= 0 ? named : rt->bos;
        }
        if (rt->add_bos && rt->bos >= spec.vocab_size) {
            // Every prompt would begin with it: refused here rather than on each request.
            return invalid_argument_error(where + ": the BOS token id " +
                                          std::to_string(rt->bos) +
                                          " (config.json, generation_config.json or "
                                          "tokenizer_config.json) is outside the vocabulary of " +
                                          std::to_string(spec.vocab_size) +
                                          ", and add_bos_token is true");
        }
        auto format =
            tokenizer::choose_chat_format(m.config.chat_template, m.tokenizer_config, *m.tokenizer);
        if (format.ok()) {
            auto chat = tokenizer::ChatTemplate::create(*format, m.tokenizer.get(),
                                                        m.tokenizer_config.chat_template);
            if (!chat.ok()) {
                return chat.status().with_context(where);
            }
            rt->chat = std::move(chat).value();
            rt->info.tool_call_format = std::string(tokenizer::tool_call_format_of(*format));
            rt->think_open = m.tokenizer->token_id("<think>");
            rt->think_close = m.tokenizer->token_id("</think>");
            rt->info.thinks = rt->chat->thinks();
        } else if (format.status().code() != StatusCode::kNotFound) {
            return format.status().with_context(where);
        } else if (!m.tokenizer_config.chat_template.empty()) {
            // The checkpoint ships a chat template in a format we do not render: the model
            // still serves completions, and chat requests say how to pick a format.
            log::warn("chat_template_unrecognised", {{"model", m.config.name},
                                                     {"path", m.config.path},
                                                     {"known", tokenizer::kChatFormatNames}});
            rt->no_chat = "messages: the chat template of model \"" + m.config.name +
                          "\" (" + m.tokenizer_config.chat_template_file +
                          ") is not recognised; set the model's "
                          "models[].chat_template to one of " +
                          std::string(tokenizer::kChatFormatNames) +
                          " to chat with it, or use /v1/completions";
        }
        SchedulerConfig sc;
        sc.max_batch_sequences = config.max_batch_sequences;
        sc.max_batch_tokens = config.max_batch_tokens;
        sc.max_decode_sequences = config.max_decode_sequences;
        sc.max_queue = config.max_queue;
        sc.max_queue_per_tenant = config.max_queue_per_tenant;
        sc.prefix_cache = config.prefix_cache;
        sc.swap_bytes = config.kv_swap_bytes;
        sc.max_queue_wait = std::chrono::milliseconds(config.max_queue_wait_ms);
        sc.model_name = m.config.name;
        sc.eos_token_ids = eos_ids(m);
        rt->tokenizer = std::move(m.tokenizer);
        rt->scheduler = std::make_unique<Scheduler>(std::move(m.model), rt->tokenizer.get(), sc);
        gen->models_.emplace(m.config.name, std::move(rt));
    }
    for (auto& [name, rt] : gen->models_) {
        rt->scheduler->start();
    }
    return gen;
}

LocalGenerator::~LocalGenerator() { stop(); }

void LocalGenerator::stop() {
    // Once: the daemon's two listeners may reach their drain deadline together.
    std::call_once(stopped_, [this] {
        for (auto& [name, rt] : models_) {
            rt->scheduler->stop();
        }
    });
}

std::vector<ModelInfo> LocalGenerator::models() const {
    std::vector<ModelInfo> out;
    for (const auto& [name, rt] : models_) {
        out.push_back(rt->info);
    }
    return out;
}

bool LocalGenerator::has_model(std::string_view name) const {
    return models_.find(std::string(name)) != models_.end();
}

std::vector<ModelLoad> LocalGenerator::load() const {
    std::vector<ModelLoad> out;
    for (const auto& [name, rt] : models_) {
        ModelLoad load = rt->scheduler->load();
        load.name = name;
        out.push_back(std::move(load));
    }
    return out;
}

std::vector<ServingStats> LocalGenerator::serving_stats() const {
    std::vector<ServingStats> out;
    for (const auto& [name, rt] : models_) {
        out.push_back(rt->scheduler->serving_stats());
    }
    return out;
}

const tokenizer::Tokenizer* LocalGenerator::tokenizer(const std::string& model) const {
    auto it = models_.find(model);
    return it == models_.end() ? nullptr : it->second->tokenizer.get();
}

bool LocalGenerator::opens_thought(const Runtime& rt, std::span<const TokenId> ids) {
    for (size_t i = ids.size(); i > 0; --i) {
        if (ids[i - 1] == rt.think_open) {
            return true;
        }
        const std::string_view bytes = rt.tokenizer->token_bytes(ids[i - 1]);
        if (bytes.empty() || bytes.find_first_not_of(" \t\r\n") != std::string_view::npos) {
            return false;
        }
    }
    return false;
}

uint64_t LocalGenerator::next_seed() {
    std::lock_guard<std::mutex> lock(seed_mu_);
    return seed_rng_();
}

Result<std::vector<TokenId>> LocalGenerator::prompt_ids(const Runtime& rt,
                                                        const GenerateRequest& request) const {
    const std::string field = prompt_field(request);
    std::vector<TokenId> ids;
    if (const auto* text = std::get_if<std::string>(&request.prompt)) {
        if (rt.add_bos && rt.bos >= 0) {
            ids.push_back(rt.bos);
        }
        auto encoded = rt.tokenizer->encode(*text);
        if (!encoded.ok()) {
            return encoded.status().with_context(field);
        }
        if (encoded->empty()) {
            return invalid_argument_error(field + ": empty");
        }
        ids.insert(ids.end(), encoded->begin(), encoded->end());
    } else if (const auto* given = std::get_if<std::vector<TokenId>>(&request.prompt)) {
        for (size_t i = 0; i < given->size(); ++i) {
            if ((*given)[i] < 0 || (*given)[i] >= rt.vocab_size) {
                return invalid_argument_error(
                    field + "[" + std::to_string(i) + "]: token id " + std::to_string((*given)[i]) +
                    " is out of range [0, " + std::to_string(rt.vocab_size) + ")");
            }
        }
        ids = *given;
    } else {
        const auto& messages = std::get<std::vector<ChatMessage>>(request.prompt);
        if (!rt.chat) {
            return invalid_argument_error(!rt.no_chat.empty()
                                              ? rt.no_chat
                                              : "messages: model \"" + rt.info.name +
                                                    "\" has no chat template");
        }
        // A forced reply (a tool call) is the answer itself: the turn opens without a thought,
        // as each family's template renders thinking off (DeepSeek-V3.1's <think> would
        // otherwise sit right before the call).
        const std::optional<bool> thinking =
            request.assistant_prefix.empty() ? request.thinking : std::optional<bool>(false);
        EDGE_ASSIGN_OR_RETURN(ids,
                              rt.chat->render(messages, request.tools, {.thinking = thinking}));
        if (!request.assistant_prefix.empty()) {
            EDGE_ASSIGN_OR_RETURN(std::vector<TokenId> forced,
                                  rt.chat->render_assistant_prefix(request.assistant_prefix));
            ids.insert(ids.end(), forced.begin(), forced.end());
        }
    }
    if (ids.empty()) {
        return invalid_argument_error(field + ": empty");
    }
    for (TokenId id : ids) {
        if (id >= rt.vocab_size) {
            return invalid_argument_error(field + ": token id " + std::to_string(id) +
                                          " from the tokenizer is beyond the model's vocabulary");
        }
    }
    return ids;
}

Result<LocalGenerator::Runtime*> LocalGenerator::runtime(const std::string& model) const {
    auto it = models_.find(model);
    if (it == models_.end()) {
        return not_found_error("model: \"" + model + "\" is not served here");
    }
    return it->second.get();
}

Result<std::vector<TokenId>> LocalGenerator::prompt_token_ids(
    const GenerateRequest& request) const {
    EDGE_ASSIGN_OR_RETURN(const Runtime* rt, runtime(request.model));
    return prompt_ids(*rt, request);
}

Result<std::shared_ptr<GenerationHandle>> LocalGenerator::submit(
    GenerateRequest request, std::shared_ptr<GenerationSink> sink) {
    EDGE_ASSIGN_OR_RETURN(Runtime * found, runtime(request.model));
    Runtime& rt = *found;
    if (sink == nullptr) {
        return invalid_argument_error("sink: null");
    }
    EDGE_RETURN_IF_ERROR(sampling::validate_sampling_params(request.sampling));
    auto check_id = [&](const char* field, TokenId id) {
        return id < rt.vocab_size
                   ? ok_status()
                   : invalid_argument_error(std::string(field) + ": token id " +
                                            std::to_string(id) + " is out of range [0, " +
                                            std::to_string(rt.vocab_size) + ")");
    };
    for (const auto& [id, bias] : request.sampling.logit_bias) {
        EDGE_RETURN_IF_ERROR(check_id("logit_bias", id));
    }
    for (TokenId id : request.sampling.stop_token_ids) {
        EDGE_RETURN_IF_ERROR(check_id("stop_token_ids", id));
    }
    EDGE_ASSIGN_OR_RETURN(std::vector<TokenId> ids, prompt_ids(rt, request));
    // OpenAI's context_length_exceeded: kOutOfRange, naming the prompt's field.
    const int64_t prompt_len = static_cast<int64_t>(ids.size());
    sink->on_prompt_tokens(prompt_len);
    // The tightest of the model's context, the tenant's cap and what the KV cache can hold.
    int64_t limit = rt.context;
    std::string within = "the model's context of " + std::to_string(limit);
    if (request.max_context_tokens > 0 && request.max_context_tokens < limit) {
        limit = request.max_context_tokens;
        within = "the tenant's limit of " + std::to_string(limit);
    }
    if (rt.kv_tokens > 0 && rt.kv_tokens < limit) {
        limit = rt.kv_tokens;
        within = "this site's KV cache capacity of " + std::to_string(limit);
    }
    const std::string field = prompt_field(request);
    if (request.max_prompt_tokens > 0 && prompt_len > request.max_prompt_tokens) {
        return prompt_over_input_budget(field, prompt_len, request.max_prompt_tokens);
    }
    if (prompt_len >= limit) {
        return out_of_range_error(field + ": the prompt (" + std::to_string(prompt_len) +
                                  " tokens) leaves no room for output within " + within +
                                  " tokens");
    }
    int32_t& max_tokens = request.sampling.max_tokens;
    if (request.max_tokens_is_default) {
        max_tokens = static_cast<int32_t>(std::min<int64_t>(max_tokens, limit - prompt_len));
    } else if (prompt_len + max_tokens > limit) {
        return out_of_range_error(field + ": the prompt (" + std::to_string(prompt_len) +
                                  " tokens) plus " + request.max_tokens_field + " (" +
                                  std::to_string(max_tokens) + ") exceeds " + within + " tokens");
    }
    if (request.sampling.min_tokens > max_tokens) {
        // Only an unset max_tokens gets here (a set one was checked against min_tokens): the
        // room the context leaves is less than the minimum asked for (vLLM refuses it too).
        return invalid_argument_error("min_tokens: " + std::to_string(request.sampling.min_tokens) +
                                      " is more than the " + std::to_string(max_tokens) +
                                      " tokens the prompt (" + std::to_string(prompt_len) +
                                      " tokens) leaves for output within " + within + " tokens");
    }
    SequenceRequest seq;
    seq.request_id = std::move(request.request_id);
    seq.prompt = std::move(ids);
    seq.seed = request.sampling.seed ? *request.sampling.seed : next_seed();
    seq.sampling = std::move(request.sampling);
    seq.sink = std::move(sink);
    seq.tenant = std::move(request.tenant);
    seq.cache_scope = std::move(request.cache_scope);
    seq.tenant_weight = request.tenant_weight;
    seq.priority = request.priority;
    seq.echo_prompt = request.echo_prompt;
    if (!request.tools.empty() && rt.chat) {
        seq.kept_special = rt.chat->tool_call_marker_ids();
    }
    if (rt.info.thinks && std::holds_alternative<std::vector<ChatMessage>>(request.prompt)) {
        // The reasoning parser reads the markers in the text, special tokens or not.
        seq.kept_special.push_back(rt.think_open);
        seq.kept_special.push_back(rt.think_close);
        if (opens_thought(rt, seq.prompt)) {
            if (seq.sampling.json.schema) {
                // The thought is not JSON, and a JSON answer cannot think first.
                return invalid_argument_error(
                    "response_format: a JSON reply (json_object, json_schema) cannot follow a "
                    "prompt that opens the model's thought; set "
                    "chat_template_kwargs.enable_thinking to false");
            }
            seq.sink->on_thought_opened();
        }
    }
    return rt.scheduler->submit(std::move(seq));
}

}  // namespace edge::engine::sched
