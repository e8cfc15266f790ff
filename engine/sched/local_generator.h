#pragma once

// LocalGenerator is the engine's Generator: the models of this process, each with its tokenizer,
// chat template and a Scheduler thread. submit() validates and tokenizes the request on the
// caller's thread (unknown model -> kNotFound; bad prompt, token ids out of range, prompt +
// max_tokens beyond the context, bad sampling values -> kInvalidArgument naming the field) and
// queues it on the model's scheduler (the tenant's queue full -> kResourceExhausted, the model's
// queue full -> kUnavailable).
//
// Threading: all methods are thread-safe. Destruction cancels what is queued or running and joins
// the scheduler threads. create_engine() (engine/engine.h) builds one from loaded checkpoints;
// tests build one from fake models.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/model/causal_lm.h"
#include "engine/sched/scheduler.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_config.h"

namespace edge::engine::sched {

// One loaded model with what serving it needs.
struct ServedModel {
    ModelConfig config;                               // Name, path, chat template choice.
    std::unique_ptr<CausalLM> model;                  // The loaded checkpoint.
    std::unique_ptr<tokenizer::Tokenizer> tokenizer;  // From the checkpoint's tokenizer.json.
    tokenizer::TokenizerConfig tokenizer_config;      // tokenizer_config / generation_config.
    int64_t created_unix = 0;                         // When it was loaded (seconds).
};

class LocalGenerator final : public Generator {
public:
    // Starts one scheduler per model. kInvalidArgument for duplicate names or a chat template
    // name that is not known; a checkpoint without a recognisable chat format still serves
    // text and token prompts (a template that is not recognised logs chat_template_unrecognised
    // and chat requests are refused with how to set models[].chat_template).
    static Result<std::unique_ptr<LocalGenerator>> create(std::vector<ServedModel> models,
                                                          const EngineConfig& config,
                                                          uint64_t seed);
    ~LocalGenerator() override;

    std::vector<ModelInfo> models() const override;
    bool has_model(std::string_view name) const override;
    Result<std::shared_ptr<GenerationHandle>> submit(GenerateRequest request,
                                                     std::shared_ptr<GenerationSink> sink) override;
    Result<std::vector<TokenId>> prompt_token_ids(const GenerateRequest& request) const override;
    bool ready() const override { return true; }
    std::vector<ModelLoad> load() const override;
    std::vector<ServingStats> serving_stats() const override;
    void stop() override;

    // The tokenizer of a served model (nullptr when unknown), for tools and tests.
    const tokenizer::Tokenizer* tokenizer(const std::string& model) const;

private:
    struct Runtime {
        ModelInfo info;
        std::unique_ptr<tokenizer::Tokenizer> tokenizer;
        std::optional<tokenizer::ChatTemplate> chat;
        std::string no_chat;  // Why chat is refused when the checkpoint's template is unknown.
        TokenId bos = -1;
        bool add_bos = false;
        int32_t vocab_size = 0;
        TokenId think_open = -1;   // <think> when info.thinks.
        TokenId think_close = -1;  // </think> when info.thinks.
        int64_t context = 0;
        // Positions the KV cache holds in all (0: unknown). A sequence longer than this could
        // never finish, so requests are held to it like to the context.
        int64_t kv_tokens = 0;
        std::unique_ptr<Scheduler> scheduler;
    };

    LocalGenerator() = default;
    // The served model `model` (kNotFound naming it when it is not served here).
    Result<Runtime*> runtime(const std::string& model) const;
    Result<std::vector<TokenId>> prompt_ids(const Runtime& rt,
                                            const GenerateRequest& request) const;
    uint64_t next_seed();
    // The prompt ends with <think> and whitespace only: the output starts inside the thought.
    static bool opens_thought(const Runtime& rt, std::span<const TokenId> ids);

    std::map<std::string, std::unique_ptr<Runtime>> models_;
    std::mutex seed_mu_;
    std::mt19937_64 seed_rng_;
    std::once_flag stopped_;
};

}  // namespace edge::engine::sched
