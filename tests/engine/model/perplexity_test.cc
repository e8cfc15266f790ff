// Perplexity of fortunes-qwen3-moe on its held-out eval.txt with the fixture's protocol (142
// chunks of 256 tokens, each from position 0, scoring the second half): 58.1875 in PyTorch f32 and
// llama.cpp. The token ids come from make_eval_ids.py (checked there against the fixture's
// tokenizer cases and token count), so this test needs no tokenizer.

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>

#include "engine/model/loader.h"

namespace edge::engine {
namespace {

double chunk_nll(CausalLM& model, std::span<const TokenId> chunk, int64_t* count) {
    const int64_t vocab = model.spec().vocab_size;
    auto slot = model.acquire_slot();
    REQUIRE(slot.ok());
    SequenceChunk ch{*slot, 0, chunk, true};
    std::vector<float> logits;
    Status st = model.forward({&ch, 1}, &logits);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    model.release_slot(*slot);
    double nll = 0.0;
    const size_t n = chunk.size();
    for (size_t pos = n / 2; pos + 1 < n; ++pos) {
        const float* l = logits.data() + pos * vocab;
        double mx = l[0];
        for (int64_t v = 1; v < vocab; ++v) {
            mx = std::max(mx, static_cast<double>(l[v]));
        }
        double sum = 0.0;
        for (int64_t v = 0; v < vocab; ++v) {
            sum += std::exp(static_cast<double>(l[v]) - mx);
        }
        nll += mx + std::log(sum) - l[chunk[pos + 1]];
        ++*count;
    }
    return nll;
}

TEST_CASE("fortunes-qwen3-moe eval perplexity is 58.1875") {
    std::ifstream in(std::string(EDGE_SOURCE_DIR) + "/tests/engine/model/fortunes_eval_ids.txt");
    REQUIRE(in.good());
    std::vector<TokenId> ids;
    for (TokenId t; in >> t;) {
        ids.push_back(t);
    }
    REQUIRE(ids.size() == 36400);
    LoadOptions o;
    o.threads = 2;
    o.max_slots = 1;
    o.max_context = 256;
    auto model = load_model(std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/fortunes-qwen3-moe", o);
    REQUIRE(model.ok());
    constexpr size_t kChunk = 256;
    double nll = 0.0;
    int64_t count = 0;
    for (size_t c = 0; c + kChunk <= ids.size(); c += kChunk) {
        nll += chunk_nll(**model, std::span<const TokenId>(ids).subspan(c, kChunk), &count);
    }
    CHECK(count == 18034);
    const double ppl = std::exp(nll / static_cast<double>(count));
    INFO("perplexity " << ppl);
    CHECK(std::fabs(ppl / 58.18747043627912 - 1.0) <= 1e-4);
}

}  // namespace
}  // namespace edge::engine
