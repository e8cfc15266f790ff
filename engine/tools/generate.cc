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

namespace edge::engine {

namespace {

struct Args {
    std::string model_dir;
    std::optional<std::string> prompt;
    std::optional<std::vector<TokenId>> prompt_ids;
    int32_t max_tokens = 64;
    float temperature = 0.0f;
    std::optional<uint64_t> seed;
    int32_t threads = 0;
    bool ids = false;
    bool chat = false;
};

const char kUsage[] =
    "usage: edgeserve generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3)\n"
    "                          [--max-tokens N] [--temperature T] [--seed N] [--threads N]\n"
    "                          [--ids] [--chat]\n";

template <typename T>
bool parse_number(std::string_view s, T* out) {
    const char* end = s.data() + s.size();
    auto [ptr, ec] = std::from_chars(s.data(), end, *out);
    return ec == std::errc() && ptr == end;
}

bool parse_float(const std::string& s, float* out) {
    char* end = nullptr;
    *out = std::strtof(s.c_str(), &end);
    return !s.empty() && end == s.c_str() + s.size();
}

bool parse_ids(std::string_view s, std::vector<TokenId>* out) {
    while (!s.empty()) {
        const size_t comma = s.find(',');
        TokenId id = 0;
        if (!parse_number(s.substr(0, comma), &id)) {
            return false;
        }
        out->push_back(id);
        s = comma == std::string_view::npos ? std::string_view() : s.substr(comma + 1);
    }
    return !out->empty();
}

// Parses argv[first..]; returns an error message or "" on success.
std::string parse_args(int argc, char** argv, int first, Args* a) {
    for (int i = first; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (flag == "--ids") {
            a->ids = true;
            continue;
        }
        if (flag == "--chat") {
            a->chat = true;
            continue;
        }
        if (i + 1 >= argc) {
            return std::string(flag) + " needs a value";
        }
        const std::string value = argv[++i];
        bool ok = true;
        if (flag == "--model") {
            a->model_dir = value;
        } else if (flag == "--prompt") {
            a->prompt = value;
        } else if (flag == "--prompt-ids") {
            a->prompt_ids.emplace();
            ok = parse_ids(value, &*a->prompt_ids);
        } else if (flag == "--max-tokens") {
            ok = parse_number(value, &a->max_tokens);
        } else if (flag == "--temperature") {
            ok = parse_float(value, &a->temperature);
        } else if (flag == "--seed") {
            uint64_t seed = 0;
            ok = parse_number(value, &seed);
            a->seed = seed;
        } else if (flag == "--threads") {
            ok = parse_number(value, &a->threads);
        } else {
            return "unknown flag " + std::string(flag);
        }
        if (!ok) {
            return "bad value for " + std::string(flag) + ": " + value;
        }
    }
    if (a->model_dir.empty()) {
        return "--model is required";
    }
    if (a->prompt.has_value() == a->prompt_ids.has_value()) {
        return "give exactly one of --prompt and --prompt-ids";
    }
    if (a->chat && !a->prompt) {
        return "--chat needs --prompt";
    }
    return "";
}

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
    Args args;
    const std::string error = parse_args(argc, argv, first, &args);
    if (!error.empty()) {
        std::fprintf(stderr, "edgeserve generate: %s\n%s", error.c_str(), kUsage);
        return 2;
    }
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
