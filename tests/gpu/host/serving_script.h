#pragma once

// The scheduler-like script the serving tests run on a whole-step CausalLM (the device's, or its
// CPU twin's) next to the CPU model: two prompts in one forward (81 rows, one chunk wanting
// every row's logits: five steps, each ending at the 16 logits rows a step computes at most with
// 4 slots, so the LM head's gathered rows span steps), decode of both slots (bucket 2) then one
// (bucket 1, no padding), the prefix cache with a block shared and written (copy on write next
// to the block's owner), then bad input. After every forward the logits must agree within
// `tol` (absolute and relative) with the same argmax, and the lengths must be equal.
// Test-only; header-only so the cuda_host and gpu suites share it.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/model/causal_lm.h"
#include "engine/model/loader.h"

namespace edge::engine::cuda::testing {

inline const std::string kMicroQwen3 = EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe";
inline const std::string kMicroGlm4 = EDGE_SOURCE_DIR "/tests/fixtures/micro-glm4-moe";

// What both models are loaded with (backend set by the caller).
inline LoadOptions serving_script_options(const std::string& backend) {
    LoadOptions lo;
    lo.threads = 2;
    lo.backend = backend;
    lo.max_slots = 4;  // max_rows 64: an 81-token batch runs as two steps.
    lo.max_context = 256;
    lo.kv_cache_bytes = 1 << 20;
    return lo;
}

inline TokenId row_argmax(const std::vector<float>& logits, size_t row, int32_t vocab) {
    const auto begin = logits.begin() + static_cast<int64_t>(row) * vocab;
    return static_cast<TokenId>(std::max_element(begin, begin + vocab) - begin);
}

// Runs `batch` on both; checks logits, argmaxes and lengths; returns the CPU's logits.
inline std::vector<float> forward_both(CausalLM& cpu, CausalLM& dev,
                                       const std::vector<SequenceChunk>& batch, double tol,
                                       const char* what) {
    INFO(what);
    std::vector<float> want, got;
    Status c = cpu.forward(batch, &want);
    REQUIRE_MESSAGE(c.ok(), c.to_string());
    // Stale values where the device forward must write every row (it does not zero-fill).
    got.assign(want.size(), std::nanf(""));
    Status d = dev.forward(batch, &got);
    REQUIRE_MESSAGE(d.ok(), d.to_string());
    REQUIRE(got.size() == want.size());
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(static_cast<double>(got[i]) - want[i]) -
                           tol * std::fabs(static_cast<double>(want[i]));
        worst = std::isnan(got[i]) ? INFINITY : std::max(worst, err);
    }
    CHECK(worst <= tol);
    const int32_t V = cpu.spec().vocab_size;
    for (size_t r = 0; r < want.size() / static_cast<size_t>(V); ++r) {
        CAPTURE(r);
        CHECK(row_argmax(got, r, V) == row_argmax(want, r, V));
    }
    for (const SequenceChunk& ch : batch) {
        CHECK(dev.slot_length(ch.slot) == cpu.slot_length(ch.slot));
    }
    return want;
}

inline void run_serving_script(CausalLM& cpu, CausalLM& dev, double tol) {
    CHECK(dev.spec().version == cpu.spec().version);
    CHECK(dev.kv_block_tokens() == cpu.kv_block_tokens());
    const int32_t V = cpu.spec().vocab_size;
    const int32_t a = *cpu.acquire_slot(), b = *cpu.acquire_slot();
    REQUIRE(*dev.acquire_slot() == a);
    REQUIRE(*dev.acquire_slot() == b);
    const std::vector<TokenId> pa = {510, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114};
    std::vector<TokenId> pb(70);
    for (size_t i = 0; i < pb.size(); ++i) {
        pb[i] = static_cast<TokenId>((i * 37 + 11) % 500);
    }
    std::vector<float> logits =
        forward_both(cpu, dev, {{a, 0, pa, false}, {b, 0, pb, true}}, tol, "two prompts");
    REQUIRE(logits.size() == static_cast<size_t>(71 * V));
    std::vector<TokenId> ta = {row_argmax(logits, 0, V)}, tb = {row_argmax(logits, 70, V)};
    for (int step = 0; step < 8; ++step) {
        CAPTURE(step);
        std::vector<SequenceChunk> batch = {{a, cpu.slot_length(a), ta, false}};
        if (step < 5) {
            batch.push_back({b, cpu.slot_length(b), tb, false});
        }
        logits = forward_both(cpu, dev, batch, tol, "decode");
        ta = {row_argmax(logits, 0, V)};
        if (step < 5) {
            tb = {row_argmax(logits, 1, V)};
        }
    }
    // a's first block is published and attached to a new slot c, which is cut back into it (the
    // block is now shared) and continues there: the host cache copies the block on write, and
    // the whole-step model must copy its own pool's block too, leaving a's intact.
    BlockHash h{};
    h[0] = 42;
    const std::vector<BlockHash> chain = {h};
    cpu.publish_prefix(a, chain);
    dev.publish_prefix(a, chain);
    const int32_t c = *cpu.acquire_slot();
    REQUIRE(*dev.acquire_slot() == c);
    REQUIRE(cpu.attach_prefix(c, chain) == 16);
    REQUIRE(dev.attach_prefix(c, chain) == 16);
    cpu.truncate_slot(c, 10);
    dev.truncate_slot(c, 10);
    const std::vector<TokenId> tc = {7, 8, 9};
    forward_both(cpu, dev, {{c, 10, tc, true}, {a, cpu.slot_length(a), ta, false}}, tol,
                 "copy-on-write continuation next to the block's owner");
    const std::vector<TokenId> five = {5};
    forward_both(cpu, dev, {{a, cpu.slot_length(a), five, false}}, tol, "the owner after it");
    // Bad input is a Status and changes nothing.
    std::vector<float> out;
    const std::vector<TokenId> outside = {V};
    const std::vector<SequenceChunk> wrong_pos = {{b, 0, tb, false}};
    const std::vector<SequenceChunk> wrong_token = {{b, dev.slot_length(b), outside, false}};
    const int32_t len_b = dev.slot_length(b);
    CHECK_FALSE(dev.forward(wrong_pos, &out).ok());
    CHECK_FALSE(dev.forward(wrong_token, &out).ok());
    CHECK(dev.slot_length(b) == len_b);
}

}  // namespace edge::engine::cuda::testing
