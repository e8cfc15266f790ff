// Failure detection: the probe round (direct ping, indirect pings, TCP fallback), relaying
// indirect pings for others, acks and nacks, and the Lifeguard awareness bookkeeping.

#include <algorithm>

#include "routing/membership/memberlist.h"

namespace edge::routing::membership {

std::vector<Memberlist::Member*> Memberlist::random_members(size_t k, const std::string& exclude,
                                                            bool include_dead) {
    // Rejection sampling over the probe order (every member but us): O(k) expected, which
    // matters when thousands of simulated members each gossip five times a second.
    std::vector<Member*> out;
    if (probe_order_.empty() || k == 0) {
        return out;
    }
    const TimePoint now = clock_.now();
    auto eligible = [&](Member& m) {
        if (m.name == exclude) {
            return false;
        }
        const bool live = m.state == NodeState::kAlive || m.state == NodeState::kSuspect;
        // The recently dead still hear gossip, so one that is alive learns it must refute; a
        // member that left said goodbye and has nothing to refute (memberlist skips it too).
        return live || (include_dead && m.state == NodeState::kDead &&
                        now - m.state_change <= config_.gossip_to_the_dead_time);
    };
    std::uniform_int_distribution<size_t> pick(0, probe_order_.size() - 1);
    const size_t tries = 3 * k + 3 * std::min<size_t>(probe_order_.size(), 64);
    for (size_t t = 0; t < tries && out.size() < k; ++t) {
        Member* m = find(probe_order_[pick(rng_)]);
        if (m != nullptr && eligible(*m) && std::find(out.begin(), out.end(), m) == out.end()) {
            out.push_back(m);
        }
    }
    if (out.size() < k && probe_order_.size() <= 4 * k + 64) {
        // Small or mostly-dead clusters: fall back to an exhaustive pass.
        for (const std::string& name : probe_order_) {
            Member* m = find(name);
            if (out.size() < k && m != nullptr && eligible(*m) &&
                std::find(out.begin(), out.end(), m) == out.end()) {
                out.push_back(m);
            }
        }
    }
    return out;
}

Memberlist::Member* Memberlist::next_probe_target() {
    for (size_t tries = 0; tries <= probe_order_.size() + 1; ++tries) {
        if (probe_index_ >= probe_order_.size()) {
            reap_dead();
            std::shuffle(probe_order_.begin(), probe_order_.end(), rng_);
            probe_index_ = 0;
            if (probe_order_.empty()) {
                return nullptr;
            }
        }
        Member* m = find(probe_order_[probe_index_++]);
        if (m != nullptr && (m->state == NodeState::kAlive || m->state == NodeState::kSuspect)) {
            return m;
        }
    }
    return nullptr;
}

void Memberlist::reap_dead() {
    const TimePoint now = clock_.now();
    std::vector<std::string> keep;
    keep.reserve(probe_order_.size());
    for (const std::string& name : probe_order_) {
        auto it = members_.find(name);
        if (it == members_.end()) {
            continue;
        }
        Member& m = it->second;
        const bool expired =
            (m.state == NodeState::kDead && now - m.state_change > config_.dead_reclaim_time) ||
            (m.state == NodeState::kLeft &&
             now - m.state_change > config_.gossip_to_the_dead_time);
        if (expired) {
            stats_.members_dead.fetch_sub(1);
            ++change_count_;
            members_.erase(it);
            continue;
        }
        keep.push_back(name);
    }
    probe_order_ = std::move(keep);
}

void Memberlist::probe_tick() {
    if (leaving_) {
        return;
    }
    const TimePoint now = clock_.now();
    // A failed round ends at the deadline of this tick, but its end timer was scheduled after
    // this tick's and so runs after it: conclude the round here, or it would look unfinished and
    // every failed probe would cost the next round. Its verdict may also stretch the interval
    // (awareness), so the next tick is scheduled after it.
    if (probe_ && !probe_->concluded && probe_->ends <= now) {
        timers_.cancel(probe_->end_timer);
        on_probe_end(probe_->seq);
    }
    const Duration interval = awareness_.scale_timeout(config_.probe_interval);
    timers_.schedule(now + interval, [this] { probe_tick(); });
    if (probe_ && !probe_->concluded) {
        return;  // the previous round still runs (its end timer concludes it)
    }
    Member* target = next_probe_target();
    if (target == nullptr) {
        return;
    }
    ProbeRound round;
    round.seq = ++seq_;
    round.target = target->name;
    round.sent = now;
    std::vector<std::vector<uint8_t>> msgs;
    msgs.push_back(encode_message(PingMsg{round.seq, target->name, config_.name,
                                          config_.advertise_addr}));
    if (target->state == NodeState::kSuspect) {
        // Buddy system: tell the suspect first, so it can refute before the timer runs out.
        msgs.push_back(encode_message(SuspectMsg{target->incarnation, target->name, config_.name}));
    }
    const uint64_t seq = round.seq;
    round.timeout_timer =
        timers_.schedule(now + config_.probe_timeout, [this, seq] { on_direct_timeout(seq); });
    round.ends = now + interval;
    round.end_timer = timers_.schedule(round.ends, [this, seq] { on_probe_end(seq); });
    probe_ = std::move(round);
    stats_.probes_sent.fetch_add(1);
    send_messages(target->addr, std::move(msgs));
}

void Memberlist::on_direct_timeout(uint64_t seq) {
    if (!probe_ || probe_->seq != seq || probe_->concluded) {
        return;
    }
    probe_->timed_out = true;
    Member* target = find(probe_->target);
    if (target == nullptr) {
        return;
    }
    const std::string target_addr = target->addr;
    auto helpers = random_members(config_.indirect_checks, probe_->target, false);
    for (Member* h : helpers) {
        if (h->state != NodeState::kAlive) {
            continue;
        }
        ++probe_->expected_nacks;
        send_messages(h->addr, {encode_message(IndirectPingMsg{seq, probe_->target, target_addr,
                                                               config_.name,
                                                               config_.advertise_addr, true})});
    }
    if (config_.tcp_fallback_probe) {
        const uint64_t id = ++next_stream_id_;
        streams_[id] = PendingStream{StreamKind::kFallbackPing, target_addr, probe_->target, seq};
        std::vector<std::vector<uint8_t>> ping{
            encode_message(PingMsg{seq, probe_->target, config_.name, config_.advertise_addr})};
        auto sealed = keyring_.seal(config_.label, encode_packet(ping));
        if (sealed.ok()) {
            stats_.bytes_sent.fetch_add(sealed->size());
            transport_.send_stream(target_addr, id, std::move(sealed).value());
        } else {
            streams_.erase(id);
        }
    }
}

void Memberlist::on_probe_end(uint64_t seq) {
    if (!probe_ || probe_->seq != seq || probe_->concluded) {
        return;
    }
    probe_->concluded = true;
    timers_.cancel(probe_->timeout_timer);
    // Lifeguard: missing nacks from helpers mean our own messages are not getting through, so
    // blame ourselves (stretch timeouts) rather than only the target.
    int delta = 1;
    if (probe_->expected_nacks > 0) {
        delta = static_cast<int>(probe_->expected_nacks - std::min(probe_->nacks,
                                                                   probe_->expected_nacks));
    }
    awareness_.apply_delta(delta);
    stats_.awareness = awareness_.score();
    stats_.probe_failures.fetch_add(1);
    Member* target = find(probe_->target);
    if (target == nullptr || target->state == NodeState::kDead ||
        target->state == NodeState::kLeft) {
        return;
    }
    if (target->state == NodeState::kAlive) {
        stats_.suspicions_raised.fetch_add(1);
    }
    handle_suspect(SuspectMsg{target->incarnation, target->name, config_.name});
}

void Memberlist::conclude_probe(bool direct, Duration rtt,
                                const std::optional<coords::Coordinate>& coord) {
    probe_->concluded = true;
    timers_.cancel(probe_->timeout_timer);
    timers_.cancel(probe_->end_timer);
    // Lifeguard: any ack, direct, relayed by a helper or over TCP, is a successful probe and
    // lowers the score. Only a failed round or missing nacks raise it (on_probe_end), so a member
    // that reaches a peer only indirectly still recovers its probe rate.
    awareness_.apply_delta(-1);
    stats_.awareness = awareness_.score();
    if (!direct) {
        return;
    }
    const auto us = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(rtt).count());
    stats_.probe_rtt_count.fetch_add(1);
    stats_.probe_rtt_sum_us.fetch_add(us);
    stats_.probe_rtt_last_us = us;
    if (coord) {
        Member* target = find(probe_->target);
        if (target != nullptr) {
            target->coord = *coord;
            if (vivaldi_.update(target->name, *coord, rtt).ok()) {
                ++change_count_;
            }
        }
    }
}

void Memberlist::handle_ping(const std::string& from, const PingMsg& p) {
    if (!p.target.empty() && p.target != config_.name) {
        return;  // meant for a previous owner of this address
    }
    const std::string& reply_to = p.source_addr.empty() ? from : p.source_addr;
    send_messages(reply_to, {encode_message(AckMsg{p.seq, vivaldi_.coordinate()})});
}

void Memberlist::handle_indirect_ping(const IndirectPingMsg& p) {
    if (p.source_addr.empty() || p.target_addr.empty()) {
        return;
    }
    const uint64_t local = ++seq_;
    Relay relay{p.seq, p.source_addr, p.want_nack, 0};
    // The prober asked after its direct wait (probe_timeout) and ends its round an interval after
    // its ping: a nack sent a whole probe_timeout after this request would come after the round,
    // where it counts as a helper that never answered and stretches the prober's timeouts for
    // nothing (every failed probe would blame all helpers, with the lan and wan presets). So the
    // nack goes out at 4/5 of what is left of the round (Lifeguard's relays do likewise), or at
    // probe_timeout when that is sooner; an ack that comes later is still passed on until then.
    const Duration nack_after =
        std::min(config_.probe_timeout, (config_.probe_interval - config_.probe_timeout) * 4 / 5);
    relay.timer = timers_.schedule(clock_.now() + nack_after, [this, local, nack_after] {
        auto it = relays_.find(local);
        if (it == relays_.end()) {
            return;
        }
        if (it->second.want_nack) {
            send_messages(it->second.source_addr, {encode_message(NackMsg{it->second.orig_seq})});
            it->second.want_nack = false;
        }
        const Duration rest = config_.probe_timeout - nack_after;
        if (rest <= Duration::zero()) {
            relays_.erase(it);
            return;
        }
        it->second.timer =
            timers_.schedule(clock_.now() + rest, [this, local] { relays_.erase(local); });
    });
    relays_.emplace(local, std::move(relay));
    send_messages(p.target_addr, {encode_message(PingMsg{local, p.target, config_.name,
                                                         config_.advertise_addr})});
}

void Memberlist::handle_ack(const AckMsg& a, bool direct) {
    if (probe_ && probe_->seq == a.seq) {
        if (!probe_->concluded) {
            conclude_probe(direct && !probe_->timed_out, clock_.now() - probe_->sent, a.coord);
        }
        return;
    }
    auto it = relays_.find(a.seq);
    if (it != relays_.end()) {
        timers_.cancel(it->second.timer);
        const Relay relay = it->second;
        relays_.erase(it);
        send_messages(relay.source_addr, {encode_message(AckMsg{relay.orig_seq, std::nullopt})});
    }
}

void Memberlist::handle_nack(const NackMsg& n) {
    if (probe_ && probe_->seq == n.seq && !probe_->concluded) {
        ++probe_->nacks;
    }
}

}  // namespace edge::routing::membership
