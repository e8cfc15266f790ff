#include "tests/testing/fake_network.h"

namespace edge::testing {

FakeNetwork::FakeNetwork(uint64_t seed) : rng_(seed) {
    latency_ = [](const std::string&, const std::string&) {
        return Duration(std::chrono::milliseconds(1));
    };
}

void FakeNetwork::schedule(TimePoint at, std::function<void()> fn) {
    if (at < now()) {
        at = now();
    }
    events_.push(Event{at, next_seq_++, std::move(fn)});
}

void FakeNetwork::run_until(TimePoint t) {
    while (!events_.empty() && events_.top().at <= t) {
        Event e = std::move(const_cast<Event&>(events_.top()));
        events_.pop();
        clock_.set(e.at);
        ++events_run_;
        e.fn();
    }
    if (now() < t) {
        clock_.set(t);
    }
}

bool FakeNetwork::run_until_true(const std::function<bool()>& done, Duration limit) {
    const TimePoint end = now() + limit;
    while (!done()) {
        if (events_.empty() || events_.top().at > end) {
            clock_.set(end);
            return done();
        }
        Event e = std::move(const_cast<Event&>(events_.top()));
        events_.pop();
        clock_.set(e.at);
        ++events_run_;
        e.fn();
    }
    return true;
}

void FakeNetwork::attach(const std::string& addr, PacketHandler on_packet,
                         StreamHandler on_stream) {
    endpoints_[addr] = Endpoint{std::move(on_packet), std::move(on_stream)};
}

void FakeNetwork::detach(const std::string& addr) { endpoints_.erase(addr); }

void FakeNetwork::partition(const std::vector<std::vector<std::string>>& groups) {
    group_.clear();
    for (size_t g = 0; g < groups.size(); ++g) {
        for (const std::string& a : groups[g]) {
            group_[a] = static_cast<int>(g);
        }
    }
}

bool FakeNetwork::reachable(const std::string& a, const std::string& b) const {
    auto ia = group_.find(a);
    auto ib = group_.find(b);
    if (ia == group_.end() || ib == group_.end()) {
        return true;
    }
    return ia->second == ib->second;
}

Duration FakeNetwork::delay(const std::string& from, const std::string& to) const {
    Duration d = latency_(from, to);
    auto it = receive_delay_.find(to);
    if (it != receive_delay_.end()) {
        d += it->second;
    }
    return d;
}

uint64_t FakeNetwork::bytes_sent_by(const std::string& addr) const {
    auto it = bytes_sent_.find(addr);
    return it == bytes_sent_.end() ? 0 : it->second;
}

uint64_t FakeNetwork::packets_sent_to(const std::string& addr) const {
    auto it = packets_to_.find(addr);
    return it == packets_to_.end() ? 0 : it->second;
}

void FakeNetwork::send_packet(const std::string& from, const std::string& to,
                              std::vector<uint8_t> bytes) {
    bytes_sent_[from] += bytes.size();
    packets_to_[to] += 1;
    total_bytes_ += bytes.size();
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    if (!reachable(from, to) || (loss_ > 0.0 && coin(rng_) < loss_)) {
        ++dropped_;
        return;
    }
    schedule(now() + delay(from, to), [this, from, to, bytes = std::move(bytes)]() mutable {
        auto it = endpoints_.find(to);
        if (it == endpoints_.end() || !reachable(from, to)) {
            ++dropped_;
            return;
        }
        it->second.on_packet(from, std::move(bytes));
    });
}

void FakeNetwork::send_stream(const std::string& from, const std::string& to,
                              std::vector<uint8_t> bytes, StreamDone done) {
    bytes_sent_[from] += bytes.size();
    total_bytes_ += bytes.size();
    if (!reachable(from, to)) {
        schedule(now() + stream_timeout_, [done = std::move(done)] {
            done(unavailable_error("fake network: stream timed out (partition)"));
        });
        return;
    }
    const Duration there = delay(from, to);
    schedule(now() + there, [this, from, to, bytes = std::move(bytes),
                             done = std::move(done)]() mutable {
        auto it = endpoints_.find(to);
        if (it == endpoints_.end()) {
            // Connection refused: the answer comes back after one more trip.
            schedule(now() + latency_(to, from), [done = std::move(done)] {
                done(unavailable_error("fake network: connection refused"));
            });
            return;
        }
        auto response = it->second.on_stream(from, std::move(bytes));
        if (response.ok()) {
            bytes_sent_[to] += response->size();
            total_bytes_ += response->size();
        }
        schedule(now() + delay(to, from), [response = std::move(response),
                                           done = std::move(done)]() mutable {
            done(std::move(response));
        });
    });
}

}  // namespace edge::testing
