#include "daemon/api/completion.h"

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "daemon/api/choice_sink.h"
#include "daemon/api/completion_response.h"
#include "daemon/api/tool_call_output.h"
#include "daemon/cluster/route_planner.h"
#include "engine/sched/prompt_budget.h"
#include "engine/tokenizer/utf8.h"

namespace edge::daemon::api {

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

// Why a list of prompts is refused before any of it is queued, and the prompt tokens it is
// charged: those tokenized to find out, as the engine charges a prompt it refuses for its length
// (else a tenant could have its prompts tokenized without end, a list at a time).
struct ListRefusal {
    Status status;
    ApiError error;
    int64_t prompt_tokens = 0;
};

// A list of prompts whose first `last + 1` hold `tokens` tokens, more than the tenant's
// input_tokens_per_minute (`budget`): each prompt may fit it (the engine checks that), but
// together they could never be admitted either.
ListRefusal batch_over_budget(int64_t tokens, int32_t last, int64_t budget) {
    const std::string message =
        "the prompts (" + std::to_string(tokens) + " tokens in prompt[0.." + std::to_string(last) +
        "]) exceed this tenant's input_tokens_per_minute of " + std::to_string(budget);
    return {invalid_argument_error("prompt: " + message),
            invalid_request(message, std::string("prompt")), tokens};
}

using Prompt = decltype(engine::GenerateRequest::prompt);

// A list of prompts whose lengths are known before any is queued, too long together for the
// tenant's input_tokens_per_minute (each may fit it: the engine checks that), could never be
// admitted: it is refused before any of its prompts is queued, and nothing is charged but the
// request and the tokens measured. Token-id prompts are as long as the engine will count them;
// text prompts are tokenized by the generator as submit() would, and replaced by those ids so
// that submit() does not tokenize them again (they run as the text would: the ids hold the BOS
// the engine adds, and request.prompt_field names them as before). Returns the refusal: a
// prompt alone over the budget (named as the engine names it), the list's length, or what the
// generator said of a prompt it could not tokenize. Nothing where the list fits, or where the
// generator tokenizes only in submit(): text is then counted as it is queued.
std::optional<ListRefusal> measure_prompts(const engine::Generator& generator,
                                           ParsedRequest& request,
                                           std::vector<Prompt>& more_prompts) {
    const int64_t budget = request.generate.max_prompt_tokens;
    int64_t known = 0;
    for (int32_t p = 0; p <= static_cast<int32_t>(more_prompts.size()); ++p) {
        Prompt& prompt =
            p == 0 ? request.generate.prompt : more_prompts[static_cast<size_t>(p - 1)];
        if (std::holds_alternative<std::string>(prompt)) {
            // Tokenized as the request that will carry it: request.generate holds it meanwhile.
            if (p > 0) {
                std::swap(request.generate.prompt, prompt);
            }
            request.generate.prompt_field = request.prompt_field(p);
            Result<std::vector<engine::TokenId>> ids = generator.prompt_token_ids(request.generate);
            if (p > 0) {
                std::swap(request.generate.prompt, prompt);
            }
            if (!ids.ok() && ids.status().code() == StatusCode::kUnimplemented) {
                return std::nullopt;
            }
            if (!ids.ok()) {
                return ListRefusal{ids.status(),
                                   api_error_from_status(ids.status(), request.generate.model),
                                   known};
            }
            prompt = std::move(ids).value();
        }
        const auto* ids = std::get_if<std::vector<engine::TokenId>>(&prompt);
        if (ids == nullptr) {
            return std::nullopt;  // Chat messages: never a list.
        }
        const auto length = static_cast<int64_t>(ids->size());
        known += length;
        if (length > budget) {
            Status alone = engine::prompt_over_input_budget(request.prompt_field(p), length, budget);
            ApiError error = api_error_from_status(alone, request.generate.model);
            return ListRefusal{std::move(alone), std::move(error), known};
        }
        if (known > budget) {
            return batch_over_budget(known, p, budget);
        }
    }
    return std::nullopt;
}

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
                    std::function<void(int64_t prompt_tokens)> on_accepted,
                    RefusalTaker take_refusal) {
    std::string model = request.generate.model;
    const bool report_usage = request.report_usage;
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
        tls::HttpResponse response = error.to_response();
        const bool own_refusal =
            error.status >= 400 && error.status < 500 && error.status != 429;
        if (report_usage && prompt_tokens > 0 && own_refusal) {
            // For the forwarding site, which charges the tenant the prompt read to refuse it,
            // as this site charges its own tenants. The prompt's length alone (no count of
            // generated tokens, which marks an answer after acceptance): it never ran. Only on
            // a refusal of the request itself (a 4xx but 429), which a forwarding site of an
            // earlier version already took for the answer, and counted: it reads any usage
            // count as an answer after acceptance, so on a 429 or a 5xx the count turned a
            // refusal it could retry or refund into an accepted, charged request.
            response.headers.push_back(
                {std::string(cluster::kPromptTokensHeader), std::to_string(prompt_tokens)});
        }
        channel->respond(std::move(response));
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
        if (m.name != model) {
            continue;
        }
        thinks = m.thinks;
        apply_sampling_defaults(m.sampling_defaults, request);
        if (const int32_t most = m.max_request_sequences;
            most > 0 && request.choices() > most) {
            // Each choice waits as a request of its own: more than the queue holds would be
            // refused as a full queue (429, retry later) every time.
            const std::string field = request.prompts() > 1 ? "prompt" : "n";
            const std::string asked =
                request.prompts() > 1 ? std::to_string(request.prompts()) + " prompts with 'n' " +
                                            std::to_string(request.n) + " (" +
                                            std::to_string(request.choices()) + " choices)"
                                      : "'n' of " + std::to_string(request.n);
            const ApiError error = invalid_request(
                asked + " exceeds the " + std::to_string(most) + " requests model \"" + model +
                    "\" queues at once on this site (each choice waits as one); ask for at most " +
                    std::to_string(most),
                field);
            refuse(invalid_argument_error(error.message), error);
            return;
        }
    }
    auto response = std::make_shared<Response>(request, channel, created_unix, on_done);
    const int32_t n = request.n;
    const int32_t choices = request.choices();
    const bool batch = request.prompts() > 1;
    const int64_t max_prompt_tokens = request.generate.max_prompt_tokens;
    std::vector<Prompt> more_prompts = std::move(request.more_prompts);
    // An echo returns a text prompt as the client sent it, not as its tokens read (a BOS the
    // tokenizer adds, text it normalises): kept before measure_prompts() turns text into ids.
    std::vector<std::optional<std::string>> echo_texts;
    if (request.generate.echo_prompt) {
        for (size_t p = 0; p <= more_prompts.size(); ++p) {
            const Prompt& prompt = p == 0 ? request.generate.prompt : more_prompts[p - 1];
            const auto* text = std::get_if<std::string>(&prompt);
            echo_texts.push_back(text ? std::optional<std::string>(*text) : std::nullopt);
        }
    }
    if (batch && max_prompt_tokens > 0) {
        if (auto refusal = measure_prompts(generator, request, more_prompts)) {
            refuse(refusal->status, refusal->error, refusal->prompt_tokens);
            return;
        }
    }
    int64_t prompt_tokens = 0;   // Of the prompts submitted so far, each counted once...
    int64_t earlier_tokens = 0;  // ...and of those before the current one.
    std::vector<int64_t> choice_prompt_tokens;  // As each choice's sink heard it.
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
        // The engine's errors about the prompt name it as the client's request does.
        generate.prompt_field = request.prompt_field(prompt);
        if (generate.sampling.seed) {
            // Choices of a seeded prompt differ from each other, and each is reproducible (the
            // same as that prompt alone with n 1 and this seed).
            *generate.sampling.seed += static_cast<uint64_t>(i);
        }
        auto sink = std::make_shared<ChoiceSink>(
            response, c, std::move(tools[static_cast<size_t>(c)]), thinks,
            echo_texts.empty() ? std::nullopt : echo_texts[static_cast<size_t>(prompt)]);
        Result<std::shared_ptr<engine::GenerationHandle>> handle =
            generator.submit(std::move(generate), sink);
        if (!handle.ok()) {
            if (take_refusal) {
                response->refuse();
                response->cancel_all();
                if (take_refusal(handle.status())) {
                    return;
                }
            }
            const ApiError error = api_error_from_status(handle.status(), model);
            refuse_running(handle.status(), error, earlier_tokens + sink->prompt_tokens());
            return;
        }
        response->add_handle(*handle);
        choice_prompt_tokens.push_back(sink->prompt_tokens());
        if (i != 0) {
            continue;
        }
        prompt_tokens += (*handle)->prompt_tokens();
        if (batch && max_prompt_tokens > 0 && prompt_tokens > max_prompt_tokens) {
            // Text prompts of a generator that tokenizes only in submit(): their lengths are
            // known once the engine tokenized them.
            const ListRefusal refusal = batch_over_budget(prompt_tokens, prompt, max_prompt_tokens);
            refuse_running(refusal.status, refusal.error, refusal.prompt_tokens);
            return;
        }
    }
    // The head goes out before any token, so clients see the stream open at once.
    response->accept(prompt_tokens, std::move(choice_prompt_tokens));
    if (on_accepted) {
        on_accepted(prompt_tokens);
    }
    channel->on_client_gone([response] { response->cancel_all(); });
}

}  // namespace edge::daemon::api
