// In-process communicator: all collectives for R = 1..4 with uneven and zero-length counts, many
// rounds with changing counts, rank-order deterministic reductions, and disagreeing ranks getting
// kInvalidArgument instead of a hang. The ranks run on a RankGroup (tested here too). Abort: a
// rank that throws or returns an error before or between collectives makes every peer's
// collective return the abort status naming it, promptly; the first abort wins; an aborted group
// never blocks and writes no buffer. Those cases run under a time bound, so a hang fails.

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <new>
#include <stdexcept>
#include <thread>
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

std::vector<Communicator*> endpoints(const std::vector<std::unique_ptr<Communicator>>& comms) {
    std::vector<Communicator*> out;
    for (const auto& c : comms) {
        out.push_back(c.get());
    }
    return out;
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
    RankGroup group(endpoints(comms));
    std::vector<int> failures(R, 0);
    const Status ran = group.run([&](int32_t me) {
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
    CHECK(ran.ok());
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
    RankGroup group(endpoints(comms));
    std::vector<Status> st(3);
    const Status ran = group.run([&](int32_t me) {
        std::vector<int64_t> zero(3, 0);
        st[me] = comms[me]->all_to_all_v(nullptr, zero, nullptr, zero);
    });
    CHECK(ran.ok());
    for (const Status& s : st) {
        CHECK(s.ok());
    }
}

TEST_CASE("communicator: all_gather, all_reduce_sum and barrier") {
    for (int32_t R : {1, 2, 4}) {
        INFO("ranks " << R);
        auto comms = group_of(R);
        RankGroup group(endpoints(comms));
        std::vector<std::vector<float>> sums(R);
        std::vector<int> failures(R, 0);
        const Status ran = group.run([&](int32_t me) {
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
        CHECK(ran.ok());
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
    RankGroup group(endpoints(comms));
    std::vector<Status> st(2);
    SUBCASE("counts that do not match") {
        const Status ran = group.run([&](int32_t me) {
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
        CHECK(ran.ok());
        // Every rank gets the error (one that got ok went on to its next collective and waited
        // there for ever).
        for (int32_t me = 0; me < 2; ++me) {
            CHECK(st[me].code() == StatusCode::kInvalidArgument);
            CHECK(st[me].message().find("rank 1 sends 4 bytes to rank 0 but its recv_counts[1] "
                                        "is 3") != std::string::npos);
        }
    }
    SUBCASE("different collectives") {
        const Status ran = group.run([&](int32_t me) {
            if (me == 0) {
                st[me] = comms[me]->barrier();
            } else {
                std::vector<int64_t> v = {1};
                st[me] = comms[me]->all_reduce_sum(std::span<int64_t>(v));
            }
        });
        CHECK(ran.ok());
        CHECK(st[0].code() == StatusCode::kInvalidArgument);
        CHECK(st[1].code() == StatusCode::kInvalidArgument);
    }
    SUBCASE("a negative count on one rank") {
        const Status ran = group.run([&](int32_t me) {
            std::vector<int64_t> send = {0, me == 0 ? -1 : 0};
            std::vector<int64_t> recv = {0, 0};
            st[me] = comms[me]->all_to_all_v(nullptr, send, nullptr, recv);
        });
        CHECK(ran.ok());
        CHECK(st[0].code() == StatusCode::kInvalidArgument);
        CHECK(st[1].code() == StatusCode::kInvalidArgument);
    }
    // The group still works afterwards.
    CHECK(group.run([&](int32_t me) { st[me] = comms[me]->barrier(); }).ok());
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

// Generous: every case below finishes in milliseconds, a hang never.
constexpr auto kBound = std::chrono::seconds(30);

// Runs `scenario` on a thread of its own and waits at most kBound for it, so a rank that waits for
// ever (what the abort cases guard against) fails the test instead of hanging the run. A hung
// thread is left behind, detached: `scenario` must own everything it touches.
void within_bound(std::function<void()> scenario) {
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> finished = done->get_future();
    std::thread t([done, scenario = std::move(scenario)] {
        scenario();
        done->set_value();
    });
    if (finished.wait_for(kBound) != std::future_status::ready) {
        t.detach();
        FAIL("still running after " << kBound.count() << " s: a rank waits for ever");
    }
    t.join();
}

// One collective of each kind, as rank `me` of `c`'s group calls it.
enum class Op { kAllToAll, kCounts, kAllGather, kReduceF32, kReduceI64, kBarrier };
constexpr Op kOps[] = {Op::kAllToAll, Op::kCounts,    Op::kAllGather,
                       Op::kReduceF32, Op::kReduceI64, Op::kBarrier};

Status call(Communicator& c, Op op) {
    const auto R = static_cast<size_t>(c.size());
    std::vector<int64_t> counts(R, 2), incoming(R, 0);
    std::vector<uint8_t> send(2 * R, 7), recv(2 * R, 0);
    std::vector<float> f(3, 1.0f);
    std::vector<int64_t> i(3, 1);
    switch (op) {
        case Op::kAllToAll:
            return c.all_to_all_v(send.data(), counts, recv.data(), counts);
        case Op::kCounts:
            return c.exchange_counts(counts, incoming);
        case Op::kAllGather:
            return c.all_gather(send.data(), 2, recv.data());
        case Op::kReduceF32:
            return c.all_reduce_sum(std::span<float>(f));
        case Op::kReduceI64:
            return c.all_reduce_sum(std::span<int64_t>(i));
        case Op::kBarrier:
            return c.barrier();
    }
    return internal_error("unknown op");
}

// What the failing rank does in place of its collective.
enum class Failure { kThrow, kReturnError };

// A group of `R` ranks runs `rounds` rounds of `op`; in round `at` rank `bad` fails instead of
// calling it (throws, or returns an error) while its peers are in, or about to enter, that round's
// collective. Every peer's call must return the group's failure, which names `bad`.
void one_rank_fails(int32_t R, Op op, int32_t bad, int at, Failure how) {
    struct State {
        std::vector<std::unique_ptr<Communicator>> comms;
        std::unique_ptr<RankGroup> group;
        std::vector<Status> last;  // [rank]: the last collective's status.
        std::vector<int> ok_rounds;
        Status ran;
    };
    auto s = std::make_shared<State>();
    s->comms = group_of(R);
    s->group = std::make_unique<RankGroup>(endpoints(s->comms));
    s->last.assign(R, ok_status());
    s->ok_rounds.assign(R, 0);
    within_bound([s, op, bad, at, how] {
        s->ran = s->group->run([&s, op, bad, at, how](int32_t me) -> Status {
            for (int round = 0; round < 4; ++round) {
                if (me == bad && round == at) {
                    if (how == Failure::kThrow) {
                        throw std::runtime_error("expert weights went missing");
                    }
                    return not_found_error("expert weights went missing");
                }
                s->last[me] = call(*s->comms[me], op);
                if (!s->last[me].ok()) {
                    return s->last[me];
                }
                ++s->ok_rounds[me];
            }
            return ok_status();
        });
    });
    const Status& ran = s->ran;
    CHECK_FALSE(ran.ok());
    if (how == Failure::kThrow) {
        CHECK(ran.code() == StatusCode::kInternal);
        CHECK(ran.message() == "rank " + std::to_string(bad) + " of " + std::to_string(R) +
                                   " threw: expert weights went missing");
    } else {
        CHECK(ran.code() == StatusCode::kNotFound);
        CHECK(ran.message() == "rank " + std::to_string(bad) + ": expert weights went missing");
    }
    for (int32_t r = 0; r < R; ++r) {
        INFO("rank " << r);
        CHECK(s->ok_rounds[r] == at);
        if (r != bad) {
            CHECK(s->last[r] == ran);  // The abort status itself, on every peer.
        }
    }
    // Aborted for good: a later collective returns the same status at once.
    for (int32_t r = 0; r < R; ++r) {
        CHECK(call(*s->comms[r], op) == ran);
    }
}

TEST_CASE("communicator abort: a rank that throws before any collective releases its peers") {
    for (Op op : kOps) {
        for (int32_t bad : {0, 2}) {
            INFO("op " << static_cast<int>(op) << ", throwing rank " << bad);
            one_rank_fails(3, op, bad, 0, Failure::kThrow);
        }
    }
}

TEST_CASE("communicator abort: a rank that throws between collectives releases its peers") {
    for (Op op : kOps) {
        for (int32_t bad : {0, 1, 3}) {
            INFO("op " << static_cast<int>(op) << ", throwing rank " << bad);
            one_rank_fails(4, op, bad, 2, Failure::kThrow);
        }
    }
}

TEST_CASE("communicator abort: a rank that returns an error early releases its peers") {
    for (Op op : kOps) {
        for (int32_t bad : {0, 1}) {
            INFO("op " << static_cast<int>(op) << ", failing rank " << bad);
            one_rank_fails(2, op, bad, 1, Failure::kReturnError);
        }
    }
}

TEST_CASE("communicator abort: the first status wins and no later call blocks or writes") {
    // One thread drives every rank in turn: any call that waited for a peer would never return.
    auto comms = std::make_shared<std::vector<std::unique_ptr<Communicator>>>(group_of(3));
    const Status first = unavailable_error("rank 1 lost its device");
    (*comms)[1]->abort(first);
    (*comms)[2]->abort(internal_error("a later reason"));
    (*comms)[0]->abort(ok_status());
    within_bound([comms, first] {
        for (int32_t r = 0; r < 3; ++r) {
            Communicator& c = *(*comms)[r];
            for (Op op : kOps) {
                INFO("rank " << r << ", op " << static_cast<int>(op));
                CHECK(call(c, op) == first);
            }
            // Nothing is written: not the received blocks, not the data reduced in place.
            std::vector<uint8_t> send(6, 7), recv(6, 9);
            std::vector<int64_t> counts(3, 2), incoming(3, -1);
            std::vector<float> data(2, 5.0f);
            CHECK(c.all_to_all_v(send.data(), counts, recv.data(), counts) == first);
            CHECK(c.all_gather(send.data(), 2, recv.data()) == first);
            CHECK(c.exchange_counts(counts, incoming) == first);
            CHECK(c.all_reduce_sum(std::span<float>(data)) == first);
            CHECK(recv == std::vector<uint8_t>(6, 9));
            CHECK(incoming == std::vector<int64_t>(3, -1));
            CHECK(data == std::vector<float>(2, 5.0f));
        }
    });
}

TEST_CASE("communicator abort: an OK status still aborts (as kAborted)") {
    auto comms = std::make_shared<std::vector<std::unique_ptr<Communicator>>>(group_of(2));
    (*comms)[0]->abort(ok_status());
    auto st = std::make_shared<Status>();
    within_bound([comms, st] { *st = (*comms)[1]->barrier(); });
    CHECK(st->code() == StatusCode::kAborted);
}

TEST_CASE("communicator abort: abort() from a rank's own thread releases peers already waiting") {
    struct State {
        std::vector<std::unique_ptr<Communicator>> comms;
        std::unique_ptr<RankGroup> group;
        std::vector<Status> st;
        Status ran;
    };
    auto s = std::make_shared<State>();
    s->comms = group_of(3);
    s->group = std::make_unique<RankGroup>(endpoints(s->comms));
    s->st.assign(3, ok_status());
    const Status why = cancelled_error("rank 2 gave up");
    within_bound([s, why] {
        s->ran = s->group->run([&s, why](int32_t me) {
            if (me == 2) {
                // Leaves the others in all_gather, then aborts: they are in flight or about to be.
                s->comms[me]->abort(why);
                return;
            }
            for (Op op : kOps) {
                s->st[me] = call(*s->comms[me], op);
                if (!s->st[me].ok()) {
                    return;
                }
            }
        });
    });
    // The bodies kept their errors to themselves: the group saw no failure of its own.
    CHECK(s->ran.ok());
    CHECK(s->st[0] == why);
    CHECK(s->st[1] == why);
}

TEST_CASE("rank group: a group of one reports its rank's exception as a Status") {
    auto comms = group_of(1);
    RankGroup group(endpoints(comms));
    const Status ran = group.run([](int32_t) { throw std::bad_alloc(); });
    CHECK(ran.code() == StatusCode::kInternal);
    CHECK(ran.message().find("rank 0 of 1 threw: ") == 0);
    CHECK(comms[0]->barrier() == ran);
    // A later run with no failure is OK again (the communicator stays aborted).
    CHECK(group.run([](int32_t) {}).ok());
}

}  // namespace
}  // namespace edge::engine::shard
