// Every CUDA kernel against its CPU twin (engine/cuda/host/cpu_twins.h) on random shapes, with
// the error threshold stated per case. The inputs are exact in both (weights dequantized by the
// same rules), so thresholds only cover f32 accumulation order and exp/cos rounding.

#include "engine/cuda/kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>

#include "engine/cpu/convert.h"
#include "engine/cpu/rope_scaling.h"
#include "engine/cuda/host/cpu_twins.h"
#include "engine/quant/quantized_weight.h"
#include "tests/gpu/testing_gpu.h"

namespace edge::engine::cuda {
namespace {

using testing::check_close;
using testing::DeviceVec;
using testing::random_floats;

// A host weight of `format` (quantized from random values) and its copy on the device.
struct TestWeight {
    quant::QuantizedWeight host;
    std::vector<uint8_t> bytes;  // Float formats: the stored elements.
    std::vector<float> f32;
    Weight view;                 // Host view.
    std::unique_ptr<DeviceVec<uint8_t>> d_data;
    std::unique_ptr<DeviceVec<float>> d_scales;
    Weight device;               // Device view.
};

std::unique_ptr<TestWeight> make_weight(std::mt19937_64& rng, WeightFormat format, int64_t rows,
                                        int64_t cols) {
    auto t = std::make_unique<TestWeight>();
    t->f32 = random_floats(rng, rows * cols, -0.5f, 0.5f);
    if (format == WeightFormat::kF32) {
        t->view = Weight{format, rows, cols, t->f32.data(), nullptr};
        t->bytes.resize(rows * cols * 4);
        std::memcpy(t->bytes.data(), t->f32.data(), t->bytes.size());
    } else if (format == WeightFormat::kBF16 || format == WeightFormat::kF16) {
        t->bytes.resize(rows * cols * 2);
        for (int64_t i = 0; i < rows * cols; ++i) {
            uint16_t b = cpu::f32_to_bf16(t->f32[i]);
            if (format == WeightFormat::kF16) {
                // sign | exponent 10..14 (2^-5 .. 2^-1) | random mantissa: finite, normal.
                const uint64_t r = rng();
                b = static_cast<uint16_t>(((r & 1) << 15) | ((10 + (r >> 1) % 5) << 10) |
                                          ((r >> 8) & 0x3FF));
            }
            std::memcpy(t->bytes.data() + i * 2, &b, 2);
        }
        t->view = Weight{format, rows, cols, t->bytes.data(), nullptr};
    } else {
        auto q = quant::quantize(quant::SourceMatrix::f32(t->f32.data(), rows, cols), format);
        REQUIRE(q.ok());
        t->host = std::move(*q);
        t->view = t->host.view();
        const int64_t n = quant::weight_data_bytes(format, rows, cols);
        t->bytes.assign(static_cast<const uint8_t*>(t->view.data),
                        static_cast<const uint8_t*>(t->view.data) + n);
    }
    t->d_data = std::make_unique<DeviceVec<uint8_t>>(t->bytes);
    const int64_t ns = quant::weight_scale_count(format, rows, cols);
    if (ns > 0) {
        t->d_scales = std::make_unique<DeviceVec<float>>(
            std::vector<float>(t->view.scales, t->view.scales + ns));
    }
    t->device = Weight{format, rows, cols, t->d_data->get(),
                       t->d_scales ? t->d_scales->get() : nullptr};
    return t;
}

TEST_CASE("embedding equals the twin exactly for bf16 and f32 tables") {
    std::mt19937_64 rng(1);
    for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kF32, WeightFormat::kInt4G32}) {
        auto w = make_weight(rng, f, 97, 160);
        std::vector<int32_t> ids = {0, 96, 5, 5, 40};
        DeviceVec<int32_t> d_ids(ids);
        DeviceVec<float> out(ids.size() * 160);
        REQUIRE(kernels::embedding(w->device, d_ids.get(), ids.size(), out.get(), nullptr).ok());
        std::vector<float> want(ids.size() * 160);
        twin::embedding(w->view, ids.data(), ids.size(), want.data());
        check_close(out.download(), want, 0.0, 0.0, "embedding");  // Threshold: exact.
    }
}

TEST_CASE("rms_norm matches the twin within 1e-6 relative on random shapes") {
    std::mt19937_64 rng(2);
    for (int trial = 0; trial < 6; ++trial) {
        const int64_t rows = 1 + rng() % 9;
        const int64_t cols = 1 + rng() % 3000;
        auto x = random_floats(rng, rows * cols, -3.0f, 3.0f);
        auto w = random_floats(rng, cols, 0.5f, 1.5f);
        DeviceVec<float> dx(x), dw(w), out(rows * cols);
        REQUIRE(kernels::rms_norm(dx.get(), dw.get(), rows, cols, 1e-6f, out.get(), nullptr).ok());
        std::vector<float> want(rows * cols);
        twin::rms_norm_rows(x.data(), w.data(), rows, cols, 1e-6f, want.data());
        check_close(out.download(), want, 1e-6, 1e-6, "rms_norm");
    }
}

TEST_CASE("rope (neox, partial, interleaved, yarn mscale) matches the twin within 1e-5") {
    std::mt19937_64 rng(3);
    struct Case {
        int64_t head_dim, rot_dim;
        bool neox;
        float mscale;
    };
    for (const Case& c : {Case{64, 64, true, 1.0f}, Case{128, 64, true, 1.0f},
                          Case{64, 64, false, 1.0f}, Case{96, 32, true, 1.2f}}) {
        const int64_t tokens = 5, heads = 3;
        auto x = random_floats(rng, tokens * heads * c.head_dim);
        std::vector<int32_t> pos = {0, 1, 17, 4095, 100000};
        auto freq = cpu::rope_inv_freq(1e6, c.rot_dim);
        DeviceVec<float> dx(x);
        DeviceVec<int32_t> dp(pos);
        DeviceVec<double> df(freq);
        REQUIRE(kernels::rope(dx.get(), dp.get(), tokens, heads, c.head_dim, c.rot_dim, df.get(),
                              c.neox, c.mscale, nullptr)
                    .ok());
        twin::rope(x.data(), pos.data(), tokens, heads, c.head_dim, c.rot_dim, freq.data(),
                   c.neox, c.mscale);
        check_close(dx.download(), x, 1e-5, 1e-5, "rope");
    }
}

TEST_CASE("paged KV write and attention (prefill and decode) match the twin within 1e-4") {
    std::mt19937_64 rng(4);
    for (int64_t head_dim : {32, 64, 128}) {
        PagedKvLayout L{2, 2, static_cast<int32_t>(head_dim), 40};
        const int32_t q_heads = 6, max_blocks = 8, layer = 1;
        const std::vector<int32_t> lengths = {1, 16, 17, 100};
        // Blocks handed out in a shuffled order, as a real allocator would after churn.
        std::vector<int32_t> blocks(L.num_blocks);
        std::iota(blocks.begin(), blocks.end(), 0);
        std::shuffle(blocks.begin(), blocks.end(), rng);
        std::vector<int32_t> table(lengths.size() * max_blocks, -1);
        size_t next = 0;
        for (size_t s = 0; s < lengths.size(); ++s) {
            for (int32_t b = 0; b < kv_blocks_for(lengths[s]); ++b) {
                table[s * max_blocks + b] = blocks[next++];
            }
        }
        REQUIRE(check_block_table(L, table, max_blocks, lengths).ok());
        // Prefill: every position of every sequence in one batch.
        std::vector<int32_t> seq, pos;
        for (size_t s = 0; s < lengths.size(); ++s) {
            for (int32_t p = 0; p < lengths[s]; ++p) {
                seq.push_back(static_cast<int32_t>(s));
                pos.push_back(p);
            }
        }
        const int64_t T = seq.size();
        auto k = random_floats(rng, T * L.kv_heads * head_dim);
        auto v = random_floats(rng, T * L.kv_heads * head_dim);
        auto q = random_floats(rng, T * q_heads * head_dim);
        std::vector<float> pool(L.pool_floats(), 0.0f);
        DeviceVec<float> dk(k), dv(v), dq(q), dpool(pool), dout(T * q_heads * head_dim);
        DeviceVec<int32_t> dseq(seq), dpos(pos), dtable(table);
        REQUIRE(kernels::paged_kv_write(L, layer, dk.get(), dv.get(), dseq.get(), dpos.get(), T,
                                        dtable.get(), max_blocks, dpool.get(), nullptr)
                    .ok());
        twin::paged_kv_write(L, layer, k.data(), v.data(), seq.data(), pos.data(), T,
                             table.data(), max_blocks, pool.data());
        check_close(dpool.download(), pool, 0.0, 0.0, "paged kv write");  // Exact copy.
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        REQUIRE(kernels::paged_attention(L, layer, dq.get(), T, q_heads, dseq.get(), dpos.get(),
                                         dtable.get(), max_blocks, dpool.get(), scale,
                                         dout.get(), nullptr)
                    .ok());
        std::vector<float> want(T * q_heads * head_dim);
        twin::paged_attention(L, layer, q.data(), T, q_heads, seq.data(), pos.data(),
                              table.data(), max_blocks, pool.data(), scale, want.data());
        check_close(dout.download(), want, 1e-4, 1e-4, "paged attention");
    }
}

TEST_CASE("routing picks the twin's experts (ties to the lower index) and weights within 1e-6") {
    std::mt19937_64 rng(5);
    // 256 experts: 23 tokens a block (shared scratch), so 37 tokens take two blocks.
    for (const auto& [scoring_case, experts_case] :
         {std::pair{RouterScoring::kSoftmax, 64}, std::pair{RouterScoring::kSigmoid, 64},
          std::pair{RouterScoring::kSoftmax, 256}, std::pair{RouterScoring::kSigmoid, 256}}) {
        const RouterScoring scoring = scoring_case;
        const int32_t experts = experts_case;
        CAPTURE(experts);
        RouterParams p;
        p.scoring = scoring;
        p.experts = experts;
        p.top_k = 8;
        p.n_group = scoring == RouterScoring::kSigmoid ? 8 : 1;
        p.topk_group = 4;
        p.scaling_factor = scoring == RouterScoring::kSigmoid ? 2.5f : 1.0f;
        const int64_t T = 37;
        // Logits on a coarse grid, so many scores tie exactly.
        std::vector<float> logits(T * p.experts);
        for (float& l : logits) {
            l = static_cast<float>(static_cast<int>(rng() % 5)) * 0.5f;
        }
        // Tokens 0-2 hold a NaN, a +inf and a -inf logit: the kernel runs router_rule.h's scan
        // for them (a warp per token otherwise). The infinities route as the CPU does; a NaN
        // has no CPU answer to match (its softmax and scan order NaN their own way), only K
        // distinct experts.
        logits[3] = std::nanf("");
        logits[p.experts + 5] = std::numeric_limits<float>::infinity();
        logits[2 * p.experts + 7] = -std::numeric_limits<float>::infinity();
        std::vector<float> bias = random_floats(rng, p.experts, -0.01f, 0.01f);
        DeviceVec<float> dl(logits), db(bias), dw(T * p.top_k);
        DeviceVec<int32_t> di(T * p.top_k);
        const float* bias_ptr = scoring == RouterScoring::kSigmoid ? db.get() : nullptr;
        REQUIRE(kernels::route(dl.get(), bias_ptr, p, T, di.get(), dw.get(), nullptr).ok());
        std::vector<int32_t> idx(T * p.top_k);
        std::vector<float> w(T * p.top_k);
        twin::route(logits.data(), scoring == RouterScoring::kSigmoid ? bias.data() : nullptr, p,
                    T, idx.data(), w.data());
        std::vector<int32_t> got_idx = di.download();
        std::vector<int32_t> nan_row(got_idx.begin(), got_idx.begin() + p.top_k);
        std::sort(nan_row.begin(), nan_row.end());
        CHECK(std::adjacent_find(nan_row.begin(), nan_row.end()) == nan_row.end());
        CHECK(nan_row.front() >= 0);
        CHECK(nan_row.back() < p.experts);
        CHECK(std::equal(got_idx.begin() + p.top_k, got_idx.end(), idx.begin() + p.top_k));
        const std::vector<float> got = dw.download();
        for (size_t i = static_cast<size_t>(p.top_k); i < w.size(); ++i) {
            CAPTURE(i);
            CHECK(((std::isnan(got[i]) && std::isnan(w[i])) ||
                   std::abs(got[i] - w[i]) <= 1e-6 + 1e-5 * std::abs(w[i])));
        }
    }
}

TEST_CASE("permute, unpermute, silu_mul and add_bias_rows match the twins") {
    std::mt19937_64 rng(6);
    const int32_t E = 16, K = 4;
    const int64_t T = 23, H = 72;
    std::vector<int32_t> idx(T * K);
    for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> e(E);
        std::iota(e.begin(), e.end(), 0);
        std::shuffle(e.begin(), e.end(), rng);
        std::copy(e.begin(), e.begin() + K, idx.begin() + t * K);
    }
    auto x = random_floats(rng, T * H);
    auto w = random_floats(rng, T * K, 0.0f, 1.0f);
    DeviceVec<int32_t> di(idx), doff(E + 1), drow(T * K);
    DeviceVec<float> dx(x), dperm(T * K * H), dw(w);
    REQUIRE(kernels::permute(di.get(), T, K, E, dx.get(), H, doff.get(), drow.get(), dperm.get(),
                             nullptr)
                .ok());
    std::vector<int32_t> off(E + 1), row(T * K);
    std::vector<float> perm(T * K * H);
    twin::permute(idx.data(), T, K, E, x.data(), H, off.data(), row.data(), perm.data());
    CHECK(doff.download() == off);
    CHECK(drow.download() == row);
    check_close(dperm.download(), perm, 0.0, 0.0, "permute");  // Exact copies.
    auto y = random_floats(rng, T * K * H);
    auto base = random_floats(rng, T * H);
    DeviceVec<float> dy(y), dout(base);
    REQUIRE(kernels::unpermute(dy.get(), drow.get(), dw.get(), T, K, H, true, dout.get(), nullptr)
                .ok());
    twin::unpermute(y.data(), row.data(), w.data(), T, K, H, true, base.data());
    check_close(dout.download(), base, 1e-6, 1e-6, "unpermute");
    auto gate = random_floats(rng, 1000, -6.0f, 6.0f);
    auto up = random_floats(rng, 1000);
    DeviceVec<float> dg(gate), du(up), da(1000);
    REQUIRE(kernels::silu_mul(dg.get(), du.get(), 1000, da.get(), nullptr).ok());
    std::vector<float> act(1000);
    twin::silu_mul(gate.data(), up.data(), 1000, act.data());
    check_close(da.download(), act, 1e-6, 1e-6, "silu_mul");
    // The projection bias, broadcast over rows (GLM-4.5's q/k/v bias).
    auto rows = random_floats(rng, 7 * 96);
    auto bias = random_floats(rng, 96);
    DeviceVec<float> drows(rows), dbias(bias);
    REQUIRE(kernels::add_bias_rows(drows.get(), dbias.get(), 7, 96, nullptr).ok());
    CHECK_FALSE(kernels::add_bias_rows(drows.get(), dbias.get(), 7, 0, nullptr).ok());
    twin::add_bias_rows(rows.data(), bias.data(), 7, 96);
    check_close(drows.download(), rows, 0.0, 0.0, "add_bias_rows");  // One f32 add each.
}

TEST_CASE("gather_rows copies the indexed rows exactly, repeats included, like the twin") {
    std::mt19937_64 rng(11);
    const int64_t rows = 37, cols = 300;  // cols past one block of threads.
    auto x = random_floats(rng, rows * cols);
    const std::vector<int32_t> idx = {36, 0, 5, 5, 17, 0, 0, 0};  // A serving step's pattern.
    const int64_t n = static_cast<int64_t>(idx.size());
    DeviceVec<float> dx(x), dout(n * cols);
    DeviceVec<int32_t> di(idx);
    REQUIRE(kernels::gather_rows(dx.get(), di.get(), n, cols, dout.get(), nullptr).ok());
    CHECK(kernels::gather_rows(dx.get(), di.get(), 0, cols, dout.get(), nullptr).ok());
    CHECK_FALSE(kernels::gather_rows(dx.get(), di.get(), n, 0, dout.get(), nullptr).ok());
    std::vector<float> want(static_cast<size_t>(n * cols));
    twin::gather_rows(x.data(), idx.data(), n, cols, want.data());
    check_close(dout.download(), want, 0.0, 0.0, "gather_rows");  // Copies.
    CHECK(std::equal(want.begin(), want.begin() + cols, x.begin() + 36 * cols));
}

TEST_CASE("grouped matmul with fused dequant matches the twin for every format") {
    std::mt19937_64 rng(7);
    // Threshold: dequantized weights are exact on both sides; f32 accumulation in another order
    // gives |err| <~ cols * 2^-24 * sum|w x|, below 2e-4 + 1e-4 |y| for these sizes.
    const WeightFormat formats[] = {WeightFormat::kBF16, WeightFormat::kF16, WeightFormat::kF32,
                                    WeightFormat::kFP8E4M3Block128, WeightFormat::kInt8Row,
                                    WeightFormat::kInt4G32, WeightFormat::kInt4G128};
    for (WeightFormat f : formats) {
        // Wide rows too (2304 on the vector path, 1100 on the scalar one).
        for (int64_t cols : {256, 384, 1000, 44, 2304, 1100}) {
            if ((quant::int4_group_size(f) > 0 && cols % quant::int4_group_size(f) != 0)) {
                continue;
            }
            CAPTURE(quant::weight_format_name(f));
            CAPTURE(cols);
            const int64_t rows = 1 + rng() % 300;
            const int groups = 5;
            std::vector<std::unique_ptr<TestWeight>> ws;
            std::vector<Weight> views;
            std::vector<const void*> data;
            std::vector<const float*> scales;
            for (int g = 0; g < groups; ++g) {
                ws.push_back(make_weight(rng, f, rows, cols));
                views.push_back(ws.back()->view);
                data.push_back(ws.back()->device.data);
                scales.push_back(ws.back()->device.scales);
            }
            // Token counts per group, including empty groups and more than one tile; then fewer
            // rows than groups (a block row per row of x, empty groups first, between and last),
            // with x_rows given and not.
            for (const std::vector<int32_t>& offsets : {std::vector<int32_t>{0, 3, 3, 20, 21, 21},
                                                        std::vector<int32_t>{0, 0, 1, 1, 3, 3}}) {
                const int64_t T = offsets.back();
                auto x = random_floats(rng, T * cols);
                DeviceVec<const void*> dd(data);
                DeviceVec<const float*> ds(scales);
                DeviceVec<int32_t> doff(offsets);
                DeviceVec<float> dx(x);
                kernels::GroupedWeights gw{
                    f, rows, cols, groups, dd.get(), scales[0] != nullptr ? ds.get() : nullptr};
                std::vector<float> want(T * rows);
                twin::grouped_matmul(views, offsets.data(), x.data(), want.data());
                for (int64_t x_rows : {int64_t{0}, T}) {
                    CAPTURE(T);
                    CAPTURE(x_rows);
                    DeviceVec<float> dy(T * rows);
                    REQUIRE(
                        kernels::grouped_matmul(gw, doff.get(), dx.get(), dy.get(), nullptr, x_rows)
                            .ok());
                    check_close(dy.download(), want, 2e-4, 1e-4, "grouped matmul");
                }
            }
        }
    }
}

TEST_CASE("argmax and top-p sampling pick the twin's tokens") {
    std::mt19937_64 rng(8);
    const int64_t rows = 50, n = 32000;
    auto logits = random_floats(rng, rows * n, -8.0f, 8.0f);
    // Row 0 ties its maximum at two places: the lower index must win.
    logits[100] = 20.0f;
    logits[200] = 20.0f;
    std::vector<float> temp(rows), top_p(rows), u(rows);
    for (int64_t r = 0; r < rows; ++r) {
        temp[r] = r % 5 == 0 ? 0.0f : 0.3f + 0.1f * static_cast<float>(r % 7);
        top_p[r] = r % 3 == 0 ? 1.0f : 0.5f + 0.05f * static_cast<float>(r % 9);
        u[r] = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    }
    DeviceVec<float> dl(logits), dt(temp), dp(top_p), du(u);
    DeviceVec<int32_t> dmax(rows), dsample(rows);
    REQUIRE(kernels::argmax(dl.get(), rows, n, dmax.get(), nullptr).ok());
    REQUIRE(kernels::sample_top_p(dl.get(), rows, n, dt.get(), dp.get(), du.get(), dsample.get(),
                                  nullptr)
                .ok());
    const auto got_max = dmax.download();
    const auto got_sample = dsample.download();
    CHECK(got_max[0] == 100);
    for (int64_t r = 0; r < rows; ++r) {
        CAPTURE(r);
        CHECK(got_max[r] == twin::argmax(logits.data() + r * n, n));
        CHECK(got_sample[r] ==
              twin::sample_top_p(logits.data() + r * n, n, temp[r], top_p[r], u[r]));
    }
}

}  // namespace
}  // namespace edge::engine::cuda
