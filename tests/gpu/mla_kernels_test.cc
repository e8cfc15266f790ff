// The MLA kernels (engine/cuda/kernels/mla.h) against their CPU twins (host/mla_twin.h) on random
// shapes, kv_b_proj in bf16, f32, FP8 block-128 and int8, with the error threshold stated per
// case. Inputs are exact on both sides (weights dequantized by the same rules); thresholds cover
// f32 accumulation against the twins' double accumulation and expf rounding only.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>

#include "engine/cpu/convert.h"
#include "engine/cpu/rope_scaling.h"
#include "engine/cuda/host/mla_layout.h"
#include "engine/cuda/host/mla_twin.h"
#include "engine/cuda/kernels/mla.h"
#include "engine/quant/quantized_weight.h"
#include "tests/gpu/testing_gpu.h"

namespace edge::engine::cuda {
namespace {

using testing::check_close;
using testing::DeviceVec;
using testing::random_floats;

// A random weight of `format` as a host view and a device view (plus the device table
// {data, scales} a single-group GroupedWeights points at).
struct MlaTestWeight {
    quant::QuantizedWeight quantized;
    std::vector<float> f32;
    std::vector<uint16_t> bf16;
    Weight host;
    std::unique_ptr<DeviceVec<uint8_t>> data;
    std::unique_ptr<DeviceVec<float>> scales;
    std::unique_ptr<DeviceVec<const void*>> table;
    Weight device;

    kernels::GroupedWeights grouped() const {
        kernels::GroupedWeights g;
        g.format = device.format;
        g.rows = device.rows;
        g.cols = device.cols;
        g.groups = 1;
        g.data = table->get();
        g.scales = device.scales != nullptr
                       ? reinterpret_cast<const float* const*>(table->get() + 1)
                       : nullptr;
        return g;
    }
};

std::unique_ptr<MlaTestWeight> mla_weight(std::mt19937_64& rng, WeightFormat format, int64_t rows,
                                          int64_t cols, float spread) {
    auto t = std::make_unique<MlaTestWeight>();
    t->f32 = random_floats(rng, rows * cols, -spread, spread);
    std::vector<uint8_t> bytes;
    if (format == WeightFormat::kF32) {
        t->host = Weight{format, rows, cols, t->f32.data(), nullptr};
    } else if (format == WeightFormat::kBF16) {
        t->bf16.resize(t->f32.size());
        for (size_t i = 0; i < t->f32.size(); ++i) {
            t->bf16[i] = cpu::f32_to_bf16(t->f32[i]);
        }
        t->host = Weight{format, rows, cols, t->bf16.data(), nullptr};
    } else {
        auto q = quant::quantize(quant::SourceMatrix::f32(t->f32.data(), rows, cols), format);
        REQUIRE(q.ok());
        t->quantized = std::move(*q);
        t->host = t->quantized.view();
    }
    const int64_t n = quant::weight_data_bytes(format, rows, cols);
    bytes.assign(static_cast<const uint8_t*>(t->host.data),
                 static_cast<const uint8_t*>(t->host.data) + n);
    t->data = std::make_unique<DeviceVec<uint8_t>>(bytes);
    const int64_t ns = quant::weight_scale_count(format, rows, cols);
    if (ns > 0) {
        t->scales = std::make_unique<DeviceVec<float>>(
            std::vector<float>(t->host.scales, t->host.scales + ns));
    }
    t->device = Weight{format, rows, cols, t->data->get(), t->scales ? t->scales->get() : nullptr};
    const std::vector<const void*> table = {t->device.data, t->device.scales};
    t->table = std::make_unique<DeviceVec<const void*>>(table);
    return t;
}

// Sequences of `lengths` over shuffled blocks of a pool of `num_blocks`.
std::vector<int32_t> shuffled_table(std::mt19937_64& rng, const std::vector<int32_t>& lengths,
                                    int32_t max_blocks, int32_t num_blocks) {
    std::vector<int32_t> blocks(num_blocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    std::vector<int32_t> table(lengths.size() * max_blocks, -1);
    size_t next = 0;
    for (size_t s = 0; s < lengths.size(); ++s) {
        for (int32_t b = 0; b < kv_blocks_for(lengths[s]); ++b) {
            table[s * max_blocks + b] = blocks[next++];
        }
    }
    return table;
}

MlaDims dims_of(int32_t heads, int32_t latent, int32_t rope, int32_t nope, int32_t v) {
    MlaDims d;
    d.hidden = 96;
    d.heads = heads;
    d.q_lora_rank = 48;
    d.kv_lora_rank = latent;
    d.nope = nope;
    d.rope = rope;
    d.v_head_dim = v;
    d.softmax_scale = 1.3f / std::sqrt(static_cast<float>(nope + rope));
    d.rope_mscale = 1.05f;
    return d;
}

TEST_CASE("mla kernels (latent write, absorb, attention, expand) match the twins") {
    std::mt19937_64 rng(19);
    // DeepSeek-V3's per-head shape (two head groups, the second partial), the fixture's with
    // two full groups, and odd widths with one partial group.
    const MlaDims shapes[] = {dims_of(11, 512, 64, 128, 128), dims_of(16, 32, 16, 32, 32),
                              dims_of(5, 100, 8, 24, 20)};
    const WeightFormat formats[] = {WeightFormat::kBF16, WeightFormat::kF32,
                                    WeightFormat::kFP8E4M3Block128, WeightFormat::kInt8Row};
    for (const MlaDims& d : shapes) {
        for (WeightFormat f : formats) {
            CAPTURE(d.kv_lora_rank);
            CAPTURE(quant::weight_format_name(f));
            const MlaLatentLayout L = mla_latent_layout(d, 2, 24);
            const int32_t layer = 1, max_blocks = 8;
            const std::vector<int32_t> lengths = {1, 16, 17, 69};  // 103 rows: a partial tile.
            const auto table = shuffled_table(rng, lengths, max_blocks, L.num_blocks);
            REQUIRE(check_mla_block_table(L, table, max_blocks, lengths).ok());
            std::vector<int32_t> seq, pos;  // Prefill: every position of every sequence.
            for (size_t s = 0; s < lengths.size(); ++s) {
                for (int32_t p = 0; p < lengths[s]; ++p) {
                    seq.push_back(static_cast<int32_t>(s));
                    pos.push_back(p);
                }
            }
            const int64_t T = static_cast<int64_t>(seq.size());
            auto kv = random_floats(rng, T * d.row());
            auto norm = random_floats(rng, d.kv_lora_rank, 0.8f, 1.2f);
            auto q = random_floats(rng, T * d.heads * d.qk());
            auto kv_b = mla_weight(rng, f, d.heads * d.kv_b_rows_per_head(), d.kv_lora_rank,
                                   1.0f / std::sqrt(static_cast<float>(d.kv_lora_rank)));
            std::vector<float> pool(L.pool_floats(), 0.0f);
            DeviceVec<float> dkv(kv), dnorm(norm), dq(q), dpool(pool);
            DeviceVec<int32_t> dseq(seq), dpos(pos), dtable(table);
            // Threshold: the same double sum of squares and the same f32 products: exact.
            REQUIRE(kernels::mla_latent_write(L, layer, d, dkv.get(), dnorm.get(), dseq.get(),
                                              dpos.get(), T, dtable.get(), max_blocks, dpool.get(),
                                              nullptr)
                        .ok());
            twin::mla_latent_write(L, layer, d, kv.data(), norm.data(), seq.data(), pos.data(), T,
                                   table.data(), max_blocks, pool.data());
            check_close(dpool.download(), pool, 1e-6, 1e-6, "mla latent write");
            // Threshold: nope f32 products summed in f32 vs double, |terms| <= 1 / sqrt(latent):
            // below 1e-5 + 1e-5 |y|.
            DeviceVec<float> dqf(T * d.heads * d.row());
            REQUIRE(kernels::mla_absorb(kv_b->device, d, dq.get(), T, dqf.get(), nullptr).ok());
            std::vector<float> q_full(T * d.heads * d.row());
            twin::mla_absorb(kv_b->host, d, q.data(), T, q_full.data());
            check_close(dqf.download(), q_full, 1e-5, 1e-5, "mla absorb");
            // Threshold: as paged attention (kernels_test.cc), scores over latent + rope dims in
            // f32 and the online softmax's expf: 1e-4 + 1e-4 |o|.
            DeviceVec<float> dol(T * d.heads * d.kv_lora_rank);
            dqf.upload(q_full);  // Both attentions from the same queries.
            REQUIRE(kernels::mla_attention(L, layer, d, dqf.get(), T, dseq.get(), dpos.get(),
                                           dtable.get(), max_blocks, dpool.get(), dol.get(),
                                           nullptr)
                        .ok());
            std::vector<float> o_lat(T * d.heads * d.kv_lora_rank);
            twin::mla_attention(L, layer, d, q_full.data(), T, seq.data(), pos.data(), table.data(),
                                max_blocks, pool.data(), o_lat.data());
            check_close(dol.download(), o_lat, 1e-4, 1e-4, "mla attention");
            // Threshold: latent-long f32 dot products vs double: 1e-5 + 1e-5 |y|.
            DeviceVec<float> dout(T * d.heads * d.v_head_dim);
            dol.upload(o_lat);
            REQUIRE(kernels::mla_expand(kv_b->device, d, dol.get(), T, dout.get(), nullptr).ok());
            std::vector<float> out(T * d.heads * d.v_head_dim);
            twin::mla_expand(kv_b->host, d, o_lat.data(), T, out.data());
            check_close(dout.download(), out, 1e-5, 1e-5, "mla expand");
        }
    }
}

TEST_CASE("mla_attention_layer on the device matches the twin over prefill and decode steps") {
    std::mt19937_64 rng(23);
    for (int32_t q_lora : {48, 0}) {
        for (bool interleave : {true, false}) {
            CAPTURE(q_lora);
            CAPTURE(interleave);
            MlaDims d = dims_of(4, 64, 16, 32, 32);
            d.q_lora_rank = q_lora;
            d.interleave = interleave;
            const WeightFormat f = WeightFormat::kBF16;
            const int64_t H = d.hidden;
            const float sh = 1.0f / std::sqrt(static_cast<float>(H));
            MlaLayerWeights hw;
            std::unique_ptr<MlaTestWeight> q_a, q, kv_a, kv_b;
            if (q_lora > 0) {
                q_a = mla_weight(rng, f, q_lora, H, sh);
                hw.q_a = q_a->host;
                hw.q_a_norm = random_floats(rng, q_lora, 0.8f, 1.2f);
            }
            const int64_t q_in = q_lora > 0 ? q_lora : H;
            q = mla_weight(rng, f, d.heads * d.qk(), q_in,
                           1.0f / std::sqrt(static_cast<float>(q_in)));
            kv_a = mla_weight(rng, f, d.row(), H, sh);
            kv_b = mla_weight(rng, f, d.heads * d.kv_b_rows_per_head(), d.kv_lora_rank,
                              1.0f / std::sqrt(static_cast<float>(d.kv_lora_rank)));
            hw.q = q->host;
            hw.kv_a = kv_a->host;
            hw.kv_a_norm = random_floats(rng, d.kv_lora_rank, 0.8f, 1.2f);
            hw.kv_b = kv_b->host;
            DeviceVec<float> dqa_norm(hw.q_a_norm.empty() ? std::vector<float>(1) : hw.q_a_norm);
            DeviceVec<float> dkva_norm(hw.kv_a_norm);
            kernels::MlaDeviceWeights dw;
            if (q_lora > 0) {
                dw.q_a = q_a->grouped();
                dw.q_a_norm = dqa_norm.get();
            }
            dw.q = q->grouped();
            dw.kv_a = kv_a->grouped();
            dw.kv_a_norm = dkva_norm.get();
            dw.kv_b = kv_b->device;
            cpu::YarnConfig y;
            y.factor = 8.0;
            y.original_max_position = 64;
            const std::vector<double> inv_freq = cpu::yarn_inv_freq(10000.0, d.rope, y);
            DeviceVec<double> dinv(inv_freq);
            const MlaLatentLayout L = mla_latent_layout(d, 1, 12);
            const int32_t max_blocks = 4;
            const std::vector<int32_t> table = shuffled_table(rng, {40, 40}, max_blocks, 12);
            std::vector<float> pool(L.pool_floats(), 0.0f);
            DeviceVec<float> dpool(pool);
            DeviceVec<int32_t> dtable(table);
            int32_t len[2] = {0, 0};
            // Steps: prefill chunks of both sequences, then decode rows past a block boundary.
            const std::vector<std::vector<int32_t>> steps = {{0, 0, 0, 0, 0, 0, 0, 1, 1, 1},
                                                             {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                                                             {0, 1},
                                                             {0, 1},
                                                             {0, 1},
                                                             {0, 1}};
            for (const auto& rows_of : steps) {
                std::vector<int32_t> seq, pos;
                for (int32_t s : rows_of) {
                    seq.push_back(s);
                    pos.push_back(len[s]++);
                }
                const int64_t T = static_cast<int64_t>(seq.size());
                auto x = random_floats(rng, T * H);
                DeviceVec<float> dx(x), dout(T * d.heads * d.v_head_dim);
                DeviceVec<float> dscratch(mla_scratch_floats(d, T));
                DeviceVec<int32_t> dseq(seq), dpos(pos);
                DeviceVec<int32_t> doff(std::vector<int32_t>{0, static_cast<int32_t>(T)});
                REQUIRE(kernels::mla_attention_layer(dw, d, L, 0, dx.get(), T, doff.get(),
                                                     dseq.get(), dpos.get(), dtable.get(),
                                                     max_blocks, dinv.get(), dpool.get(),
                                                     dscratch.get(), dout.get(), nullptr)
                            .ok());
                std::vector<float> out(T * d.heads * d.v_head_dim);
                REQUIRE(twin::mla_attention_layer(hw, d, L, 0, x.data(), T, seq.data(), pos.data(),
                                                  2, table.data(), max_blocks, inv_freq.data(),
                                                  pool.data(), out.data())
                            .ok());
                // Threshold: every stage's f32 error above, compounded through the projections
                // and the softmax: 5e-4 + 1e-3 |out| (outputs are O(1)).
                check_close(dout.download(), out, 5e-4, 1e-3, "mla attention layer");
                check_close(dpool.download(), pool, 1e-4, 1e-4, "mla latent cache");
            }
        }
    }
}

TEST_CASE("mla kernels refuse bad dims and a kv_b of the wrong shape before any launch") {
    MlaDims d = dims_of(4, 32, 16, 32, 32);
    MlaDims bad = d;
    bad.kv_lora_rank = kMlaMaxLatent + 32;
    const Weight kv_b{WeightFormat::kBF16, d.heads * d.kv_b_rows_per_head(), d.kv_lora_rank,
                      reinterpret_cast<const void*>(16), nullptr};
    CHECK_FALSE(kernels::mla_absorb(kv_b, bad, nullptr, 1, nullptr, nullptr).ok());
    Weight wrong = kv_b;
    wrong.rows -= 1;
    const Status s = kernels::mla_expand(wrong, d, nullptr, 1, nullptr, nullptr);
    CHECK(s.to_string().find("kv_b_proj") != std::string::npos);
    const MlaLatentLayout L = mla_latent_layout(d, 1, 4);
    CHECK_FALSE(kernels::mla_attention(L, 1, d, nullptr, 1, nullptr, nullptr, nullptr, 1, nullptr,
                                       nullptr, nullptr)
                    .ok());
}

}  // namespace
}  // namespace edge::engine::cuda
