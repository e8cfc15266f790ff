// Dissemination and I/O: gossip rounds, push-pull full-state exchange, user events, and turning
// packets and stream frames into messages (authenticate first, then decode, then dispatch).

#include <algorithm>
#include <filesystem>

#include "common/log.h"
#include "routing/membership/memberlist.h"
#include "routing/membership/timing.h"

namespace edge::routing::membership {

namespace {

// A user event Lamport clock rises by one per event sent anywhere in the cluster (rollout
// intents: a handful a day), so two members' clocks differ by the events one has seen and the
// other not yet, far below this. A time this far past a member's clock was not reached that way
// (forged or corrupt): witnessed near the decoder's cap, it would carry every member's clock
// there by push-pull, and send_user_event would refuse in the whole cluster for good.
constexpr uint64_t kMaxEventLtimeStep = uint64_t{1} << 32;

// Bytes of name and payload a user event may carry: what send_user_event lets into one gossip
// packet (`packet_budget`: the mtu less sealing and the version byte). The receiver holds an
// event to the same bound: one far larger (a stream's push-pull carries up to max_stream_bytes)
// would be kept for user_event_buffer events and sent in every push-pull, each then too large.
size_t user_event_budget(size_t packet_budget) { return packet_budget - kMessageOverhead - 32; }

// Whether `ltime` lies below the window of the newest `buffer` Lamport times up to `clock`: the
// member remembers only events in it, so it cannot tell whether one below was delivered.
bool below_event_window(uint64_t ltime, uint64_t clock, size_t buffer) {
    return clock >= buffer && ltime <= clock - buffer;
}

std::string event_key(const UserEventMsg& e) {
    std::string key = std::to_string(e.ltime) + '\0' + e.name + '\0';
    key.append(e.payload.begin(), e.payload.end());
    return key;
}

}  // namespace

void Memberlist::send_messages(const std::string& addr,
                               std::vector<std::vector<uint8_t>> framed) {
    const size_t budget = packet_budget();
    size_t used = 0;
    for (const auto& f : framed) {
        used += f.size();
    }
    if (used < budget) {
        // Piggyback pending broadcasts on whatever we send.
        auto extra = broadcasts_.get_broadcasts(0, budget - used, live_count_, budget);
        for (auto& e : extra) {
            framed.push_back(std::move(e));
        }
    }
    auto sealed = keyring_.seal(config_.label, encode_packet(framed));
    if (!sealed.ok()) {
        log::error("gossip_seal_failed", {{"error", sealed.status().to_string()}});
        return;
    }
    stats_.packets_sent.fetch_add(1);
    stats_.bytes_sent.fetch_add(sealed->size());
    transport_.send_packet(addr, std::move(sealed).value());
}

void Memberlist::gossip_tick() {
    const TimePoint now = clock_.now();
    timers_.schedule(now + config_.gossip_interval, [this] { gossip_tick(); });
    if (broadcasts_.size() == 0) {
        return;
    }
    const size_t budget = packet_budget();
    for (Member* m : random_members(config_.gossip_nodes, {}, true)) {
        auto msgs = broadcasts_.get_broadcasts(0, budget, live_count_, budget);
        if (msgs.empty()) {
            return;
        }
        auto sealed = keyring_.seal(config_.label, encode_packet(msgs));
        if (!sealed.ok()) {
            return;
        }
        stats_.packets_sent.fetch_add(1);
        stats_.bytes_sent.fetch_add(sealed->size());
        transport_.send_packet(m->addr, std::move(sealed).value());
    }
}

void Memberlist::push_pull_tick() {
    const TimePoint now = clock_.now();
    timers_.schedule(now + push_pull_scale(config_.push_pull_interval, live_count_),
                     [this] { push_pull_tick(); });
    if (leaving_) {
        return;
    }
    auto peers = random_members(1, {}, false);
    if (!peers.empty() && peers[0]->state == NodeState::kAlive) {
        start_push_pull(peers[0]->addr, StreamKind::kPushPull, {});
    }
    // Alone again (everyone else died or left): go back to retrying the seeds.
    schedule_join_retry();
}

void Memberlist::try_join() {
    auto join_one = [&](const std::string& addr) {
        const bool in_flight = std::any_of(streams_.begin(), streams_.end(), [&](const auto& s) {
            return s.second.kind == StreamKind::kJoin && s.second.addr == addr;
        });
        if (!in_flight) {
            start_push_pull(addr, StreamKind::kJoin, {});
        }
    };
    for (const std::string& addr : seeds_) {
        join_one(addr);
    }
    for (const GossipSnapshot::Member& m : restored_) {
        join_one(m.addr);
    }
    schedule_join_retry();
}

void Memberlist::schedule_join_retry() {
    if ((seeds_.empty() && restored_.empty()) || leaving_ || live_count_ > 1 ||
        join_retry_timer_ != 0) {
        return;
    }
    join_retry_timer_ =
        timers_.schedule(clock_.now() + join_backoff_, [this] { join_retry_tick(); });
}

void Memberlist::join_retry_tick() {
    join_retry_timer_ = 0;
    if (leaving_) {
        return;
    }
    if (live_count_ > 1) {
        // Joined: the next time we are alone, retries start again from the shortest wait.
        join_backoff_ = config_.join_retry_interval;
        return;
    }
    join_backoff_ = std::min(join_backoff_ * 2, config_.join_retry_max_interval);
    try_join();
}

void Memberlist::reconnect_tick() {
    timers_.schedule(clock_.now() + config_.reconnect_interval, [this] { reconnect_tick(); });
    if (leaving_) {
        return;
    }
    std::vector<const Member*> failed;
    std::vector<const std::string*> lost_seeds;
    for (const std::string& seed : seeds_) {
        lost_seeds.push_back(&seed);
    }
    for (const auto& [name, m] : members_) {
        if (m.state == NodeState::kDead) {
            failed.push_back(&m);
        }
        if (m.state == NodeState::kAlive || m.state == NodeState::kSuspect) {
            // A name, not the binding: clang before 16 cannot capture a structured binding.
            const std::string& addr = m.addr;
            std::erase_if(lost_seeds, [&](const std::string* s) {
                if (*s == addr) {
                    return true;
                }
                // A host-name seed: found while the member that answered it lives.
                auto it = seed_peers_.find(*s);
                return it != seed_peers_.end() && it->second == addr;
            });
        }
    }
    // A seed that left (a graceful restart) is forgotten, and it may know nobody when it comes
    // back; ask one seed that is not a live member. While alone, try_join does this already.
    if (!lost_seeds.empty() && live_count_ > 1) {
        std::uniform_int_distribution<size_t> pick_seed(0, lost_seeds.size() - 1);
        start_push_pull(*lost_seeds[pick_seed(rng_)], StreamKind::kPushPull, {});
    }
    if (failed.empty()) {
        return;
    }
    std::sort(failed.begin(), failed.end(),
              [](const Member* a, const Member* b) { return a->name < b->name; });
    std::uniform_int_distribution<size_t> pick(0, failed.size() - 1);
    start_push_pull(failed[pick(rng_)]->addr, StreamKind::kPushPull, {});
}

void Memberlist::note_seed_peer(const std::string& seed, const std::string& peer) {
    if (peer == config_.advertise_addr) {
        // A snapshot member that was this member (its address reused by another name).
        std::erase_if(restored_, [&](const GossipSnapshot::Member& m) { return m.addr == seed; });
    }
    auto it = std::find(seeds_.begin(), seeds_.end(), seed);
    if (it == seeds_.end()) {
        return;
    }
    if (peer == config_.advertise_addr) {
        // This member under another name (a host name join() could not tell apart): nothing to
        // join through, and never a lost seed.
        seeds_.erase(it);
        seed_peers_.erase(seed);
        return;
    }
    seed_peers_[seed] = peer;
}

PushPullNode Memberlist::push_pull_node(const Member& m) const {
    const bool self = m.name == config_.name;
    PushPullNode n;
    n.name = m.name;
    n.addr = m.addr;
    n.incarnation = self ? incarnation_ : m.incarnation;
    n.state = self && leaving_ ? NodeState::kLeft : m.state;
    // The receiver orders the state by (incarnation, state_version): send it only under the
    // incarnation it was published in. A state held from an older incarnation goes as the
    // announced version alone, which makes the receiver fetch it from its owner.
    if (m.site_incarnation == n.incarnation) {
        n.state_version = m.site_version;
        n.site_state = m.site_bytes;
    } else {
        n.state_version = m.state_version;
    }
    n.coord = self ? std::optional(vivaldi_.coordinate()) : m.coord;
    return n;
}

PushPullMsg Memberlist::local_push_pull(bool join) const {
    PushPullMsg pp;
    pp.join = join;
    pp.nodes.reserve(members_.size());
    for (const auto& [name, m] : members_) {
        pp.nodes.push_back(push_pull_node(m));
    }
    pp.event_ltime = event_clock_;
    pp.events.assign(recent_events_.begin(), recent_events_.end());
    if (local_state_) {
        pp.app_state = local_state_();
        if (pp.app_state.size() > kMaxPushPullAppState) {
            // Every receiver would refuse the whole push-pull; sync without it instead.
            log::error("gossip_app_state_too_large",
                       {{"bytes", static_cast<uint64_t>(pp.app_state.size())}});
            pp.app_state.clear();
        }
    }
    return pp;
}

void Memberlist::start_push_pull(const std::string& addr, StreamKind kind,
                                 const std::string& node) {
    PushPullMsg pp;
    if (kind == StreamKind::kFetch) {
        // One member's entry, not two whole tables: a site state over the inline limit is
        // fetched by every other member each time it changes (up to once a second, with load).
        pp.fetch = node;
    } else {
        pp = local_push_pull(kind == StreamKind::kJoin);
    }
    std::vector<std::vector<uint8_t>> msg{encode_message(pp)};
    auto sealed = keyring_.seal(config_.label, encode_packet(msg));
    if (!sealed.ok()) {
        return;
    }
    const uint64_t id = ++next_stream_id_;
    streams_[id] = PendingStream{kind, addr, node, 0};
    if (kind == StreamKind::kFetch) {
        ++fetches_in_flight_;
    }
    stats_.push_pulls.fetch_add(1);
    stats_.bytes_sent.fetch_add(sealed->size());
    transport_.send_stream(addr, id, std::move(sealed).value());
}

void Memberlist::merge_push_pull(const PushPullMsg& pp, bool full_state) {
    for (const PushPullNode& n : pp.nodes) {
        switch (n.state) {
            case NodeState::kAlive: {
                AliveMsg a{n.incarnation, n.name, n.addr, n.state_version, std::nullopt};
                if (!n.site_state.empty()) {
                    a.state = n.site_state;
                }
                handle_alive(a);
                break;
            }
            case NodeState::kSuspect:
            case NodeState::kDead:
                // A remote death is only a suspicion here: we run our own timer, so one member's
                // stale view cannot kill a live member that refutes in time.
                handle_suspect(SuspectMsg{n.incarnation, n.name, config_.name});
                break;
            case NodeState::kLeft:
                handle_dead(DeadMsg{n.incarnation, n.name, n.name});
                break;
        }
        Member* m = find(n.name);
        if (m != nullptr && n.name != config_.name) {
            if (n.coord && !m->coord) {
                m->coord = n.coord;
            }
            // As in handle_alive: a member that died or left keeps the state it went with. And
            // only a state of an incarnation taken above: one the handlers dropped (implausibly
            // far ahead) would otherwise outrank every state the member publishes from then on.
            // One below the member's current life (a sender that missed its restart) is refused
            // by apply_site_bytes.
            // Nor a state from another address than the member's: handle_alive refused that
            // claim to its name (a second process with it).
            const bool live = m->state == NodeState::kAlive || m->state == NodeState::kSuspect;
            if (live && n.addr == m->addr && n.incarnation <= m->incarnation &&
                !n.site_state.empty()) {
                apply_site_bytes(*m, n.incarnation, n.state_version, n.site_state);
            }
        }
    }
    // The sender's clock first: its events lie below it, so within the step once it is taken.
    const bool clock_taken = witness_ltime(pp.event_ltime, full_state);
    for (const UserEventMsg& e : pp.events) {
        handle_user_event(e);
    }
    // The application's state after the events (it holds what they said, and more), and only
    // with a clock taken: its times lie at or below the sender's clock, so within ours now.
    if (full_state && clock_taken && merge_state_ && !pp.app_state.empty()) {
        merge_state_(pp.app_state, pp.event_ltime);
    }
}

bool Memberlist::witness_ltime(uint64_t ltime, bool sync) {
    // A member that never synced (just started, its clock at 0) takes the first full state's
    // clock however far ahead, or it could not join a cluster whose clock is legitimately past
    // the step. That trusts one exchange per process life, and only a push-pull, never gossip (a
    // packet any member may send at any time): a time forged into it reaches no synced member,
    // which refuses this member's clock and events from then on. A lone member is unsynced too
    // until another joins it: that is how a restarted seed takes the cluster's clock.
    const bool jump = sync && !event_clock_synced_;
    if (!jump && ltime > event_clock_ && ltime - event_clock_ > kMaxEventLtimeStep) {
        stats_.implausible_dropped.fetch_add(1);
        return false;
    }
    event_clock_ = std::max(event_clock_, ltime);
    return true;
}

Status Memberlist::send_user_event(const std::string& name, std::vector<uint8_t> payload) {
    if (name.empty() || name.size() > 255) {
        return invalid_argument_error("user event name must be 1..255 bytes");
    }
    if (name.size() + payload.size() > user_event_budget(packet_budget())) {
        return invalid_argument_error("user event of " + std::to_string(payload.size()) +
                                      " bytes does not fit one gossip packet");
    }
    // The decoder caps what the clock can witness below kMaxEventLtime; the last time below it
    // is as far as it goes (an event at the cap would be refused by every receiver, and one
    // wrapped to 0 dropped as too old).
    if (event_clock_ >= kMaxEventLtime - 1) {
        return resource_exhausted_error("user event Lamport clock at " +
                                        std::to_string(event_clock_) +
                                        ", the most the cluster accepts (2^62 - 1): a member "
                                        "witnessed a time no honest cluster reaches");
    }
    UserEventMsg e{++event_clock_, name, std::move(payload)};
    handle_user_event(e);
    return ok_status();
}

void Memberlist::restore_snapshot() {
    const std::string& path = config_.snapshot_file;
    Result<GossipSnapshot> snap = read_gossip_snapshot(path);
    if (!snap.ok()) {
        std::error_code ec;
        const bool absent = snap.status().code() == StatusCode::kNotFound &&
                            !std::filesystem::exists(std::filesystem::symlink_status(path, ec));
        if (absent) {
            log::info("gossip_snapshot_none",
                      {{"path", path},
                       {"detail", "no snapshot yet (first start): the event clock starts at 0"}});
        } else {
            log::warn("gossip_snapshot_ignored",
                      {{"path", path},
                       {"error", snap.status().to_string()},
                       {"detail", "starting without it: the event clock at 0, only the "
                                  "gossip.join seeds; it is written anew within a second"}});
        }
        return;
    }
    // Unsynced still (witness_ltime takes the first full state's clock however far ahead): the
    // cluster may have moved on meanwhile. But a member that joins this one takes this clock,
    // not 0.
    event_clock_ = snap->event_clock;
    for (GossipSnapshot::Member& m : snap->members) {
        const bool dup = std::any_of(restored_.begin(), restored_.end(),
                                     [&](const auto& r) { return r.addr == m.addr; });
        if (m.addr != config_.advertise_addr && m.name != config_.name && !dup) {
            restored_.push_back(std::move(m));
        }
    }
    log::info("gossip_snapshot_restored", {{"path", path},
                                           {"event_clock", event_clock_},
                                           {"members", static_cast<uint64_t>(restored_.size())}});
}

void Memberlist::expire_restored() {
    // A restored member that never answered (decommissioned while this site was down, so never
    // heard of as dead or left) would otherwise be joined, and written back while this site is
    // alone, without end: a site with no join list would refuse rollouts as not yet back in its
    // cluster across every restart. By now any member still in the cluster would have reclaimed
    // it as failed.
    std::string expired;
    std::erase_if(restored_, [&](const GossipSnapshot::Member& r) {
        const auto it = members_.find(r.name);
        const bool alive = it != members_.end() && (it->second.state == NodeState::kAlive ||
                                                    it->second.state == NodeState::kSuspect);
        if (!alive) {
            expired += (expired.empty() ? "" : ",") + r.name + "@" + r.addr;
        }
        return !alive;
    });
    if (expired.empty()) {
        return;
    }
    log::warn("gossip_snapshot_members_expired",
              {{"members", expired},
               {"after_s", to_seconds(config_.dead_reclaim_time)},
               {"left", static_cast<uint64_t>(restored_.size())},
               {"detail", "members restored from the gossip snapshot that have not answered "
                          "are no longer joined nor saved"}});
    if (snapshot_writer_ && !leaving_) {
        post_snapshot();
    }
}

void Memberlist::snapshot_tick() {
    if (leaving_) {
        return;  // leave() posted the last one.
    }
    timers_.schedule(clock_.now() + config_.snapshot_interval, [this] { snapshot_tick(); });
    if (change_count_ != snapshot_change_ || event_clock_ != snapshot_clock_) {
        post_snapshot();
    }
}

void Memberlist::post_snapshot() {
    snapshot_change_ = change_count_;
    snapshot_clock_ = event_clock_;
    // A restored member since seen to leave or die is no way back into the cluster any more
    // (serf's snapshot drops left and failed members too). Written back while this site is
    // alone, a site with no gossip.join would wait for it after its next restart without end,
    // refusing rollouts as not yet back in its cluster.
    std::erase_if(restored_, [&](const GossipSnapshot::Member& r) {
        const auto it = members_.find(r.name);
        return it != members_.end() &&
               (it->second.state == NodeState::kDead || it->second.state == NodeState::kLeft);
    });
    GossipSnapshot snap;
    snap.event_clock = event_clock_;
    for (const auto& [name, m] : members_) {
        if (name != config_.name &&
            (m.state == NodeState::kAlive || m.state == NodeState::kSuspect)) {
            snap.members.push_back({m.name, m.addr});
        }
    }
    if (snap.members.empty()) {
        // Alone (not back in the cluster yet, or all the others gone): keep the members to find
        // it again after a restart.
        snap.members = restored_;
    }
    std::sort(snap.members.begin(), snap.members.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
    std::string text = encode_gossip_snapshot(snap);
    if (text == snapshot_posted_) {
        return;
    }
    // Built here (small: at most kMaxSnapshotMembers lines), written on the writer's thread: its
    // fsyncs never hold up the strand. A failed write is the writer's to log and retry.
    snapshot_posted_ = text;
    snapshot_writer_->post(std::move(text));
}

Status Memberlist::flush_snapshot(Duration timeout) const {
    return snapshot_writer_ ? snapshot_writer_->flush(timeout) : ok_status();
}

void Memberlist::set_snapshot_write_for_testing(SnapshotWriter::WriteFn write) {
    if (snapshot_writer_) {
        snapshot_writer_ =
            std::make_unique<SnapshotWriter>(config_.snapshot_file, std::move(write));
    }
}

bool Memberlist::remember_event(const UserEventMsg& e) {
    std::string key = event_key(e);
    if (seen_events_.contains(key)) {
        return false;
    }
    // Forgotten by Lamport time, not by arrival: handle_user_event drops an event below the
    // window unseen, so one in it must stay seen, or a push-pull from a member one event behind
    // delivered (and rebroadcast) again what this member had forgotten first.
    const auto forget = [&](std::deque<UserEventMsg>::iterator it) {
        seen_events_.erase(event_key(*it));
        return recent_events_.erase(it);
    };
    for (auto it = recent_events_.begin(); it != recent_events_.end();) {
        it = below_event_window(it->ltime, event_clock_, config_.user_event_buffer) ? forget(it)
                                                                                     : ++it;
    }
    // At most user_event_buffer (what a push-pull may carry): more fall in the window only when
    // events share Lamport times. Once the ring is full only an event newer than its oldest gets
    // in, the oldest going; one not newer is refused (and not seen) as one below the window is.
    // Taken, one older than the whole ring was forgotten in the same call that reported it
    // delivered, and one at the oldest time pushed out another of that time, which the next
    // push-pull carrying it delivered again, pushing this one out in turn: both delivered anew
    // at every push-pull of a quiet cluster.
    while (recent_events_.size() >= config_.user_event_buffer) {
        const auto oldest = std::min_element(
            recent_events_.begin(), recent_events_.end(),
            [](const UserEventMsg& a, const UserEventMsg& b) { return a.ltime < b.ltime; });
        if (e.ltime <= oldest->ltime) {
            return false;
        }
        forget(oldest);
    }
    seen_events_.insert(std::move(key));
    recent_events_.push_back(e);
    return true;
}

void Memberlist::handle_user_event(const UserEventMsg& e) {
    // Held to what a sender lets out (send_user_event): the decoder bounds a name only.
    if (e.name.empty() || e.name.size() > 255 ||
        e.name.size() + e.payload.size() > user_event_budget(packet_budget())) {
        stats_.decode_failures.fetch_add(1);
        return;
    }
    // Lamport witness: our clock passes every time we have seen (but an implausible one).
    if (!witness_ltime(e.ltime)) {
        return;
    }
    // Older than our window: we cannot tell whether it was delivered, so drop it (serf does).
    if (below_event_window(e.ltime, event_clock_, config_.user_event_buffer)) {
        return;
    }
    if (!remember_event(e)) {
        return;
    }
    stats_.user_events_delivered.fetch_add(1);
    broadcast({}, e);
    if (on_user_event_) {
        on_user_event_(e);
    }
}

bool Memberlist::warn_allowed(std::string_view kind, const std::string& from,
                              uint64_t& suppressed) {
    const TimePoint now = clock_.now();
    if (warned_.size() > 1024) {  // Many senders (a scan): forget the quiet ones.
        std::erase_if(warned_, [&](const auto& e) { return now - e.second.last >= kWarnInterval; });
        if (warned_.size() > 1024) {
            warned_.clear();
        }
    }
    // By host: a sender's streams come from ever new ports.
    const std::string_view host = std::string_view(from).substr(0, from.rfind(':'));
    auto [it, fresh] = warned_.try_emplace(std::string(kind) + " " + std::string(host));
    WarnState& w = it->second;
    if (!fresh && now - w.last < kWarnInterval) {
        ++w.suppressed;
        return false;
    }
    w.last = now;
    suppressed = w.suppressed;
    w.suppressed = 0;
    return true;
}

void Memberlist::warn_auth_failed(const std::string& from, const Status& error) {
    const std::string sender = from.empty() ? std::string("(stream response)") : from;
    uint64_t suppressed = 0;
    if (!warn_allowed("auth", sender, suppressed)) {
        return;
    }
    log::warn("gossip_auth_failed",
              {{"from", sender},
               {"error", error.to_string()},
               {"suppressed", suppressed},
               {"detail", "no accepted gossip key opens it: the sender's gossip.keys (or "
                          "label) differ from this site's"}});
}

Result<std::vector<Message>> Memberlist::open_and_decode(std::span<const uint8_t> bytes,
                                                         const std::string& from,
                                                         size_t max_messages) {
    auto plain = keyring_.open(config_.label, bytes);
    if (!plain.ok()) {
        stats_.auth_failures.fetch_add(1);
        warn_auth_failed(from, plain.status());
        return plain.status();
    }
    // Decoded up to the larger of this site's caps and the defaults, which apply their own as
    // they merge: a site configured lower than the cluster's table still syncs what it keeps
    // (new members past max_members are refused as alive messages naming them are).
    const DecodeLimits defaults;
    auto msgs = decode_packet(
        *plain,
        DecodeLimits{std::max(config_.max_members, defaults.max_push_pull_nodes),
                     std::max(config_.user_event_buffer, defaults.max_push_pull_events),
                     max_messages});
    uint64_t suppressed = 0;
    if (!msgs.ok()) {
        stats_.decode_failures.fetch_add(1);
        if (warn_allowed("decode", from, suppressed)) {
            log::warn("gossip_undecodable",
                      {{"from", from.empty() ? std::string("(stream response)") : from},
                       {"error", msgs.status().to_string()},
                       {"suppressed", suppressed},
                       {"detail", "authenticated, but not a message this version reads"}});
        }
    }
    return msgs;
}

void Memberlist::dispatch(const std::string& from, const Message& m) {
    std::visit(
        [&](const auto& v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, PingMsg>) {
                handle_ping(from, v);
            } else if constexpr (std::is_same_v<T, IndirectPingMsg>) {
                handle_indirect_ping(v);
            } else if constexpr (std::is_same_v<T, AckMsg>) {
                handle_ack(v, true);
            } else if constexpr (std::is_same_v<T, NackMsg>) {
                handle_nack(v);
            } else if constexpr (std::is_same_v<T, SuspectMsg>) {
                handle_suspect(v, &from);
            } else if constexpr (std::is_same_v<T, AliveMsg>) {
                handle_alive(v);
            } else if constexpr (std::is_same_v<T, DeadMsg>) {
                handle_dead(v, &from);
            } else if constexpr (std::is_same_v<T, UserEventMsg>) {
                handle_user_event(v);
            } else if constexpr (std::is_same_v<T, PushPullMsg>) {
                // Full state only travels over streams.
            }
        },
        m);
}

void Memberlist::handle_packet(const std::string& from, std::span<const uint8_t> bytes) {
    stats_.packets_received.fetch_add(1);
    stats_.bytes_received.fetch_add(bytes.size());
    auto msgs = open_and_decode(bytes, from, kMaxMessagesPerPacket);
    if (!msgs.ok()) {
        log::debug("gossip_packet_dropped",
                   {{"from", from}, {"error", msgs.status().to_string()}});
        return;
    }
    for (const Message& m : *msgs) {
        dispatch(from, m);
    }
}

Result<std::vector<uint8_t>> Memberlist::handle_stream(const std::string& from,
                                                       std::span<const uint8_t> bytes) {
    stats_.bytes_received.fetch_add(bytes.size());
    // A stream is one request (a push-pull or a fallback ping), answered once: each push-pull
    // in it would be answered with the whole cluster's state. A second message is refused before
    // it is decoded.
    auto msgs = open_and_decode(bytes, from, 1);
    if (!msgs.ok()) {
        return msgs.status().with_context("gossip stream from " + from);
    }
    std::vector<std::vector<uint8_t>> reply;
    for (const Message& m : *msgs) {
        if (const auto* pp = std::get_if<PushPullMsg>(&m)) {
            merge_push_pull(*pp, pp->fetch.empty());
            if (pp->fetch.empty()) {
                event_clock_synced_ = true;  // A full state: the sender's clock came with it.
                reply.push_back(encode_message(local_push_pull(false)));
            } else {
                PushPullMsg one;
                if (const Member* wanted = find(pp->fetch)) {
                    one.nodes.push_back(push_pull_node(*wanted));
                }
                reply.push_back(encode_message(one));
            }
        } else if (const auto* ping = std::get_if<PingMsg>(&m)) {
            if (ping->target.empty() || ping->target == config_.name) {
                reply.push_back(encode_message(AckMsg{ping->seq, vivaldi_.coordinate()}));
            }
        } else {
            dispatch(from, m);
        }
    }
    if (reply.empty()) {
        return invalid_argument_error("gossip stream from " + from + " asked for nothing");
    }
    auto sealed = keyring_.seal(config_.label, encode_packet(reply));
    if (sealed.ok()) {
        stats_.bytes_sent.fetch_add(sealed->size());
    }
    return sealed;
}

void Memberlist::handle_stream_response(uint64_t id, Result<std::vector<uint8_t>> response,
                                        const std::string& peer) {
    auto it = streams_.find(id);
    if (it == streams_.end()) {
        return;
    }
    const PendingStream pending = it->second;
    streams_.erase(it);
    if (pending.kind == StreamKind::kFetch) {
        --fetches_in_flight_;
    }
    if (!response.ok()) {
        stats_.stream_failures.fetch_add(1);
        if (pending.kind == StreamKind::kFetch) {
            if (Member* m = find(pending.node)) {
                m->fetch_pending = false;
            }
        }
        if (pending.kind == StreamKind::kJoin) {
            if (!join_failure_logged_) {
                join_failure_logged_ = true;
                log::warn("gossip_join_failed",
                          {{"seed", pending.addr},
                           {"error", response.status().to_string()},
                           {"retry", "with backoff while no other member is known"}});
            } else {
                log::debug("gossip_join_failed",
                           {{"seed", pending.addr}, {"error", response.status().to_string()}});
            }
        }
        return;
    }
    stats_.bytes_received.fetch_add(response->size());
    // An answer is one message, as its request was (handle_stream).
    auto msgs = open_and_decode(*response, pending.addr, 1);
    if (!msgs.ok()) {
        if (pending.kind == StreamKind::kFetch) {
            if (Member* m = find(pending.node)) {
                m->fetch_pending = false;
            }
        }
        return;
    }
    if (!peer.empty() &&
        (pending.kind == StreamKind::kJoin || pending.kind == StreamKind::kPushPull)) {
        note_seed_peer(pending.addr, peer);
    }
    if (pending.kind == StreamKind::kJoin && join_failure_logged_) {
        join_failure_logged_ = false;
        log::info("gossip_joined", {{"seed", pending.addr}});
    }
    for (const Message& m : *msgs) {
        if (const auto* pp = std::get_if<PushPullMsg>(&m)) {
            merge_push_pull(*pp, pending.kind != StreamKind::kFetch);
            // A fetch's answer is one member's entry, without the peer's clock.
            event_clock_synced_ = event_clock_synced_ || pending.kind != StreamKind::kFetch;
        } else if (const auto* ack = std::get_if<AckMsg>(&m)) {
            // A TCP fallback ack proves the target alive, but its RTT is not a UDP RTT.
            handle_ack(AckMsg{ack->seq, std::nullopt}, false);
        }
    }
    if (pending.kind == StreamKind::kFetch) {
        if (Member* m = find(pending.node)) {
            m->fetch_pending = false;
        }
    }
}

}  // namespace edge::routing::membership
