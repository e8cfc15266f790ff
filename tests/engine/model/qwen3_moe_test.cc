// Qwen3-MoE against the fixtures' reference outputs (llama.cpp, F32, cross-checked in float64):
// greedy tokens exact, logits within 1e-4, one prompt at a time and all prompts in one batch.

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/model/loader.h"

namespace edge::engine {
namespace {

namespace json = boost::json;

constexpr double kTolerance = 1e-4;  // The fixtures' README: f32 engine on bf16 weights.

struct Prompt {
    std::string key;
    std::vector<TokenId> prompt;
    std::vector<TokenId> greedy;
    std::vector<std::vector<std::pair<TokenId, double>>> step_top5;
    std::vector<double> step0_logits;
    std::vector<TokenId> teacher_ids;  // Empty when the fixture has no teacher-forced batch.
    std::vector<std::vector<std::pair<TokenId, double>>> teacher_top5;
};

std::vector<std::vector<std::pair<TokenId, double>>> read_top5(const json::value& v) {
    std::vector<std::vector<std::pair<TokenId, double>>> out;
    for (const json::value& row : v.as_array()) {
        std::vector<std::pair<TokenId, double>> r;
        for (const json::value& e : row.as_array()) {
            r.emplace_back(static_cast<TokenId>(e.as_array()[0].to_number<int64_t>()),
                           e.as_array()[1].to_number<double>());
        }
        out.push_back(r);
    }
    return out;
}

std::vector<TokenId> read_ids(const json::value& v) {
    std::vector<TokenId> out;
    for (const json::value& e : v.as_array()) {
        out.push_back(static_cast<TokenId>(e.to_number<int64_t>()));
    }
    return out;
}

std::vector<Prompt> read_reference(const std::string& dir) {
    std::ifstream in(dir + "/reference.json");
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    json::value root = json::parse(ss.str());
    std::vector<Prompt> out;
    for (const auto& kv : root.at("prompts").as_object()) {
        const json::object& p = kv.value().as_object();
        Prompt pr;
        pr.key = std::string(kv.key());
        pr.prompt = read_ids(p.at("prompt_ids"));
        pr.greedy = read_ids(p.at("greedy_tokens"));
        pr.step_top5 = read_top5(p.at("step_top5"));
        for (const json::value& e : p.at("step0_logits").as_array()) {
            pr.step0_logits.push_back(e.to_number<double>());
        }
        if (const json::value* tf = p.if_contains("teacher_forced")) {
            pr.teacher_ids = read_ids(tf->at("ids"));
            pr.teacher_top5 = read_top5(tf->at("position_top5"));
        }
        out.push_back(pr);
    }
    return out;
}

TokenId argmax(const float* l, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
        if (l[i] > l[best]) {
            best = i;
        }
    }
    return static_cast<TokenId>(best);
}

// Top-5 ids must match in order and their logits within tolerance.
void check_top5(const float* l, const std::vector<std::pair<TokenId, double>>& ref,
                const std::string& what) {
    for (const auto& [id, value] : ref) {
        INFO(what << " id " << id);
        CHECK(std::fabs(l[id] - value) <= kTolerance);
    }
    for (size_t j = 1; j < ref.size(); ++j) {
        CHECK(l[ref[j - 1].first] >= l[ref[j].first]);
    }
}

struct Run {
    std::vector<TokenId> tokens;
    std::vector<std::vector<float>> step_logits;
};

// Runs every prompt at once (batched = true: one forward per step for all prompts) or one after
// the other, prefill then `steps` greedy steps.
std::vector<Run> run_greedy(CausalLM& model, const std::vector<Prompt>& prompts, bool batched) {
    const int64_t vocab = model.spec().vocab_size;
    std::vector<Run> runs(prompts.size());
    std::vector<int32_t> slots;
    for (size_t i = 0; i < prompts.size(); ++i) {
        auto slot = model.acquire_slot();
        REQUIRE(slot.ok());
        slots.push_back(*slot);
    }
    auto step = [&](const std::vector<size_t>& which, bool prefill) {
        std::vector<SequenceChunk> batch;
        std::vector<TokenId> last(prompts.size());
        for (size_t i : which) {
            SequenceChunk ch;
            ch.slot = slots[i];
            ch.start_pos = model.slot_length(slots[i]);
            if (prefill) {
                ch.tokens = prompts[i].prompt;
            } else {
                last[i] = runs[i].tokens.back();
                ch.tokens = std::span<const TokenId>(&last[i], 1);
            }
            batch.push_back(ch);
        }
        std::vector<float> logits;
        Status st = model.forward(batch, &logits);
        REQUIRE_MESSAGE(st.ok(), st.to_string());
        REQUIRE(logits.size() == which.size() * vocab);
        for (size_t b = 0; b < which.size(); ++b) {
            const float* l = logits.data() + b * vocab;
            runs[which[b]].step_logits.emplace_back(l, l + vocab);
            runs[which[b]].tokens.push_back(argmax(l, vocab));
        }
    };
    const size_t steps = prompts[0].greedy.size();
    if (batched) {
        std::vector<size_t> all;
        for (size_t i = 0; i < prompts.size(); ++i) {
            all.push_back(i);
        }
        step(all, true);
        for (size_t s = 1; s < steps; ++s) {
            step(all, false);
        }
    } else {
        for (size_t i = 0; i < prompts.size(); ++i) {
            step({i}, true);
            for (size_t s = 1; s < steps; ++s) {
                step({i}, false);
            }
        }
    }
    for (int32_t s : slots) {
        model.release_slot(s);
    }
    return runs;
}

void check_runs(const std::vector<Prompt>& prompts, const std::vector<Run>& runs) {
    for (size_t i = 0; i < prompts.size(); ++i) {
        const Prompt& p = prompts[i];
        INFO("prompt " << p.key);
        CHECK(runs[i].tokens == p.greedy);
        double max_diff = 0.0;
        for (size_t v = 0; v < p.step0_logits.size(); ++v) {
            max_diff = std::max(max_diff, std::fabs(runs[i].step_logits[0][v] - p.step0_logits[v]));
        }
        INFO("max |step0 logit diff| " << max_diff);
        CHECK(max_diff <= kTolerance);
        for (size_t s = 0; s < p.step_top5.size() && s < runs[i].step_logits.size(); ++s) {
            check_top5(runs[i].step_logits[s].data(), p.step_top5[s], "step " + std::to_string(s));
        }
    }
}

std::unique_ptr<CausalLM> load(const std::string& name, int threads) {
    LoadOptions options;
    options.threads = threads;
    options.max_slots = 4;
    options.max_context = 512;
    auto model = load_model(std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/" + name, options);
    REQUIRE_MESSAGE(model.ok(), model.status().to_string());
    return std::move(model).value();
}

void check_fixture(const std::string& name, int threads) {
    auto prompts = read_reference(std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/" + name);
    auto model = load(name, threads);
    SUBCASE("one prompt at a time") { check_runs(prompts, run_greedy(*model, prompts, false)); }
    SUBCASE("all prompts batched") { check_runs(prompts, run_greedy(*model, prompts, true)); }
    SUBCASE("teacher-forced batch") {
        for (const Prompt& p : prompts) {
            if (p.teacher_ids.empty()) {
                continue;
            }
            auto slot = model->acquire_slot();
            REQUIRE(slot.ok());
            SequenceChunk ch{*slot, 0, p.teacher_ids, true};
            std::vector<float> logits;
            REQUIRE(model->forward({&ch, 1}, &logits).ok());
            const int64_t vocab = model->spec().vocab_size;
            REQUIRE(logits.size() == p.teacher_ids.size() * vocab);
            for (size_t pos = 0; pos < p.teacher_top5.size(); ++pos) {
                check_top5(logits.data() + pos * vocab, p.teacher_top5[pos],
                           "position " + std::to_string(pos));
            }
            model->release_slot(*slot);
        }
    }
}

TEST_CASE("micro-qwen3-moe matches the reference / 1 thread") { check_fixture("micro-qwen3-moe", 1); }
TEST_CASE("micro-qwen3-moe matches the reference / 2 threads") {
    check_fixture("micro-qwen3-moe", 2);
}
TEST_CASE("fortunes-qwen3-moe matches the reference") { check_fixture("fortunes-qwen3-moe", 2); }

TEST_CASE("spec reports the checkpoint") {
    auto model = load("micro-qwen3-moe", 1);
    const ModelSpec& s = model->spec();
    CHECK(s.architecture == "Qwen3MoeForCausalLM");
    CHECK(s.vocab_size == 512);
    CHECK(s.max_context == 512);
    CHECK(s.eos_token_ids == std::vector<TokenId>{509});
    CHECK(s.bos_token_id == 509);
    CHECK(s.version.size() == 64);
    CHECK(s.weight_bytes == 625408 * 2);
    CHECK(s.kv_bytes_per_token == 2 * 2 * 2 * 32 * 4);
    auto again = load("micro-qwen3-moe", 2);
    CHECK(again->spec().version == s.version);
    auto other = load("fortunes-qwen3-moe", 1);
    CHECK(other->spec().version != s.version);
}

}  // namespace
}  // namespace edge::engine
