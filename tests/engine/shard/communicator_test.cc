// In-process communicator: all collectives for R = 1..4 with uneven and zero-length counts, many
// rounds with changing counts, rank-order deterministic reductions, and disagreeing ranks getting
// kInvalidArgument instead of a hang. The ranks run on a RankGroup (tested here too).

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "engine/shard/communicator.h"
#include "engine/shard/in_process_communicator.h"
#include "engine/shard/rank_group.h"

namespace edge::engine::shard {
namespace {

std::vector<std::unique_ptr<Communicator>> group_of(int32_t ranks) {
    auto g = create_communicators("in_process", ranks);
    REQUIRE_MESSAGE(g.ok(), g.status().to_string());
    return std::move(g).value();
}

// Bytes rank `from` sends to rank `to` in round `round`: uneven, often zero.
int64_t count_of(int32_t from, int32_t to, int round) {
    return ((from + 1) * 7 + (to + 2) * 3 + round * 5) % 11 == 0
               ? 0
               : ((from * 13 + to * 5 + round) % 9) * (from + 1);
}

uint8_t byte_of(int32_t from, int32_t to, int round, int64_t i) {
    return static_cast<uint8_t>(from * 31 + to * 17 + round * 7 + i);
}

void all_to_all_rounds(int32_t R, int rounds) {
    auto comms = group_of(R);
    RankGroup group(R);
    std::vector<int> failures(R, 0);
    group.run([&](int32_t me) {
        Communicator& c = *comms[me];
        for (int round = 0; round < rounds; ++round) {
            std::vector<int64_t> send_counts(R), recv_counts(R), expect(R);
            std::vector<uint8_t> send;
            for (int32_t to = 0; to < R; ++to) {
                send_counts[to] = count_of(me, to, round);
                for (int64_t i = 0; i < send_counts[to]; ++i) {
                    send.push_back(byte_of(me, to, round, i));
                }
            }
            if (!c.exchange_counts(send_counts, recv_counts).ok()) {
                ++failures[me];
                continue;
            }
            int64_t total = 0;
            for (int32_t from = 0; from < R; ++from) {
                expect[from] = count_of(from, me, round);
                total += recv_counts[from];
            }
            if (recv_counts != expect) {
                ++failures[me];
            }
            std::vector<uint8_t> recv(static_cast<size_t>(total));
            if (!c.all_to_all_v(send.empty() ? nullptr : send.data(), send_counts,
                                recv.empty() ? nullptr : recv.data(), recv_counts)
                     .ok()) {
                ++failures[me];
                continue;
            }
            int64_t at = 0;
            for (int32_t from = 0; from < R; ++from) {
                for (int64_t i = 0; i < recv_counts[from]; ++i, ++at) {
                    if (recv[at] != byte_of(from, me, round, i)) {
                        ++failures[me];
                    }
                }
            }
        }
    });
    for (int32_t r = 0; r < R; ++r) {
        CHECK(failures[r] == 0);
    }
}

TEST_CASE("communicator: all_to_all_v with uneven and zero counts, 300 rounds, R = 1..4") {
    for (int32_t R = 1; R <= 4; ++R) {
        INFO("ranks " << R);
        all_to_all_rounds(R, 300);
    }
}

TEST_CASE("communicator: all_to_all_v where every count is zero") {
    auto comms = group_of(3);
    RankGroup group(3);
    std::vector<Status> st(3);
    group.run([&](int32_t me) {
        std::vector<int64_t> zero(3, 0);
        st[me] = comms[me]->all_to_all_v(nullptr, zero, nullptr, zero);
    });
    for (const Status& s : st) {
        CHECK(s.ok());
    }
}

TEST_CASE("communicator: all_gather, all_reduce_sum and barrier") {
    for (int32_t R : {1, 2, 4}) {
        INFO("ranks " << R);
        auto comms = group_of(R);
        RankGroup group(R);
        std::vector<std::vector<float>> sums(R);
        std::vector<int> failures(R, 0);
        group.run([&](int32_t me) {
            Communicator& c = *comms[me];
            for (int round = 0; round < 50; ++round) {
                // all_gather of a few bytes, and of zero bytes.
                const int64_t bytes = 1 + round % 5;
                std::vector<uint8_t> mine(bytes), all(bytes * R);
                for (int64_t i = 0; i < bytes; ++i) {
                    mine[i] = byte_of(me, 0, round, i);
                }
                failures[me] += !c.all_gather(mine.data(), bytes, all.data()).ok();
                for (int32_t r = 0; r < R; ++r) {
                    for (int64_t i = 0; i < bytes; ++i) {
                        failures[me] += all[r * bytes + i] != byte_of(r, 0, round, i);
                    }
                }
                failures[me] += !c.all_gather(nullptr, 0, nullptr).ok();
                // int64 sum.
                std::vector<int64_t> v = {me + 1, round, -me};
                failures[me] += !c.all_reduce_sum(std::span<int64_t>(v)).ok();
                failures[me] += v[0] != R * (R + 1) / 2 || v[1] != round * R ||
                                v[2] != -(R * (R - 1) / 2);
                failures[me] += !c.barrier().ok();
            }
            // Float sums whose value depends on the order: every rank must get the same bits.
            std::vector<float> f = {1e8f * (me % 2 == 0 ? 1.0f : -1.0f), 0.1f * (me + 1),
                                    1.0f / (me + 3)};
            failures[me] += !c.all_reduce_sum(std::span<float>(f)).ok();
            sums[me] = f;
        });
        for (int32_t r = 0; r < R; ++r) {
            CHECK(failures[r] == 0);
            CHECK(std::memcmp(sums[r].data(), sums[0].data(), sums[0].size() * 4) == 0);
        }
        // Rank order: ((r0 + r1) + r2) + r3.
        float expect = 0.0f;
        for (int32_t r = 0; r < R; ++r) {
            expect += 0.1f * (r + 1);
        }
        CHECK(sums[0][1] == expect);
    }
}

TEST_CASE("communicator: disagreeing ranks get kInvalidArgument, not a hang") {
    auto comms = group_of(2);
    RankGroup group(2);
    std::vector<Status> st(2);
    SUBCASE("counts that do not match") {
        group.run([&](int32_t me) {
            std::vector<int64_t> send = {0, 4};
            std::vector<int64_t> recv = {0, 3};  // Rank 1 really sends 4 to rank 0... or not.
            if (me == 1) {
                send = {4, 0};
                recv = {4, 0};  // Rank 0 sends 4 to rank 1: agrees.
            }
            uint8_t buf[8] = {};
            uint8_t out[8] = {};
            st[me] = comms[me]->all_to_all_v(buf, send, out, recv);
        });
        // Every rank gets the error (one that got ok went on to its next collective and waited
        // there for ever).
        for (int32_t me = 0; me < 2; ++me) {
            CHECK(st[me].code() == StatusCode::kInvalidArgument);
            CHECK(st[me].message().find("rank 1 sends 4 bytes to rank 0 but its recv_counts[1] "
                                        "is 3") != std::string::npos);
        }
    }
    SUBCASE("different collectives") {
        group.run([&](int32_t me) {
            if (me == 0) {
                st[me] = comms[me]->barrier();
            } else {
                std::vector<int64_t> v = {1};
                st[me] = comms[me]->all_reduce_sum(std::span<int64_t>(v));
            }
        });
        CHECK(st[0].code() == StatusCode::kInvalidArgument);
        CHECK(st[1].code() == StatusCode::kInvalidArgument);
    }
    SUBCASE("a negative count on one rank") {
        group.run([&](int32_t me) {
            std::vector<int64_t> send = {0, me == 0 ? -1 : 0};
            std::vector<int64_t> recv = {0, 0};
            st[me] = comms[me]->all_to_all_v(nullptr, send, nullptr, recv);
        });
        CHECK(st[0].code() == StatusCode::kInvalidArgument);
        CHECK(st[1].code() == StatusCode::kInvalidArgument);
    }
    // The group still works afterwards.
    group.run([&](int32_t me) { st[me] = comms[me]->barrier(); });
    CHECK(st[0].ok());
    CHECK(st[1].ok());
}

TEST_CASE("communicator: factory errors") {
    CHECK(create_communicators("nope", 2).status().code() == StatusCode::kNotFound);
    CHECK(create_communicators("in_process", 0).status().code() == StatusCode::kInvalidArgument);
    CHECK(create_communicators("in_process", 100000).status().code() ==
          StatusCode::kInvalidArgument);
    auto g = create_communicators("in_process", 3);
    REQUIRE(g.ok());
    CHECK((*g)[2]->rank() == 2);
    CHECK((*g)[2]->size() == 3);
    CHECK((*g)[0]->kind() == "in_process");
}

}  // namespace
}  // namespace edge::engine::shard
