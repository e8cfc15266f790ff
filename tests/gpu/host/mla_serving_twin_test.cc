// DeepSeek-V3 (MLA attention) on the whole-step serving path, on the CPU: what CheckpointModel
// reads from micro-deepseek-v3 (AttentionKind::kMla, the MLA dims and YaRN tables of the CPU
// model's MlaConfig, every MLA tensor, errors naming a missing one), and the serving CausalLM with
// the CPU twin of the device steps (twin::mla_attention_layer in each layer over the paged latent
// pool) driven by the serving script against the CPU engine: logits within 1e-3 and the same
// argmax (greedy token) on every row, over prefill steps, buckets, decode and prefix
// copy-on-write; also with an rms_norm_eps other than 1e-6, which the MLA sub-norms ignore.

#include <doctest/doctest.h>

#include <cmath>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "engine/backend.h"
#include "engine/cuda/host/checkpoint_model.h"
#include "engine/cuda/host/serving_model.h"
#include "engine/cuda/host/twin_step_runner.h"
#include "engine/model/safetensors.h"
#include "engine/model/safetensors_writer.h"
#include "engine/model/weight_loader.h"
#include "engine/quant/quantized_weight.h"
#include "tests/gpu/host/config_edit.h"
#include "tests/gpu/host/serving_script.h"
#include "tests/gpu/host/twin_check.h"
#include "tests/testing/test_certs.h"

namespace edge::engine::cuda {
namespace {

const std::string kMicroDeepseek = EDGE_SOURCE_DIR "/tests/fixtures/micro-deepseek-v3";

std::string deepseek_config() { return edge::testing::read_file(kMicroDeepseek + "/config.json"); }

// The fixture's tokenizer and generation files in `dir`, next to a rewritten config or weights.
void copy_tokenizer_files(const edge::testing::TempDir& dir) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
        dir.write(f, edge::testing::read_file(kMicroDeepseek + "/" + f));
    }
}

// The f32 copy of every layer's BF16 kv_b_proj (heads x (nope + v) rows of kv_lora_rank) that the
// CPU model's absorbed MLA reads and counts in its weight bytes; the serving path holds only the
// stored matrix.
int64_t widened_kv_b_bytes() {
    const boost::json::object c = boost::json::parse(deepseek_config()).as_object();
    auto n = [&](const char* key) { return c.at(key).to_number<int64_t>(); };
    return n("num_hidden_layers") * n("num_attention_heads") *
           (n("qk_nope_head_dim") + n("v_head_dim")) * n("kv_lora_rank") *
           static_cast<int64_t>(sizeof(float));
}

// micro-deepseek-v3 in `dir` with every kv_b_proj stored as the FP8 releases of DeepSeek-V3 and
// Kimi K2 store it: F8_E4M3 plus a 128x128 block weight_scale_inv, config.json declaring
// quant_method fp8; the other tensors and files as in the fixture. `dequantized` gets each
// rewritten kv_b_proj's values as the quantizer's own view widens them, by tensor name.
void write_fp8_kv_b_fixture(const edge::testing::TempDir& dir,
                            std::map<std::string, std::vector<float>>* dequantized) {
    copy_tokenizer_files(dir);
    const std::string cfg = deepseek_config();
    REQUIRE(cfg.find('{') == 0);
    dir.write("config.json", "{\n  \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": "
                             "\"e4m3\", \"weight_block_size\": [128, 128]}," +
                                 cfg.substr(1));
    auto ck = Checkpoint::open_dir(kMicroDeepseek);
    REQUIRE(ck.ok());
    std::vector<TensorToWrite> ts;
    std::deque<std::string> bytes;  // The rewritten tensors' bytes (stable addresses).
    for (const std::string& name : (*ck)->names()) {
        auto t = (*ck)->tensor(name);
        REQUIRE(t.ok());
        const std::string_view stored(static_cast<const char*>(t->data),
                                      static_cast<size_t>(t->nbytes));
        if (!name.ends_with("kv_b_proj.weight")) {
            ts.push_back(TensorToWrite{name, t->dtype(), t->shape(), stored, nullptr});
            continue;
        }
        REQUIRE(t->dtype() == DType::kBF16);
        const int64_t rows = t->shape()[0], cols = t->shape()[1];
        auto q = quant::quantize(
            quant::SourceMatrix::bf16(static_cast<const uint16_t*>(t->data), rows, cols),
            WeightFormat::kFP8E4M3Block128, name);
        REQUIRE(q.ok());
        std::vector<float>& values = (*dequantized)[name];
        values.resize(static_cast<size_t>(rows * cols));
        for (int64_t r = 0; r < rows; ++r) {
            embedding_row(q->view(), r, values.data() + r * cols);
        }
        const std::string& data = bytes.emplace_back(
            static_cast<const char*>(q->view().data),
            static_cast<size_t>(
                quant::weight_data_bytes(WeightFormat::kFP8E4M3Block128, rows, cols)));
        const std::string& scales = bytes.emplace_back(
            reinterpret_cast<const char*>(q->scales().data()), q->scales().size() * 4);
        ts.push_back(TensorToWrite{name, DType::kF8E4M3, t->shape(), data, nullptr});
        const std::string module = name.substr(0, name.size() - 7);  // Without ".weight".
        ts.push_back(TensorToWrite{module + ".weight_scale_inv",
                                   DType::kF32,
                                   {(rows + 127) / 128, (cols + 127) / 128},
                                   scales,
                                   nullptr});
    }
    REQUIRE(dequantized->size() == 3);  // One kv_b_proj per layer.
    REQUIRE(write_safetensors(dir.file("model.safetensors"), ts).ok());
}

TEST_CASE("checkpoint model (DeepSeek-V3): MLA attention, dims, YaRN tables and tensors") {
    auto m = read_checkpoint_model(kMicroDeepseek, "none");
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->architecture == "DeepseekV3ForCausalLM");
    CHECK(m->attention == AttentionKind::kMla);
    CHECK(m->layers == 3);
    CHECK(m->dense_inter == 256);
    CHECK(m->shared_inter == 64);
    CHECK(m->router.scoring == RouterScoring::kSigmoid);
    CHECK(m->mla.q_lora_rank == 64);
    CHECK(m->mla.kv_lora_rank == 32);
    CHECK(m->mla.rope == 16);
    CHECK(m->kv_heads == 1);
    CHECK(m->head_dim == 24);  // Half a latent row: the host cache's bytes per token.
    REQUIRE(m->inv_freq.size() == 8);
    CHECK(m->inv_freq[1] == doctest::Approx(std::pow(50000.0, -2.0 / 16.0)));
    REQUIRE(m->layer.size() == 3);
    CHECK_FALSE(m->layer[0].moe);
    for (const CheckpointLayer& L : m->layer) {
        CHECK(L.mla.q_a.rows == 64);
        CHECK(L.mla.q.rows == 4 * 48);
        CHECK(L.mla.kv_a.rows == 48);
        CHECK(L.mla.kv_b.rows == 4 * 64);
        CHECK(L.mla.o.cols == 4 * 32);
        CHECK(L.mla.kv_a_norm.size() == 32);
        CHECK(L.q.data == nullptr);  // No GQA projections.
    }

    SUBCASE("YaRN rope_scaling: MlaConfig's tables and scales") {
        edge::testing::TempDir dir;
        dir.write("model.safetensors",
                  edge::testing::read_file(kMicroDeepseek + "/model.safetensors"));
        const std::string cfg = deepseek_config();
        const std::string from = "\"rope_scaling\": null";
        REQUIRE(cfg.find(from) != std::string::npos);
        dir.write("config.json",
                  std::string(cfg).replace(cfg.find(from), from.size(),
                                           "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": "
                                           "40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, "
                                           "\"original_max_position_embeddings\": 256}"));
        auto y = read_checkpoint_model(dir.path(), "none");
        REQUIRE_MESSAGE(y.ok(), y.status().to_string());
        const double ms = 0.1 * std::log(40.0) + 1.0;
        CHECK(y->mla.softmax_scale == doctest::Approx(ms * ms / std::sqrt(48.0)));
        CHECK(y->mla.rope_mscale == doctest::Approx(1.0));
        CHECK(y->inv_freq[7] < m->inv_freq[7]);
        CHECK(y->max_position == 256 * 40);  // original x factor, as the CPU model serves.
        CHECK(m->max_position == 2048);
    }
    SUBCASE("a missing MLA tensor is the checkpoint's error naming it") {
        edge::testing::TempDir dir;
        auto ck = Checkpoint::open_dir(kMicroDeepseek);
        REQUIRE(ck.ok());
        const std::string drop = "model.layers.2.self_attn.kv_b_proj.weight";
        std::vector<TensorToWrite> keep;
        for (const std::string& name : (*ck)->names()) {
            if (name == drop) {
                continue;
            }
            auto t = (*ck)->tensor(name);
            REQUIRE(t.ok());
            keep.push_back(TensorToWrite{
                name, t->dtype(), t->shape(),
                std::string_view(static_cast<const char*>(t->data), static_cast<size_t>(t->nbytes)),
                nullptr});
        }
        REQUIRE(write_safetensors(dir.file("model.safetensors"), keep).ok());
        dir.write("config.json", deepseek_config());
        auto bad = read_checkpoint_model(dir.path(), "none");
        REQUIRE_FALSE(bad.ok());
        CHECK_MESSAGE(bad.status().message().find(drop) != std::string::npos,
                      bad.status().message());
    }
}

TEST_CASE(
    "serving path on the CPU twin: DeepSeek-V3 (MLA over the paged latent pool, dense first "
    "layer, shared expert, sigmoid grouped routing) equals the CPU model") {
    // "all-int8" quantizes q_a/q_b/kv_a/o_proj on load on both sides and kv_b_proj stays as
    // stored: the same bytes but the CPU model's widened kv_b_proj. Its logits are not compared
    // (the CPU's INT8 kernels quantize the activations too; the twins do not).
    for (const char* policy : {"none", "all-int8"}) {
        CAPTURE(policy);
        LoadOptions cpu_options = testing::serving_script_options("cpu");
        LoadOptions twin_options = testing::serving_script_options("cuda");
        cpu_options.quantization = policy;
        twin_options.quantization = policy;
        auto cpu = load_model(kMicroDeepseek, cpu_options);
        REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
        auto twin = load_serving_causal_lm(kMicroDeepseek, twin_options, create_twin_step_runner);
        REQUIRE_MESSAGE(twin.ok(), twin.status().to_string());
        CHECK(twin->get()->spec().architecture == cpu->get()->spec().architecture);
        CHECK(twin->get()->spec().kv_bytes_per_token == cpu->get()->spec().kv_bytes_per_token);
        CHECK(twin->get()->spec().weight_bytes + widened_kv_b_bytes() ==
              cpu->get()->spec().weight_bytes);
        // The same weights and f32 activations; the twins accumulate in double against the
        // CPU's f32 sums (the CPU model runs plain MLA for prefill chunks, absorbed for decode).
        if (std::string(policy) == "none") {
            testing::run_serving_script(**cpu, **twin, 1e-3);
        }
    }
}

TEST_CASE(
    "serving path on the CPU twin: DeepSeek-V3's q_a and kv_a norms use 1e-6 as the CPU model "
    "(and Hugging Face) do, not config.rms_norm_eps") {
    // An rms_norm_eps far from the fixture's 1e-6: the input, post-attention and final norms
    // take it, the two MLA sub-norms must not, or the logits drift from the CPU model's.
    edge::testing::TempDir dir;
    copy_tokenizer_files(dir);
    dir.write("model.safetensors", edge::testing::read_file(kMicroDeepseek + "/model.safetensors"));
    dir.write("config.json", config_with_field(deepseek_config(), "rms_norm_eps", "0.065536"));
    auto m = read_checkpoint_model(dir.path(), "none");
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    CHECK(m->rms_eps == 0.065536f);
    CHECK(m->mla.eps == 1e-6f);
    testing::check_twin_equals_cpu(dir.path());
}

TEST_CASE(
    "checkpoint model (DeepSeek-V3): kv_b_proj stored in FP8 (the real checkpoints) is read "
    "widened to F32, and the serving path on the CPU twin equals the CPU model on it") {
    edge::testing::TempDir dir;
    std::map<std::string, std::vector<float>> dequantized;
    write_fp8_kv_b_fixture(dir, &dequantized);
    auto bf16 = read_checkpoint_model(kMicroDeepseek, "none");
    REQUIRE_MESSAGE(bf16.ok(), bf16.status().to_string());
    auto m = read_checkpoint_model(dir.path(), "none");
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    REQUIRE(m->layer.size() == 3);
    for (size_t l = 0; l < m->layer.size(); ++l) {
        CAPTURE(l);
        const Weight& kv_b = m->layer[l].mla.kv_b;
        REQUIRE(kv_b.format == WeightFormat::kF32);  // What the kernels read element by element.
        REQUIRE(kv_b.rows == 4 * 64);
        REQUIRE(kv_b.cols == 32);
        CHECK(kv_b.scales == nullptr);
        const std::vector<float>& want =
            dequantized.at("model.layers." + std::to_string(l) + ".self_attn.kv_b_proj.weight");
        const float* got = static_cast<const float*>(kv_b.data);
        std::vector<float> stored(static_cast<size_t>(kv_b.cols));
        int differ = 0;
        for (int64_t r = 0; r < kv_b.rows; ++r) {
            embedding_row(bf16->layer[l].mla.kv_b, r, stored.data());
            for (int64_t c = 0; c < kv_b.cols; ++c) {
                const float v = got[r * kv_b.cols + c];
                // Bit for bit the FP8 values, as WeightLoader::float_matrix gives the CPU model.
                REQUIRE(v == want[static_cast<size_t>(r * kv_b.cols + c)]);
                // FP8 E4M3 keeps 3 mantissa bits: within 1/16 of the BF16 value (plus the
                // block scale's subnormal floor).
                CHECK(std::fabs(v - stored[c]) <= std::fabs(stored[c]) / 16 + 1e-6f);
                differ += v != stored[c] ? 1 : 0;
            }
        }
        CHECK(differ > 0);  // Really the FP8 rounding, not the BF16 tensor.
    }
    // The same checkpoint through the CPU model and the serving path's CPU twin: kv_b_proj
    // widened identically on both sides, so the script's 1e-3 holds as for the BF16 fixture.
    LoadOptions cpu_options = testing::serving_script_options("cpu");
    LoadOptions twin_options = testing::serving_script_options("cuda");
    auto cpu = load_model(dir.path(), cpu_options);
    REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
    auto twin = load_serving_causal_lm(dir.path(), twin_options, create_twin_step_runner);
    REQUIRE_MESSAGE(twin.ok(), twin.status().to_string());
    CHECK(twin->get()->spec().weight_bytes == cpu->get()->spec().weight_bytes);
    testing::run_serving_script(**cpu, **twin, 1e-3);
}

}  // namespace
}  // namespace edge::engine::cuda
