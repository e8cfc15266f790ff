#include "engine/tools/generate_args.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "common/cli_flags.h"
#include "engine/cpu/thread_pool.h"
#include "engine/sampling/sampler.h"

namespace edge::engine {

const char kGenerateUsage[] =
    "usage: edgeserve generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3)\n"
    "                          [--max-tokens N] [--temperature T] [--seed N] [--threads N]\n"
    "                          [--ids] [--chat]\n";

namespace {

// The flags that take a value (--ids and --chat take none).
const std::set<std::string_view> kValueFlags = {
    "--model", "--prompt", "--prompt-ids", "--max-tokens", "--temperature", "--seed", "--threads"};

bool parse_float(const std::string& s, float* out) {
    char* end = nullptr;
    *out = std::strtof(s.c_str(), &end);
    return !s.empty() && end == s.c_str() + s.size();
}

// "1,2,3": every item a token id, >= 0 ("1,", ",1" and "-1" are not).
bool parse_ids(std::string_view s, std::vector<TokenId>* out) {
    for (;;) {
        const size_t comma = s.find(',');
        TokenId id = 0;
        if (!parse_whole_number(s.substr(0, comma), &id) || id < 0) {
            return false;
        }
        out->push_back(id);
        if (comma == std::string_view::npos) {
            return true;
        }
        s = s.substr(comma + 1);
    }
}

// Returns an error message, or "" on success.
std::string parse_into(int argc, char** argv, int first, GenerateArgs* a) {
    SeenFlags seen;
    for (int i = first; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (std::string twice = seen.repeated(flag); !twice.empty()) {
            return twice;
        }
        if (flag == "--ids") {
            a->ids = true;
            continue;
        }
        if (flag == "--chat") {
            a->chat = true;
            continue;
        }
        if (!kValueFlags.contains(flag)) {
            return flag.starts_with("-") ? "unknown flag " + std::string(flag)
                                         : "unexpected argument '" + std::string(flag) + "'";
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
            ok = parse_whole_number(value, &a->max_tokens);
        } else if (flag == "--temperature") {
            ok = parse_float(value, &a->temperature);
        } else if (flag == "--seed") {
            uint64_t seed = 0;
            ok = parse_whole_number(value, &seed);
            a->seed = seed;
        } else {
            ok = parse_whole_number(value, &a->threads);
        }
        if (!ok) {
            return "bad value for " + std::string(flag) + ": " + value;
        }
    }
    if (a->model_dir.empty()) {
        return "--model is required";
    }
    // The engine's own limits, checked before the model loads (minutes for a large one) and
    // reported as the usage errors they are.
    if (a->max_tokens < 1) {
        return "--max-tokens must be at least 1";
    }
    SamplingParams sampling;
    sampling.temperature = a->temperature;
    if (Status s = sampling::validate_sampling_params(sampling); !s.ok()) {
        return "--" + s.message();  // "--temperature: must be in [0, 2]".
    }
    if (a->threads < 0 || a->threads > cpu::kMaxPoolThreads) {
        return "--threads must be 0 (one per core) to " + std::to_string(cpu::kMaxPoolThreads);
    }
    if (a->prompt.has_value() == a->prompt_ids.has_value()) {
        return "give exactly one of --prompt and --prompt-ids";
    }
    if (a->chat && !a->prompt) {
        return "--chat needs --prompt";
    }
    // Nothing to continue from (with --chat the template still makes a prompt).
    if (!a->chat && a->prompt && a->prompt->empty()) {
        return "--prompt is empty";
    }
    return "";
}

}  // namespace

Result<GenerateArgs> parse_generate_args(int argc, char** argv, int first) {
    GenerateArgs args;
    const std::string error = parse_into(argc, argv, first, &args);
    if (!error.empty()) {
        return invalid_argument_error(error);
    }
    return args;
}

}  // namespace edge::engine
