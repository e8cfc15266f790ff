#include "engine/tools/generate.h"

#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "engine/tools/cli.h"
#include "engine/tools/generate_args.h"

namespace edge::engine {

namespace {

// Prints text as it arrives; collects ids for --ids; signals the end.
class PrintingSink final : public GenerationSink {
public:
    explicit PrintingSink(bool print_text) : print_text_(print_text) {}

    void on_delta(TokenDelta delta) override {
        if (print_text_ && !delta.text.empty()) {
            std::fwrite(delta.text.data(), 1, delta.text.size(), stdout);
            std::fflush(stdout);
        }
        std::lock_guard<std::mutex> lock(mu_);
        ids_.insert(ids_.end(), delta.token_ids.begin(), delta.token_ids.end());
    }
    void on_finish(Finish finish) override {
        std::lock_guard<std::mutex> lock(mu_);
        finish_ = std::move(finish);
        cv_.notify_all();
    }
    Finish wait() {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return finish_.has_value(); });
        return *finish_;
    }
    std::vector<TokenId> ids() {
        std::lock_guard<std::mutex> lock(mu_);
        return ids_;
    }

private:
    bool print_text_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<TokenId> ids_;
    std::optional<Finish> finish_;
};

}  // namespace

int generate_main(int argc, char** argv) {
    // argv[0] is the program, argv[1] may be the "generate" subcommand itself.
    const int first = argc > 1 && std::string_view(argv[1]) == "generate" ? 2 : 1;
    if (wants_help(argc, argv, first)) {
        std::fputs(kGenerateUsage, stdout);
        return 0;
    }
    auto parsed = parse_generate_args(argc, argv, first);
    if (!parsed.ok()) {
        return usage_error("generate", parsed.status().message(), kGenerateUsage);
    }
    const GenerateArgs& args = *parsed;
    EngineConfig config;
    config.threads = args.threads;
    config.max_batch_sequences = 1;
    ModelConfig model;
    model.name = "cli";
    model.path = args.model_dir;
    config.models.push_back(model);
    auto engine = create_engine(config);
    if (!engine.ok()) {
        std::fprintf(stderr, "edgeserve generate: %s\n", engine.status().to_string().c_str());
        return 1;
    }
    GenerateRequest request;
    request.request_id = "cli";
    request.model = model.name;
    if (args.prompt_ids) {
        request.prompt = *args.prompt_ids;
    } else if (args.chat) {
        request.prompt = std::vector<ChatMessage>{ChatMessage{"user", *args.prompt, ""}};
    } else {
        request.prompt = *args.prompt;
    }
    request.sampling.max_tokens = args.max_tokens;
    request.sampling.temperature = args.temperature;
    request.sampling.seed = args.seed;
    auto sink = std::make_shared<PrintingSink>(!args.ids);
    auto handle = (*engine)->submit(std::move(request), sink);
    if (!handle.ok()) {
        std::fprintf(stderr, "edgeserve generate: %s\n", handle.status().to_string().c_str());
        return 1;
    }
    const Finish finish = sink->wait();
    if (args.ids) {
        std::string line;
        for (TokenId id : sink->ids()) {
            line += (line.empty() ? "" : ",") + std::to_string(id);
        }
        std::printf("%s\n", line.c_str());
    } else {
        std::printf("\n");
    }
    if (finish.reason == FinishReason::kError) {
        std::fprintf(stderr, "edgeserve generate: %s\n", finish.error.to_string().c_str());
        return 1;
    }
    return 0;
}

}  // namespace edge::engine
