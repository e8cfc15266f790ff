// The CUDA backend and the device decoder as wholes: the backend's matmuls against the twin,
// greedy tokens of the fixture model on the CUDA backend against the CPU backend, graph replay
// against eager steps, health and which CUDA errors are sticky, and the NCCL communicator on
// the GPUs present.

#include <algorithm>
#include <random>
#include <functional>
#include <thread>

#include "engine/backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_decoder.h"
#include "engine/cuda/host/cpu_twins.h"
#include "engine/cuda/nccl_communicator.h"
#include "engine/model/loader.h"
#include "engine/quant/quantized_weight.h"
#include "tests/gpu/testing_gpu.h"

namespace edge::engine::cuda {
namespace {

using testing::check_close;
using testing::random_floats;

DeviceMemoryConfig small_arena() {
    DeviceMemoryConfig m;
    m.arena_bytes = int64_t{512} << 20;
    m.reserve_bytes = 0;
    return m;
}

TEST_CASE("cuda backend matmul and matmul_batch match the twin and it stays healthy") {
    CudaBackendOptions o;
    o.memory = small_arena();
    o.host_threads = 2;
    auto backend = create_cuda_backend(o);
    REQUIRE(backend.ok());
    Backend& b = **backend;
    CHECK(b.name() == "cuda");
    CHECK(b.supports(Op::kMatmul, WeightFormat::kInt4G32));
    std::mt19937_64 rng(11);
    std::vector<quant::QuantizedWeight> owned;
    for (WeightFormat f : {WeightFormat::kFP8E4M3Block128, WeightFormat::kInt4G32,
                           WeightFormat::kInt8Row}) {
        auto src = random_floats(rng, 200 * 256, -0.5f, 0.5f);
        auto q = quant::quantize(quant::SourceMatrix::f32(src.data(), 200, 256), f);
        REQUIRE(q.ok());
        owned.push_back(std::move(*q));
    }
    const int64_t n = 7, ldy = 210;
    auto x = random_floats(rng, n * 256);
    std::vector<MatmulJob> jobs;
    std::vector<std::vector<float>> ys(owned.size(), std::vector<float>(n * ldy, 0.0f));
    for (size_t i = 0; i < owned.size(); ++i) {
        jobs.push_back({&owned[i].view(), x.data(), n, ys[i].data(), ldy});
    }
    // A first job whose width is not a multiple of 8 (the scalar path) shifts the staging of the
    // others, which must stay aligned for their vector loads.
    auto odd_src = random_floats(rng, 30 * 44);
    const Weight odd{WeightFormat::kF32, 30, 44, odd_src.data(), nullptr};
    auto odd_x = random_floats(rng, 3 * 44);
    std::vector<float> odd_y(3 * 30);
    jobs.insert(jobs.begin(), MatmulJob{&odd, odd_x.data(), 3, odd_y.data(), 30});
    b.matmul_batch(jobs);
    b.matmul(owned[0].view(), x.data(), n, ys[0].data(), ldy);  // Again: the cached weight.
    {
        const int32_t odd_offsets[2] = {0, 3};
        std::vector<float> want(3 * 30);
        twin::grouped_matmul(std::span<const Weight>(&odd, 1), odd_offsets, odd_x.data(),
                             want.data());
        check_close(odd_y, want, 2e-4, 1e-4, "backend matmul, scalar path");
    }
    const int32_t offsets[2] = {0, static_cast<int32_t>(n)};
    for (size_t i = 0; i < owned.size(); ++i) {
        std::vector<float> want(n * 200);
        const Weight w = owned[i].view();
        twin::grouped_matmul(std::span<const Weight>(&w, 1), offsets, x.data(), want.data());
        std::vector<float> got;
        for (int64_t t = 0; t < n; ++t) {
            got.insert(got.end(), ys[i].begin() + t * ldy, ys[i].begin() + t * ldy + 200);
        }
        check_close(got, want, 2e-4, 1e-4, "backend matmul");
    }
    CHECK(b.health().ok());
    CHECK(cuda_device_health().ok());
}

TEST_CASE("sticky CUDA errors: every code after which the process must be relaunched") {
    // Those cuda_error_status() marks the device unhealthy for, so /readyz fails and the daemon
    // exits for systemd to restart it; MPS clients the server ended included.
    for (cudaError_t e : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorContained,
                          cudaErrorTensorMemoryLeak, cudaErrorMpsClientTerminated,
                          cudaErrorExternalDevice}) {
        CAPTURE(static_cast<int>(e));
        CHECK(cuda_error_is_sticky(e));
    }
    // Errors the process lives through: a bad call, memory pressure, an MPS server not reached.
    for (cudaError_t e : {cudaSuccess, cudaErrorInvalidValue, cudaErrorMemoryAllocation,
                          cudaErrorMpsConnectionFailed, cudaErrorMpsRpcFailure,
                          cudaErrorMpsServerNotReady, cudaErrorMpsMaxClientsReached}) {
        CAPTURE(static_cast<int>(e));
        CHECK_FALSE(cuda_error_is_sticky(e));
    }
}

// Greedy decode of `steps` tokens after a prompt, on the named backend.
std::vector<TokenId> greedy(const std::string& backend, int steps, std::vector<float>* first) {
    LoadOptions lo;
    lo.threads = 2;
    lo.max_slots = 2;
    lo.max_context = 256;
    lo.backend = backend;
    auto model = load_model(EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe", lo);
    REQUIRE(model.ok());
    CausalLM& m = **model;
    auto slot = m.acquire_slot();
    REQUIRE(slot.ok());
    std::vector<TokenId> prompt = {510, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114};
    std::vector<TokenId> out;
    std::vector<float> logits;
    int32_t pos = 0;
    std::vector<TokenId> chunk = prompt;
    for (int i = 0; i < steps; ++i) {
        SequenceChunk c{*slot, pos, chunk, false};
        REQUIRE(m.forward(std::span<const SequenceChunk>(&c, 1), &logits).ok());
        if (i == 0) {
            *first = logits;
        }
        pos += static_cast<int32_t>(chunk.size());
        const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
        out.push_back(static_cast<TokenId>(best));
        chunk = {static_cast<TokenId>(best)};
    }
    return out;
}

TEST_CASE("the fixture model gives the CPU backend's greedy tokens on the CUDA backend") {
    std::vector<float> cpu_logits, cuda_logits;
    const auto cpu = greedy("cpu", 24, &cpu_logits);
    const auto gpu = greedy("cuda", 24, &cuda_logits);
    CHECK(gpu == cpu);
    // Logits of the prompt's last token: same weights, f32 both sides; 2e-3 absolute covers the
    // CPU kernels' activation rounding (quant_kernels.h) and accumulation order.
    check_close(cuda_logits, cpu_logits, 2e-3, 1e-3, "prompt logits");
}

DecoderShape small_shape(WeightFormat f) {
    DecoderShape s;
    s.hidden = 256;
    s.layers = 2;
    s.experts = 8;
    s.top_k = 2;
    s.moe_inter = 128;
    s.heads = 4;
    s.kv_heads = 2;
    s.head_dim = 64;
    s.vocab = 1000;
    s.batch = 3;
    s.context = 20;
    s.max_context = 128;
    s.expert_format = f;
    return s;
}

TEST_CASE("a decode step replayed as a CUDA graph gives the eager step's tokens") {
    for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kFP8E4M3Block128,
                           WeightFormat::kInt4G32}) {
        auto eager = DeviceDecoder::create(small_shape(f), small_arena(), 5);
        auto graph = DeviceDecoder::create(small_shape(f), small_arena(), 5);
        REQUIRE(eager.ok());
        REQUIRE(graph.ok());
        for (int i = 0; i < 6; ++i) {
            REQUIRE((*eager)->step().ok());
            REQUIRE((*graph)->run_graph(1).ok());
            auto a = (*eager)->last_tokens();
            auto b = (*graph)->last_tokens();
            REQUIRE(a.ok());
            REQUIRE(b.ok());
            CHECK(*a == *b);
        }
        auto stats = (*graph)->run_graph(4);
        REQUIRE(stats.ok());
        CHECK(stats->seconds_per_step > 0.0);
        CHECK(stats->bytes_per_step > 0);
    }
}

using Fail = std::function<void(const std::string&)>;

// Runs body(rank, its communicator, fail) on one thread per rank, each on its GPU, and checks
// that no rank called fail.
template <class Body>
void on_every_rank(std::vector<std::unique_ptr<shard::Communicator>>& comms, Body&& body) {
    const auto ranks = static_cast<int32_t>(comms.size());
    std::vector<std::string> errors(ranks);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
            cudaSetDevice(r);
            const Fail fail = [&](const std::string& what) { errors[r] += what + "; "; };
            body(r, *comms[r], fail);
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    for (int32_t r = 0; r < ranks; ++r) {
        CAPTURE(r);
        CHECK(errors[r].empty());
    }
}

TEST_CASE("NCCL communicators: all-to-all-v, all-gather, all-reduce in rank order, barrier") {
    const int32_t ranks = std::min(cuda_device_count(), 4);
    if (ranks < 2) {
        MESSAGE("one GPU: the collectives run on a single rank only");
    }
    auto comms = create_nccl_communicators(ranks);
    REQUIRE(comms.ok());
    on_every_rank(*comms, [&](int32_t r, shard::Communicator& c, const Fail& fail) {
        // all_to_all_v: rank r sends (q + 1) * (r + 1) bytes of value r to rank q.
        std::vector<int64_t> send_counts(ranks), recv_counts(ranks);
        for (int32_t q = 0; q < ranks; ++q) {
            send_counts[q] = (q + 1) * (r + 1);
            recv_counts[q] = (r + 1) * (q + 1);
        }
        int64_t send_total = 0, recv_total = 0;
        for (int32_t q = 0; q < ranks; ++q) {
            send_total += send_counts[q];
            recv_total += recv_counts[q];
        }
        std::vector<uint8_t> send(send_total, static_cast<uint8_t>(r));
        testing::DeviceVec<uint8_t> ds(send), dr(recv_total);
        if (!c.all_to_all_v(ds.get(), send_counts, dr.get(), recv_counts).ok()) {
            fail("all_to_all_v");
        }
        auto got = dr.download();
        int64_t at = 0;
        for (int32_t q = 0; q < ranks; ++q) {
            for (int64_t i = 0; i < recv_counts[q]; ++i) {
                if (got[at++] != q) {
                    fail("all_to_all_v data");
                }
            }
        }
        // all_gather of 4 floats.
        std::vector<float> mine(4, static_cast<float>(r));
        testing::DeviceVec<float> dm(mine), dg(4 * ranks);
        if (!c.all_gather(dm.get(), 16, dg.get()).ok()) {
            fail("all_gather");
        }
        auto gathered = dg.download();
        for (int32_t q = 0; q < ranks; ++q) {
            if (gathered[4 * q] != static_cast<float>(q)) {
                fail("all_gather data");
            }
        }
        // all_reduce_sum: bit-identical on every rank, equal to the rank-order sum.
        std::vector<float> vals = {0.1f * (r + 1), 1e8f * (r % 2 == 0 ? 1 : -1), 3.0f};
        testing::DeviceVec<float> dv(vals);
        if (!c.all_reduce_sum(std::span<float>(dv.get(), 3)).ok()) {
            fail("all_reduce_sum");
        }
        auto sum = dv.download();
        float want = 0.1f;
        for (int32_t q = 1; q < ranks; ++q) {
            want += 0.1f * (q + 1);
        }
        if (sum[0] != want) {
            fail("all_reduce_sum order");
        }
        if (!c.barrier().ok()) {
            fail("barrier");
        }
    });
}

TEST_CASE("NCCL communicators: one rank's bad arguments are an error on every rank, no hang") {
    // Rank 1 (rank 0 alone on one GPU) passes spans of the wrong size, then a negative
    // all_gather size; every rank must return an error instead of waiting for it, and the
    // group must still work afterwards (argument errors never abort it).
    const int32_t ranks = std::min(cuda_device_count(), 4);
    auto comms = create_nccl_communicators(ranks);
    REQUIRE(comms.ok());
    const int32_t culprit = ranks > 1 ? 1 : 0;
    on_every_rank(*comms, [&](int32_t r, shard::Communicator& c, const Fail& fail) {
        const bool bad = r == culprit;
        std::vector<int64_t> counts(bad ? ranks - 1 : ranks, 0), got(ranks);
        Status a2a = c.all_to_all_v(nullptr, counts, nullptr, counts);
        if (a2a.code() != StatusCode::kInvalidArgument) {
            fail("all_to_all_v: " + a2a.to_string());
        }
        Status ex = c.exchange_counts(counts, got);
        if (ex.code() != StatusCode::kInvalidArgument) {
            fail("exchange_counts: " + ex.to_string());
        }
        testing::DeviceVec<float> dm(std::vector<float>(4, 1.0f)), dg(4 * ranks);
        Status ag = c.all_gather(dm.get(), bad ? -16 : 16, dg.get());
        if (ag.code() != StatusCode::kInvalidArgument) {
            fail("all_gather: " + ag.to_string());
        }
        if (!c.barrier().ok()) {
            fail("barrier after the errors");
        }
        if (!c.all_gather(dm.get(), 16, dg.get()).ok()) {
            fail("all_gather after the errors");
        }
    });
}

}  // namespace
}  // namespace edge::engine::cuda
