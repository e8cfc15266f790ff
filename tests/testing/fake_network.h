#pragma once

// FakeNetwork is an in-process network plus a discrete-event loop for simulations: endpoints
// attach by address, datagrams arrive after a per-link latency unless dropped by loss or a
// partition, streams (TCP) never lose data but fail when the peer is down or partitioned away.
// Time is a ManualClock that only moves when run_until() reaches the next event, so thousands of
// members' seconds simulate in milliseconds and every run with a seed is reproducible.
// Single-threaded: all calls and callbacks happen on the thread that calls run_until().

#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/result.h"

namespace edge::testing {

class FakeNetwork {
public:
    using PacketHandler = std::function<void(const std::string& from, std::vector<uint8_t>)>;
    using StreamHandler =
        std::function<Result<std::vector<uint8_t>>(const std::string& from, std::vector<uint8_t>)>;
    using StreamDone = std::function<void(Result<std::vector<uint8_t>>)>;
    using LatencyFn = std::function<Duration(const std::string& from, const std::string& to)>;

    explicit FakeNetwork(uint64_t seed);

    ManualClock& clock() { return clock_; }
    TimePoint now() const { return clock_.now(); }

    // Event loop.
    void schedule(TimePoint at, std::function<void()> fn);
    // Runs events in time order until none is due at or before `t`; the clock ends at `t`.
    void run_until(TimePoint t);
    void run_for(Duration d) { run_until(now() + d); }
    // Runs until `done()` holds (checked after each event) or `limit` passes; true if it held.
    bool run_until_true(const std::function<bool()>& done, Duration limit);

    // Endpoints. A detached address behaves like a dead host: packets vanish, streams fail.
    void attach(const std::string& addr, PacketHandler on_packet, StreamHandler on_stream);
    void detach(const std::string& addr);

    // Links.
    void set_latency(LatencyFn fn) { latency_ = std::move(fn); }
    // Probability (0..1) that any datagram is lost.
    void set_loss(double p) { loss_ = p; }
    // Extra delay before `addr` sees anything (a CPU-starved host).
    void set_receive_delay(const std::string& addr, Duration d) { receive_delay_[addr] = d; }
    // Members of different groups cannot reach each other; addresses in no group reach all.
    void partition(const std::vector<std::vector<std::string>>& groups);
    void heal() { group_.clear(); }
    // How long a stream to an unreachable (partitioned) peer takes to fail.
    void set_stream_timeout(Duration d) { stream_timeout_ = d; }

    // Traffic.
    void send_packet(const std::string& from, const std::string& to, std::vector<uint8_t> bytes);
    void send_stream(const std::string& from, const std::string& to, std::vector<uint8_t> bytes,
                     StreamDone done);

    uint64_t bytes_sent_by(const std::string& addr) const;
    // Datagrams addressed to `addr` (before loss).
    uint64_t packets_sent_to(const std::string& addr) const;
    uint64_t total_bytes() const { return total_bytes_; }
    uint64_t packets_dropped() const { return dropped_; }
    uint64_t events_run() const { return events_run_; }

private:
    struct Event {
        TimePoint at;
        uint64_t seq;
        std::function<void()> fn;
        bool operator>(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
    };
    struct Endpoint {
        PacketHandler on_packet;
        StreamHandler on_stream;
    };

    bool reachable(const std::string& a, const std::string& b) const;
    Duration delay(const std::string& from, const std::string& to) const;

    ManualClock clock_;
    std::mt19937_64 rng_;
    std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
    uint64_t next_seq_ = 0;
    std::unordered_map<std::string, Endpoint> endpoints_;
    std::unordered_map<std::string, int> group_;
    std::unordered_map<std::string, Duration> receive_delay_;
    std::unordered_map<std::string, uint64_t> bytes_sent_;
    std::unordered_map<std::string, uint64_t> packets_to_;
    LatencyFn latency_;
    double loss_ = 0.0;
    Duration stream_timeout_ = std::chrono::seconds(10);
    uint64_t total_bytes_ = 0;
    uint64_t dropped_ = 0;
    uint64_t events_run_ = 0;
};

}  // namespace edge::testing
