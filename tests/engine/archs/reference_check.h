#pragma once

// Shared checks of a CausalLM against a fixture's reference.json (tests/fixtures/README.md):
// greedy tokens exact, step-0 logits and every step's top-5 within 1e-4, one prompt at a time or
// all prompts batched, and the teacher-forced batch. Adjacent top-5 entries whose reference gap
// is under 2e-4 (the README's top5_order_exceptions) are compared by value, not order.

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/causal_lm.h"

namespace edge::engine::testing {

inline constexpr double kRefTolerance = 1e-4;

using Top5 = std::vector<std::pair<TokenId, double>>;

struct RefPrompt {
    std::string key;
    std::vector<TokenId> prompt;
    std::vector<TokenId> greedy;
    std::vector<Top5> step_top5;
    std::vector<double> step0_logits;
    std::vector<Top5> prompt_top5;  // Logits after each prompt position (its next token).
    std::vector<TokenId> teacher_ids;
    std::vector<Top5> teacher_top5;
};

inline std::vector<Top5> read_top5(const boost::json::value& v) {
    std::vector<Top5> out;
    for (const auto& row : v.as_array()) {
        Top5 r;
        for (const auto& e : row.as_array()) {
            r.emplace_back(static_cast<TokenId>(e.as_array()[0].to_number<int64_t>()),
                           e.as_array()[1].to_number<double>());
        }
        out.push_back(r);
    }
    return out;
}

inline std::vector<TokenId> read_ids(const boost::json::value& v) {
    std::vector<TokenId> out;
    for (const auto& e : v.as_array()) {
        out.push_back(static_cast<TokenId>(e.to_number<int64_t>()));
    }
    return out;
}

inline std::string fixture_dir(const std::string& name) {
    return std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/" + name;
}

inline std::vector<RefPrompt> read_reference(const std::string& dir) {
    std::ifstream in(dir + "/reference.json");
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    boost::json::value root = boost::json::parse(ss.str());
    std::vector<RefPrompt> out;
    for (const auto& kv : root.at("prompts").as_object()) {
        const auto& p = kv.value().as_object();
        RefPrompt pr;
        pr.key = std::string(kv.key());
        pr.prompt = read_ids(p.at("prompt_ids"));
        pr.greedy = read_ids(p.at("greedy_tokens"));
        pr.step_top5 = read_top5(p.at("step_top5"));
        for (const auto& e : p.at("step0_logits").as_array()) {
            pr.step0_logits.push_back(e.to_number<double>());
        }
        if (const auto* pt = p.if_contains("prompt_position_top5")) {
            pr.prompt_top5 = read_top5(*pt);
        }
        if (const auto* tf = p.if_contains("teacher_forced")) {
            pr.teacher_ids = read_ids(tf->at("ids"));
            pr.teacher_top5 = read_top5(tf->at("position_top5"));
        }
        out.push_back(pr);
    }
    return out;
}

inline TokenId argmax_of(const float* l, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
        if (l[i] > l[best]) {
            best = i;
        }
    }
    return static_cast<TokenId>(best);
}

inline void check_top5(const float* l, const Top5& ref, const std::string& what) {
    for (const auto& [id, value] : ref) {
        INFO(what << " id " << id << " got " << l[id] << " want " << value);
        CHECK(std::fabs(l[id] - value) <= kRefTolerance);
    }
    for (size_t j = 1; j < ref.size(); ++j) {
        if (ref[j - 1].second - ref[j].second >= 2e-4) {
            INFO(what << " order at rank " << j);
            CHECK(l[ref[j - 1].first] >= l[ref[j].first]);
        }
    }
}

struct RefRun {
    std::vector<TokenId> tokens;
    std::vector<std::vector<float>> step_logits;
};

// Prefill then greedy steps, every prompt in one batch per step or one prompt after the other.
inline std::vector<RefRun> run_greedy(CausalLM& model, const std::vector<RefPrompt>& prompts,
                                      bool batched) {
    const int64_t vocab = model.spec().vocab_size;
    std::vector<RefRun> runs(prompts.size());
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
            runs[which[b]].tokens.push_back(argmax_of(l, vocab));
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

inline void check_runs(const std::vector<RefPrompt>& prompts, const std::vector<RefRun>& runs) {
    for (size_t i = 0; i < prompts.size(); ++i) {
        const RefPrompt& p = prompts[i];
        INFO("prompt " << p.key);
        CHECK(runs[i].tokens == p.greedy);
        double max_diff = 0.0;
        for (size_t v = 0; v < p.step0_logits.size(); ++v) {
            max_diff = std::max(max_diff, std::fabs(runs[i].step_logits[0][v] - p.step0_logits[v]));
        }
        INFO("max |step0 logit diff| " << max_diff);
        CHECK(max_diff <= kRefTolerance);
        for (size_t s = 0; s < p.step_top5.size() && s < runs[i].step_logits.size(); ++s) {
            check_top5(runs[i].step_logits[s].data(), p.step_top5[s], "step " + std::to_string(s));
        }
    }
}

inline void check_teacher_forced(CausalLM& model, const std::vector<RefPrompt>& prompts) {
    for (const RefPrompt& p : prompts) {
        if (p.teacher_ids.empty()) {
            continue;
        }
        auto slot = model.acquire_slot();
        REQUIRE(slot.ok());
        SequenceChunk ch{*slot, 0, p.teacher_ids, true};
        std::vector<float> logits;
        REQUIRE(model.forward({&ch, 1}, &logits).ok());
        const int64_t vocab = model.spec().vocab_size;
        REQUIRE(logits.size() == p.teacher_ids.size() * vocab);
        for (size_t pos = 0; pos < p.teacher_top5.size(); ++pos) {
            check_top5(logits.data() + pos * vocab, p.teacher_top5[pos],
                       "position " + std::to_string(pos));
        }
        model.release_slot(*slot);
    }
}

}  // namespace edge::engine::testing
