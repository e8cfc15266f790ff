#pragma once

// The single-member harness of the memberlist tests: one Memberlist on a ManualClock whose
// transport records what it sends instead of delivering it, so a test can feed it any sequence
// of messages (stale, reordered, replayed) and see exactly what it concludes and what it tells
// others. Member "A" at 10.0.0.1:7946; packets arrive from 10.0.0.2:7946. Single-threaded.

#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "routing/membership/memberlist.h"

namespace edge::routing::membership {

// Decodes every packet the member sends; streams (push-pull, TCP fallback) are never answered.
class RecordingTransport final : public Transport {
  public:
    explicit RecordingTransport(const Clock& clock) : clock_(clock) {}

    void send_packet(const std::string& addr, std::vector<uint8_t> bytes) override {
        record(addr, bytes, sent);
    }
    void send_stream(const std::string& addr, uint64_t, std::vector<uint8_t> bytes) override {
        record(addr, bytes, streams);
    }

    struct Sent {
        TimePoint at;
        std::string to;
        Message msg;
    };
    std::vector<Sent> sent;
    std::vector<Sent> streams;  // Requests sent on streams (never answered).

  private:
    // Opens and decodes what the member sent, each message onto `into`.
    void record(const std::string& addr, const std::vector<uint8_t>& bytes,
                std::vector<Sent>& into) {
        auto plain = Keyring{}.open("", bytes);
        REQUIRE(plain.ok());
        auto msgs = decode_packet(*plain);
        REQUIRE(msgs.ok());
        for (Message& m : *msgs) {
            into.push_back({clock_.now(), addr, std::move(m)});
        }
    }

    const Clock& clock_;
};

class Member {
  public:
    explicit Member(MembershipConfig c = lan_profile()) {
        c.name = "A";
        c.advertise_addr = "10.0.0.1:7946";
        SiteState site;
        site.site_id = "A";
        ml_ = Memberlist::create(c, Keyring{}, clock_, transport_, site).value();
        ml_->set_event_callback([this](const MemberEvent& e) { events.push_back(e); });
    }

    Memberlist& ml() { return *ml_; }
    ManualClock& clock() { return clock_; }
    RecordingTransport& transport() { return transport_; }

    void receive(const Message& m) {
        std::vector<std::vector<uint8_t>> framed{encode_message(m)};
        ml_->handle_packet("10.0.0.2:7946", Keyring{}.seal("", encode_packet(framed)).value());
    }
    // A peer's push-pull request as a stream; returns the member's sealed answer.
    Result<std::vector<uint8_t>> push_pull(const PushPullMsg& pp) {
        std::vector<std::vector<uint8_t>> framed{encode_message(pp)};
        return ml_->handle_stream("10.0.0.2:7946",
                                  Keyring{}.seal("", encode_packet(framed)).value());
    }
    // Whatever the member still has queued for `node` rides on its answer to a ping: returns the
    // alive, suspect and dead messages about `node` in it.
    std::vector<Message> queued_about(const std::string& node) {
        transport_.sent.clear();
        receive(PingMsg{1, "A", "B", "10.0.0.2:7946"});
        std::vector<Message> out;
        for (const auto& s : transport_.sent) {
            const bool about = std::visit(
                [&](const auto& v) {
                    using T = std::decay_t<decltype(v)>;
                    if constexpr (std::is_same_v<T, AliveMsg> || std::is_same_v<T, SuspectMsg> ||
                                  std::is_same_v<T, DeadMsg>) {
                        return v.node == node;
                    }
                    return false;
                },
                s.msg);
            if (about) {
                out.push_back(s.msg);
            }
        }
        return out;
    }
    // Runs every timer due up to `until`, jumping the clock from one deadline to the next.
    void run_until(TimePoint until) {
        while (ml_->next_deadline() <= until) {
            clock_.set(std::max(clock_.now(), ml_->next_deadline()));
            ml_->run_due_timers();
        }
        clock_.set(until);
    }

    std::vector<MemberEvent> events;

  private:
    ManualClock clock_;
    RecordingTransport transport_{clock_};
    std::unique_ptr<Memberlist> ml_;
};

// An encoded site state of one pool with `capacity`, naming site `id`.
inline std::vector<uint8_t> site_bytes(const std::string& id, uint32_t capacity) {
    SiteState s;
    s.site_id = id;
    PoolInfo p;
    p.model = "m";
    p.version_digest = "v";
    p.capacity = capacity;
    s.pools.push_back(p);
    return encode_site_state(s);
}

}  // namespace edge::routing::membership
