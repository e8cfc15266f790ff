#include "engine/shard/in_process_communicator.h"

#include <atomic>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

#include "engine/shard/abort_signal.h"

namespace edge::engine::shard {
namespace {

// A reusable barrier for a fixed number of threads that an abort releases: the last to arrive
// resets the count and bumps the generation; the others spin a little, then sleep until the
// generation word changes. wake() (after the group's abort signal was raised) sets the word's top
// bit, which releases every waiter without completing its generation: a waiter whose generation
// did complete still returns true, so a collective every rank finished is not reported aborted.
class AbortableBarrier {
public:
    AbortableBarrier(int32_t parties, const AbortSignal& abort)
        : parties_(parties), abort_(abort) {}

    // True once every party arrived; false when the group was aborted first (the barrier is then
    // unusable, as is the group).
    bool arrive_and_wait() {
        // The word first: the abort signal is raised before the bit is set, so a word read
        // without the bit means an abort raised later sets it and the wait below sees that.
        const uint64_t gen = gen_.load(std::memory_order_acquire);
        if (abort_.raised()) {
            return false;
        }
        if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == parties_) {
            count_.store(0, std::memory_order_relaxed);
            gen_.fetch_add(1, std::memory_order_acq_rel);
            gen_.notify_all();
            return true;
        }
        constexpr int kSpins = 2000;
        uint64_t now = gen_.load(std::memory_order_acquire);
        for (int spin = 0; now == gen; ++spin) {
            if (spin < kSpins) {
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
            } else {
                gen_.wait(gen, std::memory_order_acquire);
            }
            now = gen_.load(std::memory_order_acquire);
        }
        return (now & ~kAbortBit) != gen;
    }

    // Releases every waiter; call after raising the abort signal.
    void wake() {
        gen_.fetch_or(kAbortBit, std::memory_order_acq_rel);
        gen_.notify_all();
    }

private:
    static constexpr uint64_t kAbortBit = uint64_t{1} << 63;

    const int32_t parties_;
    const AbortSignal& abort_;
    std::atomic<int32_t> count_{0};
    std::atomic<uint64_t> gen_{0};  // Completed generations; kAbortBit once aborted.
};

enum class OpKind : int32_t { kAllToAll, kCounts, kAllGather, kReduceF32, kReduceI64, kBarrier };

const char* op_name(OpKind k) {
    switch (k) {
        case OpKind::kAllToAll:
            return "all_to_all_v";
        case OpKind::kCounts:
            return "exchange_counts";
        case OpKind::kAllGather:
            return "all_gather";
        case OpKind::kReduceF32:
        case OpKind::kReduceI64:
            return "all_reduce_sum";
        case OpKind::kBarrier:
            return "barrier";
    }
    return "?";
}

// What one rank publishes for the collective in flight.
struct Posted {
    OpKind op = OpKind::kBarrier;
    bool valid = true;              // The rank's own arguments passed its checks.
    const void* send = nullptr;
    const int64_t* send_counts = nullptr;  // size() entries (all-to-all, counts).
    const int64_t* recv_counts = nullptr;  // size() entries (all-to-all).
    int64_t bytes = 0;                     // all_gather block / reduce element count.
};

struct GroupState {
    explicit GroupState(int32_t r)
        : ranks(r), posted(static_cast<size_t>(r)), barrier(r, abort) {}
    const int32_t ranks;
    std::vector<Posted> posted;
    AbortSignal abort;
    AbortableBarrier barrier;
    // Ranks that published and may read their peers' buffers before the collective's second
    // meeting. A rank that an abort releases waits for it to reach 0 before its call returns,
    // so no peer still copies from a buffer its caller is about to reuse or free.
    std::atomic<int32_t> readers{0};
};

class InProcessCommunicator final : public Communicator {
public:
    InProcessCommunicator(std::shared_ptr<GroupState> g, int32_t rank)
        : g_(std::move(g)), rank_(rank) {}

    std::string_view kind() const override { return "in_process"; }
    int32_t rank() const override { return rank_; }
    int32_t size() const override { return g_->ranks; }

    Status all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                        std::span<const int64_t> recv_counts) override {
        Status own = check_counts(send_counts, "send_counts", send);
        if (own.ok()) {
            own = check_counts(recv_counts, "recv_counts", recv);
        }
        Posted p{OpKind::kAllToAll, own.ok(), send, send_counts.data(), recv_counts.data(), 0};
        return collective(p, own, [&] {
            // Every pair's counts, by every rank, before anything is written: all ranks reach
            // one verdict (a rank that saw no mismatch of its own went on to the next collective
            // and waited there for ever).
            for (int32_t to = 0; to < size(); ++to) {
                for (int32_t from = 0; from < size(); ++from) {
                    const int64_t sent = g_->posted[from].send_counts[to];
                    const int64_t expected = g_->posted[to].recv_counts[from];
                    if (sent != expected) {
                        return invalid_argument_error(
                            where(OpKind::kAllToAll) + ": rank " + std::to_string(from) +
                            " sends " + std::to_string(sent) + " bytes to rank " +
                            std::to_string(to) + " but its recv_counts[" + std::to_string(from) +
                            "] is " + std::to_string(expected));
                    }
                }
            }
            auto* out = static_cast<unsigned char*>(recv);
            int64_t at = 0;
            for (int32_t r = 0; r < size(); ++r) {
                const Posted& peer = g_->posted[r];
                int64_t off = 0;
                for (int32_t q = 0; q < rank_; ++q) {
                    off += peer.send_counts[q];
                }
                if (recv_counts[r] > 0) {
                    std::memcpy(out + at, static_cast<const unsigned char*>(peer.send) + off,
                                static_cast<size_t>(recv_counts[r]));
                }
                at += recv_counts[r];
            }
            return ok_status();
        });
    }

    Status exchange_counts(std::span<const int64_t> send_counts,
                           std::span<int64_t> recv_counts) override {
        Status own = ok_status();
        if (static_cast<int32_t>(send_counts.size()) != size() ||
            static_cast<int32_t>(recv_counts.size()) != size()) {
            own = invalid_argument_error(where(OpKind::kCounts) + ": count arrays must have " +
                                         std::to_string(size()) + " entries");
        }
        Posted p{OpKind::kCounts, own.ok(), nullptr, send_counts.data(), nullptr, 0};
        return collective(p, own, [&] {
            for (int32_t r = 0; r < size(); ++r) {
                recv_counts[r] = g_->posted[r].send_counts[rank_];
            }
            return ok_status();
        });
    }

    Status all_gather(const void* send, int64_t bytes, void* recv) override {
        Status own = ok_status();
        if (bytes < 0 || (bytes > 0 && (send == nullptr || recv == nullptr))) {
            own = invalid_argument_error(where(OpKind::kAllGather) +
                                         ": negative size or null buffer");
        }
        Posted p{OpKind::kAllGather, own.ok(), send, nullptr, nullptr, bytes};
        return collective(p, own, [&] {
            auto* out = static_cast<unsigned char*>(recv);
            for (int32_t r = 0; r < size() && bytes > 0; ++r) {
                std::memcpy(out + static_cast<size_t>(r) * static_cast<size_t>(bytes),
                            g_->posted[r].send, static_cast<size_t>(bytes));
            }
            return ok_status();
        });
    }

    Status all_reduce_sum(std::span<float> data) override {
        return reduce(OpKind::kReduceF32, data, f32_tmp_);
    }
    Status all_reduce_sum(std::span<int64_t> data) override {
        return reduce(OpKind::kReduceI64, data, i64_tmp_);
    }

    Status barrier() override {
        Posted p{OpKind::kBarrier, true, nullptr, nullptr, nullptr, 0};
        return collective(p, ok_status(), [] { return ok_status(); });
    }

    void abort(Status why) override {
        g_->abort.raise(std::move(why));
        g_->barrier.wake();
    }

private:
    std::string where(OpKind k) const {
        return std::string("in_process ") + op_name(k) + " (rank " + std::to_string(rank_) +
               " of " + std::to_string(size()) + ")";
    }

    Status check_counts(std::span<const int64_t> counts, const char* name, const void* buf) const {
        if (static_cast<int32_t>(counts.size()) != size()) {
            return invalid_argument_error(where(OpKind::kAllToAll) + ": " + name + " has " +
                                          std::to_string(counts.size()) + " entries, not " +
                                          std::to_string(size()));
        }
        int64_t total = 0;
        for (int64_t c : counts) {
            if (c < 0 || c > (int64_t{1} << 40) || total > (int64_t{1} << 50)) {
                return invalid_argument_error(where(OpKind::kAllToAll) + ": " + name +
                                              " holds a negative or huge count " +
                                              std::to_string(c));
            }
            total += c;
        }
        if (total > 0 && buf == nullptr) {
            return invalid_argument_error(where(OpKind::kAllToAll) + ": null buffer for " +
                                          std::to_string(total) + " bytes");
        }
        return ok_status();
    }

    // One collective: publishes this rank's arguments `p`, meets the others, runs `work` (reads
    // the peers' published buffers, writes only this rank's) when `own` and agree() pass, and
    // meets again so no sender reuses a buffer still being read. Returns `own`, the
    // disagreement, `work`'s status, or the group's abort status.
    template <typename Work>
    Status collective(const Posted& p, const Status& own, Work&& work) {
        if (g_->abort.raised()) {
            return g_->abort.status();
        }
        g_->posted[rank_] = p;
        g_->readers.fetch_add(1, std::memory_order_acq_rel);
        if (!g_->barrier.arrive_and_wait()) {
            g_->readers.fetch_sub(1, std::memory_order_acq_rel);
            return aborted_in_call();
        }
        Status st = own.ok() ? agree(p.op) : own;
        try {
            if (st.ok()) {
                st = work();
            }
        } catch (const std::exception& e) {
            // Only an error message can throw here (std::bad_alloc). The peers saw no error:
            // the group cannot agree on this call any more.
            abort(internal_error("in_process rank " + std::to_string(rank_) + " threw in " +
                                 op_name(p.op) + ": " + e.what()));
        }
        g_->readers.fetch_sub(1, std::memory_order_acq_rel);
        if (!g_->barrier.arrive_and_wait()) {
            return aborted_in_call();
        }
        return st;
    }

    // The abort status, once no peer reads this rank's buffers any more: a peer that left the
    // first meeting before the abort may still be copying (it never blocks while it does).
    Status aborted_in_call() const {
        while (g_->readers.load(std::memory_order_acquire) != 0) {
            std::this_thread::yield();
        }
        return g_->abort.status();
    }

    // Whether every rank posted valid arguments for the same collective (and, for the sized
    // ones, the same size).
    Status agree(OpKind k) const {
        const Posted& mine = g_->posted[rank_];
        for (int32_t r = 0; r < size(); ++r) {
            const Posted& p = g_->posted[r];
            if (p.op != k) {
                return invalid_argument_error(where(k) + ": rank " + std::to_string(r) +
                                              " called " + op_name(p.op) + " instead");
            }
            if (!p.valid) {
                return invalid_argument_error(where(k) + ": rank " + std::to_string(r) +
                                              " passed invalid arguments");
            }
            if (p.bytes != mine.bytes) {
                return invalid_argument_error(where(k) + ": rank " + std::to_string(r) +
                                              " passed size " + std::to_string(p.bytes) +
                                              ", this rank " + std::to_string(mine.bytes));
            }
        }
        return ok_status();
    }

    template <typename T>
    Status reduce(OpKind k, std::span<T> data, std::vector<T>& tmp) {
        const auto n = static_cast<int64_t>(data.size());
        // Sized before the rank publishes: a std::bad_alloc here leaves no peer reading.
        tmp.resize(data.size());
        Status st = collective({k, true, data.data(), nullptr, nullptr, n}, ok_status(), [&] {
            std::fill(tmp.begin(), tmp.end(), T{0});
            for (int32_t r = 0; r < size(); ++r) {
                const T* src = static_cast<const T*>(g_->posted[r].send);
                for (int64_t i = 0; i < n; ++i) {
                    tmp[i] += src[i];
                }
            }
            return ok_status();
        });
        // Everyone has read every input; now each rank may overwrite its own.
        if (st.ok()) {
            std::copy(tmp.begin(), tmp.end(), data.begin());
        }
        return st;
    }

    std::shared_ptr<GroupState> g_;
    const int32_t rank_;
    std::vector<float> f32_tmp_;
    std::vector<int64_t> i64_tmp_;
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> create_in_process_group(int32_t ranks) {
    if (ranks < 1 || ranks > kMaxInProcessRanks) {
        return invalid_argument_error("in_process communicator: ranks " + std::to_string(ranks) +
                                      " is outside [1, " + std::to_string(kMaxInProcessRanks) +
                                      "]");
    }
    auto state = std::make_shared<GroupState>(ranks);
    std::vector<std::unique_ptr<Communicator>> out;
    for (int32_t r = 0; r < ranks; ++r) {
        out.push_back(std::make_unique<InProcessCommunicator>(state, r));
    }
    return out;
}

}  // namespace edge::engine::shard
