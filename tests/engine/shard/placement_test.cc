// Expert placement plans (contiguous, static plan text, explicit slots) and the load-following
// planner: a skewed load gives a plan whose busiest rank is within 1.10x of the mean (contiguous:
// far worse), hot experts get the spare slots, and the same load always gives the same plan.

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "engine/model/expert_placement.h"
#include "engine/shard/placement_planner.h"

namespace edge::engine::shard {
namespace {

TEST_CASE("placement: contiguous blocks and the single-rank plan") {
    auto p = ExpertPlacement::contiguous(2, 8, 3, 0);
    REQUIRE(p.ok());
    CHECK(p->slots_per_rank() == 3);
    CHECK(p->experts_on(1, 0).size() == 2);  // [0, 2), [2, 5), [5, 8).
    CHECK(p->experts_on(1, 1).size() == 3);
    CHECK(p->replicas(0, 4)[0] == 1);
    CHECK(p->extra_replicas() == 0);
    auto one = ExpertPlacement::single_rank(3, 8);
    CHECK(one.ranks() == 1);
    CHECK(one.experts_on(2, 0).size() == 8);
    CHECK(ExpertPlacement::contiguous(2, 8, 3, 2).status().code() ==
          StatusCode::kInvalidArgument);  // 3 x 2 slots < 8 experts.
}

TEST_CASE("placement: static plan text") {
    auto p = ExpertPlacement::parse("0-3,7; 4-7", 2, 8, 2, 5);
    REQUIRE_MESSAGE(p.ok(), p.status().to_string());
    CHECK(p->replicas(1, 7).size() == 2);
    CHECK(p->holds(0, 7, 0));
    CHECK(!p->holds(0, 4, 0));
    CHECK(p->extra_replicas() == 2);  // Expert 7 twice in each of 2 layers.
    CHECK(p->describe() == "layer 0: 0-3,7 | 4-7\nlayer 1: 0-3,7 | 4-7\n");

    auto bad = [](std::string_view spec, int32_t slots, std::string_view needle) {
        auto r = ExpertPlacement::parse(spec, 2, 8, 2, slots);
        INFO(spec);
        REQUIRE(!r.ok());
        CHECK(r.status().code() == StatusCode::kInvalidArgument);
        CHECK(r.status().message().find(needle) != std::string::npos);
    };
    bad("0-3", 0, "lists 1 ranks");
    bad("0-3;4-6", 0, "expert 7 is held by no rank");
    bad("0-3;4-8", 0, "'4-8' is not an expert id or range");
    bad("0-3;x", 0, "'x'");
    bad("0-3;;4-7", 0, "rank 1, character 5: lists no experts");
    bad("0-4;4-7", 4, "holds 5 experts in 4 slots");
    bad("0-3,3;4-7", 0, "twice");
    bad("3-1;0-7", 0, "'3-1'");
    bad("0-99999999999;1", 0, "not an expert id");
}

TEST_CASE("placement: static plan text names the rank and character of what is wrong") {
    auto bad = [](std::string_view spec, std::string_view needle) {
        auto r = ExpertPlacement::parse(spec, 2, 8, 2, 0);
        INFO(spec);
        REQUIRE(!r.ok());
        CHECK(r.status().code() == StatusCode::kInvalidArgument);
        INFO(r.status().message());
        CHECK(r.status().message().find(needle) != std::string::npos);
        return r.status().message();
    };
    // A rank without experts (a stray ';'), an empty item, one rank too many.
    bad("0-7;", "rank 1, character 5: lists no experts");
    bad("0-7; \t", "rank 1, character 7: lists no experts");
    bad("0-3,;4-7", "rank 0, character 5: empty item");
    bad("0-3;4-7;", "character 8: a ';' opens rank 2, beyond the 2 ranks");
    bad("0-3;4-5,5-7", "rank 1, character 9: '5-7' lists expert 5 twice");
    // Whitespace of any kind around items, ranks and the dash is not part of an id.
    auto ws = ExpertPlacement::parse("\t0 - 3 ,\n7 ;4-7\r\n", 1, 8, 2, 0);
    REQUIRE_MESSAGE(ws.ok(), ws.status().to_string());
    CHECK(ws->describe() == "layer 0: 0-3,7 | 4-7\n");

    // A long plan: the error points into it without copying it, and a range repeated far past
    // the experts it can name is refused at its first repeat, not expanded (60 layers of a
    // million-expert list each would be gigabytes).
    std::string spec;
    for (int i = 0; i < 200000; ++i) {
        spec += "0-7,";
    }
    spec += "0-7;4-7";
    const std::string msg = bad(spec, "rank 0, character 5: '0-7' lists expert 0 twice");
    CHECK(msg.size() < 300);
    std::string tail(100000, ' ');
    tail = "0-3;" + tail + "4-x";
    CHECK(bad(tail, "rank 1, character 100005: '4-x' is not an expert id").size() < 300);
}

TEST_CASE("placement: explicit slots are validated") {
    using Slots = std::vector<std::vector<std::vector<int32_t>>>;
    CHECK(ExpertPlacement::from_slots(1, 4, 2, 2, Slots{{{0, 1}, {2, 3}}}).ok());
    CHECK(!ExpertPlacement::from_slots(1, 4, 2, 2, Slots{{{0, 1}, {2, -1}}}).ok());
    CHECK(!ExpertPlacement::from_slots(1, 4, 2, 2, Slots{{{0, 1}}}).ok());
    CHECK(!ExpertPlacement::from_slots(2, 4, 2, 2, Slots{{{0, 1}, {2, 3}}}).ok());
    CHECK(!ExpertPlacement::from_slots(1, 4, 2, 5, Slots{{{0, 1}, {2, 3}}}).ok());
}

// Zipf-like load over E experts, hottest experts scattered by a fixed permutation.
std::vector<int64_t> skewed_load(int32_t layers, int32_t experts, double s) {
    std::vector<int64_t> load(static_cast<size_t>(layers) * experts);
    for (int32_t l = 0; l < layers; ++l) {
        for (int32_t k = 0; k < experts; ++k) {
            const int32_t e = (k * 37 + l * 11) % experts;  // 37 is coprime with 64.
            load[static_cast<size_t>(l) * experts + e] =
                static_cast<int64_t>(100000.0 / std::pow(k + 1.0, s));
        }
    }
    return load;
}

TEST_CASE("planner: skewed load is balanced within 1.10x of the mean") {
    const int32_t L = 3;
    const int32_t E = 64;
    for (int32_t R : {2, 4, 8}) {
        INFO("ranks " << R);
        const int32_t slots = E / R + 2;  // Two spare slots per rank for replicas.
        auto load = skewed_load(L, E, 1.0);
        auto base = ExpertPlacement::contiguous(L, E, R, slots);
        REQUIRE(base.ok());
        auto plan = plan_placement(load, L, E, R, slots);
        REQUIRE_MESSAGE(plan.ok(), plan.status().to_string());
        const double before = imbalance(*base, load);
        const double after = imbalance(*plan, load);
        INFO("before " << before << " after " << after);
        CHECK(before > 1.1);
        CHECK(after < before);
        CHECK(after <= 1.10);
        CHECK(plan->extra_replicas() > 0);
        // The hottest expert of each layer (rank k = 0) got more than one copy.
        for (int32_t l = 0; l < L; ++l) {
            CHECK(plan->replicas(l, (l * 11) % E).size() > 1);
            for (int32_t r = 0; r < R; ++r) {
                CHECK(plan->experts_on(l, r).size() <= static_cast<size_t>(slots));
            }
        }
        // Deterministic.
        auto again = plan_placement(load, L, E, R, slots);
        REQUIRE(again.ok());
        CHECK(*again == *plan);
    }
}

TEST_CASE("planner: no load keeps the contiguous layout, bad input is refused") {
    std::vector<int64_t> zero(2 * 8, 0);
    auto plan = plan_placement(zero, 2, 8, 2, 5);
    REQUIRE(plan.ok());
    CHECK(*plan == *ExpertPlacement::contiguous(2, 8, 2, 5));
    CHECK(imbalance(*plan, zero) == 1.0);
    std::vector<int64_t> neg(16, 1);
    neg[3] = -1;
    CHECK(plan_placement(neg, 2, 8, 2, 5).status().code() == StatusCode::kInvalidArgument);
    CHECK(plan_placement(zero, 3, 8, 2, 5).status().code() == StatusCode::kInvalidArgument);
    CHECK(plan_placement(zero, 2, 8, 2, 3).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("planner: a single rank and an expert hot enough to fill every rank") {
    std::vector<int64_t> load(8, 1);
    load[5] = 1000;
    auto one = plan_placement(load, 1, 8, 1, 8);
    REQUIRE(one.ok());
    CHECK(one->experts_on(0, 0).size() == 8);
    auto four = plan_placement(load, 1, 8, 4, 3);  // 4 spare slots.
    REQUIRE(four.ok());
    CHECK(four->replicas(0, 5).size() == 4);  // At most one copy per rank.
}

TEST_CASE("planner: without replicas every expert is placed once, balanced by load") {
    // 6 experts on 4 ranks of 2 slots: 2 slots free, which a hot expert would take as replicas.
    std::vector<int64_t> load = {1000, 10, 10, 10, 10, 10};
    auto with = plan_placement(load, 1, 6, 4, 2);
    REQUIRE(with.ok());
    CHECK(with->extra_replicas() > 0);
    auto without = plan_placement(load, 1, 6, 4, 2, false);
    REQUIRE(without.ok());
    CHECK(without->extra_replicas() == 0);
    // Still load-following: the hot expert alone on its rank.
    const int32_t hot_rank = without->replicas(0, 0)[0];
    CHECK(without->experts_on(0, hot_rank).size() == 1);
}

}  // namespace
}  // namespace edge::engine::shard
