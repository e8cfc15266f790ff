#include "engine/tools/make_model.h"

#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "common/cli_flags.h"
#include "common/json_text.h"
#include "engine/cpu/convert.h"
#include "engine/model/safetensors_writer.h"
#include "engine/tools/cli.h"
#include "engine/tools/make_model_archs.h"

namespace edge::engine {
namespace {

namespace json = boost::json;
using make_model::ArchPreset;
using make_model::Init;

// splitmix64: a tiny, good enough generator for random weights.
struct Rng {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Approximately N(0, 1): the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled.
    float normal() {
        uint64_t r = next();
        double s = static_cast<double>(r & 0xffff) + static_cast<double>((r >> 16) & 0xffff) +
                   static_cast<double>((r >> 32) & 0xffff) + static_cast<double>(r >> 48);
        return static_cast<float>((s / 65536.0 - 2.0) * std::sqrt(3.0));
    }
};

// GPT-2's byte-to-unicode map: printable bytes map to themselves, the rest to U+0100 on.
std::vector<std::string> byte_symbols() {
    std::vector<std::string> out(256);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
        std::string s;
        if (cp < 0x80) {
            s += static_cast<char>(cp);
        } else {
            s += static_cast<char>(0xc0 | (cp >> 6));
            s += static_cast<char>(0x80 | (cp & 0x3f));
        }
        out[b] = s;
    }
    return out;
}

const char* kSpecials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

Status write_tokenizer(const std::string& dir, const ArchPreset& p) {
    std::vector<std::string> sym = byte_symbols();
    json::object vocab;
    for (int b = 0; b < 256; ++b) {
        vocab[sym[b]] = b;
    }
    // A handful of merges: space + each letter, then a few common English pairs built on them.
    std::vector<std::pair<std::string, std::string>> merges;
    for (char c = 'a'; c <= 'z'; ++c) {
        merges.emplace_back(sym[' '], std::string(1, c));
    }
    const char* pairs[][2] = {{"t", "h"}, {"h", "e"}, {"i", "n"}, {"e", "r"}, {"a", "n"},
                              {"r", "e"}, {"o", "n"}, {"a", "t"}, {"e", "n"}, {"n", "d"},
                              {"Ġt", "h"}, {"Ġth", "e"}, {"in", "g"}, {"Ġa", "nd"},
                              {"o", "u"}, {"Ġo", "f"}, {"Ġt", "o"}, {"Ġi", "s"}};
    for (const auto& pr : pairs) {
        merges.emplace_back(pr[0], pr[1]);
    }
    json::array merge_list;
    int64_t next_id = 256;
    for (const auto& [a, b] : merges) {
        merge_list.push_back(json::string(a + " " + b));
        vocab[a + b] = next_id++;
    }
    json::array added;
    json::object added_decoder;
    for (int i = 0; i < 3; ++i) {
        int64_t id = p.vocab - 3 + i;
        json::object t{{"id", id},          {"content", kSpecials[i]}, {"single_word", false},
                       {"lstrip", false},   {"rstrip", false},         {"normalized", false},
                       {"special", true}};
        added.push_back(t);
        t.erase("id");
        added_decoder[std::to_string(id)] = t;
    }
    json::object byte_level{{"type", "ByteLevel"}, {"add_prefix_space", false},
                            {"trim_offsets", false}, {"use_regex", false}};
    const char* regex =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
        "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    json::object tok{
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer", {{"type", "NFC"}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"},
             {"invert", false}},
            byte_level}}}},
        {"post_processor", byte_level},
        {"decoder", byte_level},
        {"model",
         {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
          {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
          {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab},
          {"merges", merge_list}}}};
    EDGE_RETURN_IF_ERROR(write_text_file(dir + "/tokenizer.json", json_text(tok)));

    json::object cfg{
        {"add_bos_token", false},
        {"add_prefix_space", false},
        {"added_tokens_decoder", added_decoder},
        {"additional_special_tokens", {kSpecials[1], kSpecials[2]}},
        {"bos_token", nullptr},
        {"clean_up_tokenization_spaces", false},
        {"eos_token", kSpecials[2]},
        {"errors", "replace"},
        {"model_max_length", p.max_positions},
        {"pad_token", kSpecials[0]},
        {"split_special_tokens", false},
        {"tokenizer_class", "Qwen2Tokenizer"},
        {"unk_token", nullptr},
        {"chat_template",
         "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt "
         "%}{{- '<|im_start|>assistant\\n' }}{%- endif %}"}};
    EDGE_RETURN_IF_ERROR(write_text_file(dir + "/tokenizer_config.json", json_text(cfg)));
    json::object gen{{"bos_token_id", p.vocab - 3},
                     {"eos_token_id", {p.vocab - 3, p.vocab - 1}},
                     {"do_sample", false}};
    return write_text_file(dir + "/generation_config.json", json_text(gen));
}

// Weight scales as in the fixtures: linear N(0,1)/sqrt(fan_in), router and lm_head
// 2 N(0,1)/sqrt(hidden), embeddings N(0,1), norm weights 1 + 0.1 N(0,1), biases 0.02 N(0,1).
TensorToWrite random_tensor(std::string name, std::vector<int64_t> shape, Init init,
                            uint64_t seed) {
    TensorToWrite t;
    t.name = std::move(name);
    t.dtype = DType::kBF16;
    t.shape = shape;
    int64_t numel = 1;
    for (int64_t d : shape) {
        numel *= d;
    }
    const int64_t fan_in = shape.back();
    t.fill = [numel, fan_in, init, seed](char* out) {
        Rng rng{seed};
        auto* h = reinterpret_cast<uint16_t*>(out);
        float scale = 1.0f;
        float offset = 0.0f;
        switch (init) {
            case Init::kLinear:
                scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
                break;
            case Init::kWide:
                scale = static_cast<float>(2.0 / std::sqrt(static_cast<double>(fan_in)));
                break;
            case Init::kEmbedding:
                break;
            case Init::kNorm:
                scale = 0.1f;
                offset = 1.0f;
                break;
            case Init::kBias:
                scale = 0.02f;
                break;
        }
        for (int64_t i = 0; i < numel; ++i) {
            h[i] = cpu::f32_to_bf16(offset + scale * rng.normal());
        }
        return ok_status();
    };
    return t;
}

}  // namespace

std::vector<std::string> make_model_presets() { return make_model::preset_names(); }

Status write_random_checkpoint(const MakeModelOptions& options) {
    make_model::Arch arch{};
    if (!make_model::arch_from_name(options.arch, &arch)) {
        return invalid_argument_error("make-model: unknown architecture '" + options.arch +
                                      "' (qwen3_moe, glm4_moe, deepseek_v3)");
    }
    const ArchPreset* preset = make_model::find_preset(arch, options.preset);
    if (preset == nullptr) {
        return invalid_argument_error("make-model: unknown preset '" + options.preset +
                                      "' (tiny, bench)");
    }
    if (options.out_dir.empty()) {
        return invalid_argument_error("make-model: no output directory");
    }
    EDGE_ASSIGN_OR_RETURN(CheckpointDirLock lock,
                          prepare_checkpoint_dir(options.out_dir, {}, options.overwrite));
    const ArchPreset& p = *preset;
    const std::string& dir = options.out_dir;
    EDGE_RETURN_IF_ERROR(write_tokenizer(dir, p));

    std::vector<TensorToWrite> tensors;
    uint64_t counter = 0;
    make_model::for_each_tensor(p, [&](std::string name, std::vector<int64_t> shape, Init init) {
        // Each tensor has its own stream, derived from the seed and its index.
        Rng mix{options.seed * 0x100000001b3ull + (++counter)};
        tensors.push_back(random_tensor(std::move(name), std::move(shape), init, mix.next()));
    });
    EDGE_RETURN_IF_ERROR(write_safetensors(dir + "/model.safetensors", tensors));
    // The weights and tokenizer files durable, names included, before config.json can be: after
    // a power loss the directory is a whole checkpoint or has no config.json (as quantize does).
    EDGE_RETURN_IF_ERROR(fsync_path(dir));
    // Last: config.json marks the checkpoint complete (prepare_checkpoint_dir), its rename durable.
    EDGE_RETURN_IF_ERROR(
        write_text_file(dir + "/config.json", json_text(make_model::config_json(p))));
    return fsync_path(dir);
}

int make_model_main(int argc, char** argv) {
    MakeModelOptions options;
    options.preset.clear();
    const char* usage =
        "usage: edgeserve make-model [--arch qwen3_moe|glm4_moe|deepseek_v3] --preset tiny|bench "
        "--out DIR [--seed N] [--force]\n";
    if (wants_help(argc, argv, 1)) {
        std::cout << usage;
        return 0;
    }
    auto wrong = [usage](const std::string& what) {
        return usage_error("make-model", what, usage);
    };
    SeenFlags seen;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (std::string twice = seen.repeated(a); !twice.empty()) {
            return wrong(twice);
        }
        if (a == "--force") {
            options.overwrite = true;
            continue;
        }
        if (a != "--preset" && a != "--out" && a != "--seed" && a != "--arch") {
            return wrong("unexpected argument '" + a + "'");
        }
        if (i + 1 >= argc) {
            return wrong("missing the value of " + a);
        }
        const std::string v = argv[++i];
        if (a == "--arch") {
            options.arch = v;
        } else if (a == "--preset") {
            options.preset = v;
        } else if (a == "--out") {
            options.out_dir = v;
        } else if (!parse_whole_number(v, &options.seed)) {
            return wrong("--seed wants a non-negative integer, got '" + v + "'");
        }
    }
    // What write_random_checkpoint would refuse, refused as the usage errors they are.
    make_model::Arch arch{};
    if (!make_model::arch_from_name(options.arch, &arch)) {
        return wrong("--arch '" + options.arch + "' is not qwen3_moe, glm4_moe or deepseek_v3");
    }
    if (options.preset.empty() || options.out_dir.empty()) {
        return wrong(options.preset.empty() ? "missing --preset" : "missing --out");
    }
    if (make_model::find_preset(arch, options.preset) == nullptr) {
        return wrong("--preset '" + options.preset + "' is not tiny or bench");
    }
    Status st = write_random_checkpoint(options);
    if (!st.ok()) {
        std::cerr << "edgeserve make-model: " << st.to_string() << "\n";
        return 1;
    }
    std::cout << "wrote a random " << options.preset << " " << options.arch << " checkpoint (seed "
              << options.seed << ") to " << options.out_dir
              << "; its weights are random, so its text is meaningless\n";
    return 0;
}

}  // namespace edge::engine
