#include "engine/tools/make_model.h"

#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "engine/cpu/convert.h"
#include "engine/model/safetensors_writer.h"

namespace edge::engine {
namespace {

namespace json = boost::json;

struct Preset {
    const char* name;
    int64_t hidden;
    int64_t layers;
    int64_t experts;
    int64_t top_k;
    int64_t moe_inter;
    int64_t inter;
    int64_t heads;
    int64_t kv_heads;
    int64_t head_dim;
    int64_t vocab;
    int64_t max_positions;
    bool tie_embeddings;
    std::vector<int64_t> mlp_only_layers;
};

const Preset kPresets[] = {
    // Layer 0 dense and tied embeddings so tests reach those paths too.
    {"tiny", 128, 2, 8, 2, 64, 256, 4, 2, 32, 512, 2048, true, {0}},
    {"bench", 1024, 12, 64, 8, 512, 2816, 16, 4, 64, 32000, 4096, false, {}},
};

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

Status write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
        return internal_error(path + ": write failed");
    }
    return ok_status();
}

const char* kSpecials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

Status write_tokenizer(const std::string& dir, const Preset& p) {
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
    EDGE_RETURN_IF_ERROR(write_text(dir + "/tokenizer.json", json::serialize(tok)));

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
    EDGE_RETURN_IF_ERROR(write_text(dir + "/tokenizer_config.json", json::serialize(cfg)));
    json::object gen{{"bos_token_id", p.vocab - 3},
                     {"eos_token_id", {p.vocab - 3, p.vocab - 1}},
                     {"do_sample", false}};
    return write_text(dir + "/generation_config.json", json::serialize(gen));
}

Status write_config(const std::string& dir, const Preset& p) {
    json::array mlp_only;
    for (int64_t l : p.mlp_only_layers) {
        mlp_only.push_back(l);
    }
    json::object c{{"architectures", {"Qwen3MoeForCausalLM"}},
                   {"model_type", "qwen3_moe"},
                   {"attention_bias", false},
                   {"attention_dropout", 0.0},
                   {"bos_token_id", p.vocab - 3},
                   {"eos_token_id", {p.vocab - 3, p.vocab - 1}},
                   {"decoder_sparse_step", 1},
                   {"head_dim", p.head_dim},
                   {"hidden_act", "silu"},
                   {"hidden_size", p.hidden},
                   {"initializer_range", 0.02},
                   {"intermediate_size", p.inter},
                   {"max_position_embeddings", p.max_positions},
                   {"max_window_layers", p.layers},
                   {"mlp_only_layers", mlp_only},
                   {"moe_intermediate_size", p.moe_inter},
                   {"norm_topk_prob", true},
                   {"num_attention_heads", p.heads},
                   {"num_experts", p.experts},
                   {"num_experts_per_tok", p.top_k},
                   {"num_hidden_layers", p.layers},
                   {"num_key_value_heads", p.kv_heads},
                   {"output_router_logits", false},
                   {"rms_norm_eps", 1e-6},
                   {"rope_scaling", nullptr},
                   {"rope_theta", 1000000.0},
                   {"router_aux_loss_coef", 0.001},
                   {"sliding_window", nullptr},
                   {"tie_word_embeddings", p.tie_embeddings},
                   {"torch_dtype", "bfloat16"},
                   {"use_cache", true},
                   {"use_sliding_window", false},
                   {"vocab_size", p.vocab}};
    return write_text(dir + "/config.json", json::serialize(c));
}

// Weight scales as in the fixtures: linear N(0,1)/sqrt(fan_in), router and lm_head
// 2 N(0,1)/sqrt(hidden), embeddings N(0,1), norm weights 1 + 0.1 N(0,1).
enum class Init { kLinear, kWide, kEmbedding, kNorm };

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
        }
        for (int64_t i = 0; i < numel; ++i) {
            h[i] = cpu::f32_to_bf16(offset + scale * rng.normal());
        }
    };
    return t;
}

}  // namespace

std::vector<std::string> make_model_presets() {
    std::vector<std::string> out;
    for (const Preset& p : kPresets) {
        out.push_back(p.name);
    }
    return out;
}

Status write_random_checkpoint(const MakeModelOptions& options) {
    const Preset* preset = nullptr;
    for (const Preset& p : kPresets) {
        if (options.preset == p.name) {
            preset = &p;
        }
    }
    if (preset == nullptr) {
        return invalid_argument_error("make-model: unknown preset '" + options.preset +
                                      "' (tiny, bench)");
    }
    if (options.out_dir.empty()) {
        return invalid_argument_error("make-model: no output directory");
    }
    std::error_code ec;
    std::filesystem::create_directories(options.out_dir, ec);
    if (ec) {
        return internal_error(options.out_dir + ": cannot create: " + ec.message());
    }
    const Preset& p = *preset;
    const std::string& dir = options.out_dir;
    EDGE_RETURN_IF_ERROR(write_config(dir, p));
    EDGE_RETURN_IF_ERROR(write_tokenizer(dir, p));

    std::vector<TensorToWrite> tensors;
    uint64_t counter = 0;
    auto add = [&](std::string name, std::vector<int64_t> shape, Init init) {
        // Each tensor has its own stream, derived from the seed and its index.
        Rng mix{options.seed * 0x100000001b3ull + (++counter)};
        tensors.push_back(random_tensor(std::move(name), std::move(shape), init, mix.next()));
    };
    const int64_t H = p.hidden;
    add("model.embed_tokens.weight", {p.vocab, H}, Init::kEmbedding);
    for (int64_t l = 0; l < p.layers; ++l) {
        const std::string pre = "model.layers." + std::to_string(l) + ".";
        add(pre + "input_layernorm.weight", {H}, Init::kNorm);
        add(pre + "post_attention_layernorm.weight", {H}, Init::kNorm);
        add(pre + "self_attn.q_proj.weight", {p.heads * p.head_dim, H}, Init::kLinear);
        add(pre + "self_attn.k_proj.weight", {p.kv_heads * p.head_dim, H}, Init::kLinear);
        add(pre + "self_attn.v_proj.weight", {p.kv_heads * p.head_dim, H}, Init::kLinear);
        add(pre + "self_attn.o_proj.weight", {H, p.heads * p.head_dim}, Init::kLinear);
        add(pre + "self_attn.q_norm.weight", {p.head_dim}, Init::kNorm);
        add(pre + "self_attn.k_norm.weight", {p.head_dim}, Init::kNorm);
        bool dense = false;
        for (int64_t d : p.mlp_only_layers) {
            dense = dense || d == l;
        }
        if (dense) {
            add(pre + "mlp.gate_proj.weight", {p.inter, H}, Init::kLinear);
            add(pre + "mlp.up_proj.weight", {p.inter, H}, Init::kLinear);
            add(pre + "mlp.down_proj.weight", {H, p.inter}, Init::kLinear);
            continue;
        }
        add(pre + "mlp.gate.weight", {p.experts, H}, Init::kWide);
        for (int64_t e = 0; e < p.experts; ++e) {
            const std::string ex = pre + "mlp.experts." + std::to_string(e) + ".";
            add(ex + "gate_proj.weight", {p.moe_inter, H}, Init::kLinear);
            add(ex + "up_proj.weight", {p.moe_inter, H}, Init::kLinear);
            add(ex + "down_proj.weight", {H, p.moe_inter}, Init::kLinear);
        }
    }
    add("model.norm.weight", {H}, Init::kNorm);
    if (!p.tie_embeddings) {
        add("lm_head.weight", {p.vocab, H}, Init::kWide);
    }
    return write_safetensors(dir + "/model.safetensors", tensors);
}

int make_model_main(int argc, char** argv) {
    MakeModelOptions options;
    options.preset.clear();
    const char* usage = "usage: edgeserve make-model --preset tiny|bench --out DIR [--seed N]\n";
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if ((a == "--preset" || a == "--out" || a == "--seed") && i + 1 < argc) {
            std::string v = argv[++i];
            if (a == "--preset") {
                options.preset = v;
            } else if (a == "--out") {
                options.out_dir = v;
            } else {
                char* end = nullptr;
                errno = 0;
                unsigned long long s = std::strtoull(v.c_str(), &end, 10);
                if (v.empty() || *end != '\0' || errno != 0 || v[0] == '-') {
                    std::cerr << "make-model: --seed wants a non-negative integer, got '" << v
                              << "'\n"
                              << usage;
                    return 2;
                }
                options.seed = s;
            }
        } else if (a == "--preset" || a == "--out" || a == "--seed") {
            std::cerr << "make-model: " << a << " needs a value\n" << usage;
            return 2;
        } else if (a == "--help" || a == "-h") {
            std::cout << usage;
            return 0;
        } else {
            std::cerr << "make-model: unexpected argument '" << a << "'\n" << usage;
            return 2;
        }
    }
    if (options.preset.empty() || options.out_dir.empty()) {
        std::cerr << usage;
        return 2;
    }
    Status st = write_random_checkpoint(options);
    if (!st.ok()) {
        std::cerr << st.to_string() << "\n";
        return 1;
    }
    std::cout << "wrote a random " << options.preset << " Qwen3-MoE checkpoint (seed "
              << options.seed << ") to " << options.out_dir
              << "; its weights are random, so its text is meaningless\n";
    return 0;
}

}  // namespace edge::engine
