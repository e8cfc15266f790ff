// A sticky device fault reaches the requests the engine is running: the real engine on the
// fixture checkpoint (CPU backend), a fault reported to the process-wide device health while a
// request is generating (what the CUDA backend does on a lost context), and the request ends with
// FinishReason::kError naming the fault instead of tokens sampled from garbage; requests
// submitted afterwards fail the same way.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "engine/backend.h"
#include "engine/engine.h"

namespace edge::engine {
namespace {

const std::string kMicro = EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe";

ModelConfig micro_model() {
    ModelConfig m;
    m.name = "micro";
    m.path = kMicro;
    return m;
}

// Reports `fault` on the first delta it receives (when `inject`), then records the finish.
class FaultSink final : public GenerationSink {
  public:
    explicit FaultSink(bool inject) : inject_(inject) {}
    void on_delta(TokenDelta delta) override {
        std::lock_guard<std::mutex> lock(mu_);
        deltas_ += 1;
        if (inject_ && deltas_ == 1) {
            report_device_fault(unavailable_error("CUDA device lost: injected by the test"));
        }
    }
    void on_finish(Finish finish) override {
        std::lock_guard<std::mutex> lock(mu_);
        finish_ = finish;
        done_ = true;
        cv_.notify_all();
    }
    // The finish, once it came (false after 60 s: the test fails instead of hanging).
    bool wait(Finish* out, int* deltas) {
        std::unique_lock<std::mutex> lock(mu_);
        if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return done_; })) {
            return false;
        }
        *out = finish_;
        *deltas = deltas_;
        return true;
    }

  private:
    bool inject_;
    std::mutex mu_;
    std::condition_variable cv_;
    int deltas_ = 0;
    bool done_ = false;
    Finish finish_;
};

GenerateRequest greedy_request(int max_tokens) {
    GenerateRequest r;
    r.model = "micro";
    r.prompt = std::vector<TokenId>{1, 2, 3, 4};
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    return r;
}

TEST_CASE("a device fault during generation ends the running request with the fault") {
    clear_reported_device_fault_for_testing();
    REQUIRE(device_health().ok());
    EngineConfig config;
    config.threads = 1;
    config.backend = "cpu";
    config.max_batch_sequences = 4;
    config.kv_cache_bytes = 8 << 20;
    config.models.push_back(micro_model());
    auto engine = create_engine(config);
    REQUIRE_MESSAGE(engine.ok(), engine.status().to_string());

    auto sink = std::make_shared<FaultSink>(true);
    auto handle = (*engine)->submit(greedy_request(64), sink);
    REQUIRE(handle.ok());
    Finish finish;
    int deltas = 0;
    const bool finished = sink->wait(&finish, &deltas);
    const Status health = device_health();
    // A request after the fault fails too (queued work never samples from a dead device).
    auto late_sink = std::make_shared<FaultSink>(false);
    Finish late;
    int late_deltas = 0;
    bool late_finished = false;
    if (auto h = (*engine)->submit(greedy_request(8), late_sink); h.ok()) {
        late_finished = late_sink->wait(&late, &late_deltas);
    }
    clear_reported_device_fault_for_testing();  // Before any check can leave it set.
    REQUIRE(finished);
    CHECK_FALSE(health.ok());
    CHECK(finish.reason == FinishReason::kError);
    CHECK(finish.error.code() == StatusCode::kUnavailable);
    CHECK_MESSAGE(finish.error.message().find("CUDA device lost: injected") != std::string::npos,
                  finish.error.to_string());
    CHECK(deltas >= 1);
    CHECK(deltas < 64);  // Stopped at the fault, not after max_tokens.
    REQUIRE(late_finished);
    CHECK(late.reason == FinishReason::kError);
    CHECK(late_deltas == 0);
}

TEST_CASE("resolve_backend: cpu, auto and cuda on this machine, other names rejected") {
    const auto names = available_backends();
    const bool has_cuda = std::find(names.begin(), names.end(), "cuda") != names.end();
    CHECK(*resolve_backend("cpu") == "cpu");
    CHECK(*resolve_backend("auto") == (has_cuda ? "cuda" : "cpu"));
    auto cuda = resolve_backend("cuda");
    if (has_cuda) {
        CHECK(*cuda == "cuda");
    } else {
        REQUIRE_FALSE(cuda.ok());
        CHECK((cuda.status().code() == StatusCode::kUnavailable ||
               cuda.status().code() == StatusCode::kNotFound));
        CHECK(cuda.status().message().find("engine.backend is \"cuda\"") != std::string::npos);
        // The engine refuses it at creation too, before loading anything.
        EngineConfig config;
        config.backend = "cuda";
        config.models.push_back(micro_model());
        auto engine = create_engine(config);
        REQUIRE_FALSE(engine.ok());
        CHECK(engine.status().message().find("engine.backend") != std::string::npos);
    }
    auto bad = resolve_backend("tpu");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace edge::engine
