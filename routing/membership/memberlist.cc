#include "routing/membership/memberlist.h"

#include <boost/asio/ip/address.hpp>

#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>

#include "common/log.h"
#include "routing/membership/membership_service.h"  // split_host_port
#include "routing/membership/timing.h"

namespace edge::routing::membership {

namespace {

// Site state order: a newer incarnation wins whatever its version (a restarted member counts
// versions from 1 again), and within one incarnation the higher version wins.
bool newer_site_state(uint64_t incarnation, uint64_t version, uint64_t held_incarnation,
                      uint64_t held_version) {
    return std::tie(incarnation, version) > std::tie(held_incarnation, held_version);
}

// Incarnations grow by one a refutation or state change, and a process life starts below this
// (MembershipConfig::initial_incarnation): one this far past the incarnation known for a member
// was not reached that way. Taken, a forged accusation near the cap would pin the member there,
// where its refutations can no longer out-bid it.
constexpr uint64_t kMaxIncarnationStep = uint64_t{1} << 32;

bool implausible_incarnation(uint64_t known, uint64_t claimed) {
    return claimed > known && claimed - known > kMaxIncarnationStep;
}

// The same for a member not known yet, measured from 0: each life starts below 2^32
// (MembershipConfig::validate; the service starts it at the wall-clock second) and adds one a
// publish or refutation, so none passes kMaxIncarnationStep for decades, and the real member,
// whatever its own incarnation, refutes an accusation up to there. Taken higher, a forged alive
// for a site not known yet (new, or reaped after it left) held it at the forged address, above
// every alive of its own and past what it refutes: probed there in vain, it stayed dead until
// dead_reclaim_time.
bool implausible_first_incarnation(uint64_t claimed) {
    return implausible_incarnation(0, claimed);
}

// A packet's source address ("a.b.c.d:port" or "[v6]:port") as a member advertising that
// endpoint writes it: an IPv4-mapped IPv6 address as the IPv4 one (a site bound to `::` sees its
// IPv4 peers' packets come from [::ffff:a.b.c.d]:port), IPv6 in its canonical text; the source
// as it is when it does not parse.
std::string source_as_advertised(const std::string& source) {
    auto host_port = split_host_port(source);
    if (!host_port.ok()) {
        return source;
    }
    boost::system::error_code ec;
    auto ip = boost::asio::ip::make_address(host_port->first, ec);
    if (ec) {
        return source;
    }
    if (ip.is_v6() && ip.to_v6().is_v4_mapped()) {
        ip = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, ip.to_v6());
    }
    const std::string port = std::to_string(host_port->second);
    return ip.is_v4() ? ip.to_string() + ":" + port : "[" + ip.to_string() + "]:" + port;
}

}  // namespace

Result<std::unique_ptr<Memberlist>> Memberlist::create(MembershipConfig config, Keyring keyring,
                                                       Clock& clock, Transport& transport,
                                                       SiteState initial_state) {
    EDGE_RETURN_IF_ERROR(config.validate());
    if (initial_state.site_id.empty()) {
        initial_state.site_id = config.name;
    } else if (initial_state.site_id != config.name) {
        return invalid_argument_error("memberlist: the site state's id '" + initial_state.site_id +
                                      "' is not the member name '" + config.name + "'");
    }
    std::unique_ptr<Memberlist> m(new Memberlist(std::move(config), std::move(keyring), clock,
                                                 transport));
    m->site_ = std::move(initial_state);
    Member self;
    self.name = m->config_.name;
    self.addr = m->config_.advertise_addr;
    self.state_change = clock.now();
    self.life = ++m->lives_begun_;
    m->members_.emplace(self.name, std::move(self));
    m->live_count_ = 1;
    m->stats_.members_alive = 1;
    m->incarnation_ = m->config_.initial_incarnation;
    m->publish_local_state();
    m->broadcasts_.clear();  // nobody to tell yet; join() announces us
    if (!m->config_.snapshot_file.empty()) {
        m->restore_snapshot();
        m->snapshot_writer_ = std::make_unique<SnapshotWriter>(m->config_.snapshot_file);
    }
    return m;
}

Memberlist::Memberlist(MembershipConfig config, Keyring keyring, Clock& clock,
                       Transport& transport)
    : config_(std::move(config)),
      keyring_(std::move(keyring)),
      clock_(clock),
      transport_(transport),
      rng_(config_.seed),
      awareness_(config_.awareness_max_multiplier),
      // Events beyond the newest user_event_buffer are past the window this member remembers.
      broadcasts_(config_.retransmit_mult, config_.user_event_buffer),
      vivaldi_(config_.vivaldi, config_.seed ^ 0x9e3779b97f4a7c15ull) {}

Memberlist::~Memberlist() = default;

void Memberlist::start() {
    if (started_) {
        return;
    }
    started_ = true;
    const TimePoint now = clock_.now();
    // Random phases so members started together do not probe and gossip in lockstep.
    std::uniform_int_distribution<int64_t> phase(0, config_.probe_interval.count());
    timers_.schedule(now + Duration(phase(rng_)), [this] { probe_tick(); });
    std::uniform_int_distribution<int64_t> gphase(0, config_.gossip_interval.count());
    timers_.schedule(now + Duration(gphase(rng_)), [this] { gossip_tick(); });
    const Duration pp = push_pull_scale(config_.push_pull_interval, live_count_);
    std::uniform_int_distribution<int64_t> pphase(0, pp.count());
    timers_.schedule(now + pp / 2 + Duration(pphase(rng_)) / 2, [this] { push_pull_tick(); });
    timers_.schedule(now + config_.reconnect_interval, [this] { reconnect_tick(); });
    if (!config_.snapshot_file.empty()) {
        timers_.schedule(now + config_.snapshot_interval, [this] { snapshot_tick(); });
    }
    if (!restored_.empty()) {
        // A seed with no join list of its own finds the cluster it was in again.
        join_backoff_ = config_.join_retry_interval;
        try_join();
        timers_.schedule(now + config_.dead_reclaim_time, [this] { expire_restored(); });
    }
}

void Memberlist::join(const std::vector<std::string>& seeds) {
    seeds_.clear();
    seed_peers_.clear();
    // A seed naming this member by host name is dropped once it answers (note_seed_peer).
    for (const std::string& addr : seeds) {
        if (addr != config_.advertise_addr) {
            seeds_.push_back(addr);
        }
    }
    join_backoff_ = config_.join_retry_interval;
    try_join();
    // Tell whoever we already know that we are here.
    broadcast(config_.name, local_alive());
}

void Memberlist::leave() {
    if (leaving_) {
        return;
    }
    leaving_ = true;
    // A load update parked by the rate limit would otherwise be published within leave_drain:
    // its alive, at a higher incarnation, would replace the leave in the broadcast queue (same
    // key) and bring us back everywhere, and the others would then find us dead, not left.
    if (pending_site_timer_ != 0) {
        timers_.cancel(pending_site_timer_);
        pending_site_timer_ = 0;
    }
    pending_site_.reset();
    handle_dead(DeadMsg{incarnation_, config_.name, config_.name});
    // The clock and members as they are now (a restart follows a leave): snapshot_tick posts
    // no more after this. Not waited for here: the strand still gossips the leave. The driver's
    // shutdown calls flush_snapshot() once the leave is out (MembershipService::stop), and the
    // writer's destructor writes it in any case.
    if (snapshot_writer_) {
        post_snapshot();
    }
}

std::optional<NodeState> Memberlist::state_of(const std::string& name) const {
    auto it = members_.find(name);
    if (it == members_.end()) {
        return std::nullopt;
    }
    return it->second.state;
}

std::optional<uint64_t> Memberlist::site_version_of(const std::string& name) const {
    auto it = members_.find(name);
    if (it == members_.end()) {
        return std::nullopt;
    }
    return it->second.site ? it->second.site_version : 0;
}

Memberlist::Member* Memberlist::find(const std::string& name) {
    auto it = members_.find(name);
    return it == members_.end() ? nullptr : &it->second;
}

void Memberlist::set_state(Member& m, NodeState state) {
    auto gauge = [&](NodeState s) -> std::atomic<int64_t>& {
        switch (s) {
            case NodeState::kAlive: return stats_.members_alive;
            case NodeState::kSuspect: return stats_.members_suspect;
            default: return stats_.members_dead;
        }
    };
    const bool was_live = m.state == NodeState::kAlive || m.state == NodeState::kSuspect;
    const bool is_live = state == NodeState::kAlive || state == NodeState::kSuspect;
    gauge(m.state).fetch_sub(1);
    gauge(state).fetch_add(1);
    if (was_live && !is_live) {
        --live_count_;
    } else if (!was_live && is_live) {
        ++live_count_;
    }
    if (m.state != state) {
        stats_.state_changes.fetch_add(1);
        ++change_count_;
    }
    m.state = state;
    m.state_change = clock_.now();
}

size_t Memberlist::suspicion_k() const {
    // Confirmations wanted: suspicion_mult - 2, none when the cluster is too small to give them.
    const int k = config_.suspicion_mult - 2;
    if (k < 1 || live_count_ < 2 || live_count_ - 2 < static_cast<size_t>(k)) {
        return 0;
    }
    return static_cast<size_t>(k);
}

AliveMsg Memberlist::local_alive() const {
    AliveMsg a;
    a.incarnation = incarnation_;
    a.node = config_.name;
    a.addr = config_.advertise_addr;
    a.state_version = state_version_;
    auto it = members_.find(config_.name);
    if (it != members_.end() && it->second.site_bytes.size() <= config_.max_inline_state) {
        a.state = it->second.site_bytes;
    }
    return a;
}

void Memberlist::broadcast(const std::string& key, const Message& msg) {
    broadcasts_.queue(key, encode_message(msg));
}

void Memberlist::rebroadcast_alive(const AliveMsg& a) {
    std::vector<uint8_t> encoded = encode_message(a);
    if (a.state && encoded.size() > packet_budget()) {
        // Learnt by push-pull, where a state travels whole: no packet would hold it, so gossip
        // passes the alive on without it and each member fetches the state from its owner.
        AliveMsg bare = a;
        bare.state.reset();
        encoded = encode_message(bare);
    }
    broadcasts_.queue(a.node, std::move(encoded));
}

void Memberlist::emit(MemberEventKind kind, const std::string& name) {
    ++change_count_;
    if (on_event_) {
        on_event_(MemberEvent{kind, name});
    }
}

void Memberlist::apply_site_bytes(Member& m, uint64_t incarnation, uint64_t version,
                                  std::vector<uint8_t> bytes) {
    if (!newer_site_state(incarnation, version, m.site_incarnation, m.site_version)) {
        return;
    }
    if (incarnation < m.life_incarnation) {
        // The key kept at a new life (see handle_alive) refuses only states up to the one held:
        // a previous life's later state that never reached us, replayed by a push-pull whose
        // sender missed the restart, would outrank it. Nothing below the life's first
        // incarnation can be the current life's newest state, so it is dropped, and the fetch
        // of the new life's state stays pending.
        return;
    }
    auto site = decode_site_state(bytes);
    if (site.ok() && site->site_id != m.name) {
        // Member names are site ids, and routing files what it learns about a pool (health,
        // forwarding outcomes) under both: a state naming another site would let one member
        // speak for (or blame) that site.
        site = data_loss_error("site state names site '" + site->site_id.substr(0, 64) +
                               "', not its member");
    }
    if (!site.ok()) {
        stats_.decode_failures.fetch_add(1);
        log::warn("gossip_bad_site_state",
                  {{"member", m.name}, {"error", site.status().to_string()}});
        return;
    }
    m.site = std::make_shared<const SiteState>(std::move(site).value());
    m.site_bytes = std::move(bytes);
    m.site_incarnation = incarnation;
    m.site_version = version;
    if (incarnation == m.incarnation) {
        m.state_version = std::max(m.state_version, version);
    }
    m.fetch_pending = false;
    stats_.state_changes.fetch_add(1);
    emit(MemberEventKind::kUpdate, m.name);
}

void Memberlist::publish_local_state() {
    if (leaving_) {
        return;  // an alive now would undo the leave (see leave())
    }
    Member& self = members_.at(config_.name);
    ++incarnation_;
    ++state_version_;
    self.incarnation = incarnation_;
    self.site = std::make_shared<const SiteState>(site_);
    self.site_bytes = encode_site_state(site_);
    self.site_incarnation = incarnation_;
    self.site_version = state_version_;
    self.state_version = state_version_;
    stats_.state_changes.fetch_add(1);
    ++change_count_;
    broadcast(config_.name, local_alive());
}

void Memberlist::update_site_state(SiteState state) {
    if (leaving_) {
        return;  // nothing is published after a leave (see leave()), so nothing to park either
    }
    state.site_id = config_.name;  // What every receiver requires (see apply_site_bytes).

    const TimePoint now = clock_.now();
    if (only_load_differs(site_, state)) {
        if (!load_changed_materially(site_, state, config_.load_change_fraction,
                                     config_.load_change_abs, config_.saturation)) {
            pending_site_ = std::move(state);  // kept; goes out with the next material change
            return;
        }
        if (now - last_load_publish_ < config_.load_update_min_interval) {
            pending_site_ = std::move(state);
            if (pending_site_timer_ == 0) {
                pending_site_timer_ = timers_.schedule(
                    last_load_publish_ + config_.load_update_min_interval,
                    [this] { flush_pending_load(); });
            }
            return;
        }
    }
    if (pending_site_timer_ != 0) {
        timers_.cancel(pending_site_timer_);
        pending_site_timer_ = 0;
    }
    pending_site_.reset();
    site_ = std::move(state);
    last_load_publish_ = now;
    publish_local_state();
}

void Memberlist::set_saturation_limits(const SaturationLimits& limits) {
    config_.saturation = limits;
    // A sample held back as immaterial may cross the new line (gossiped KV use 0.92, held 0.86,
    // kv_saturated now 0.9): judged again now, as the publisher posts no sample equal to the
    // last and the engine's figures may stand still. One waiting on the rate limit is judged
    // when its timer fires.
    if (pending_site_ && pending_site_timer_ == 0) {
        flush_pending_load();
    }
}

void Memberlist::flush_pending_load() {
    pending_site_timer_ = 0;
    if (pending_site_) {
        SiteState next = std::move(*pending_site_);
        pending_site_.reset();
        update_site_state(std::move(next));
    }
}

void Memberlist::refute(uint64_t accused_incarnation) {
    // Accusations at or above kMaxIncarnation are refused by the decoder (messages.h).
    incarnation_ = std::min(std::max(incarnation_, accused_incarnation) + 1, kMaxIncarnation - 1);
    // The alive below carries our current state under the new incarnation; after a restart
    // that is what makes it win over our previous life's state, whatever its version.
    Member& self = members_.at(config_.name);
    self.incarnation = incarnation_;
    self.site_incarnation = incarnation_;
    ++change_count_;
    awareness_.apply_delta(1);
    stats_.awareness = awareness_.score();
    stats_.refutations.fetch_add(1);
    broadcast(config_.name, local_alive());
}

void Memberlist::handle_alive(const AliveMsg& a) {
    if (a.node.empty() || a.addr.empty()) {
        return;
    }
    if (a.node == config_.name) {
        if (implausible_incarnation(incarnation_, a.incarnation)) {
            stats_.implausible_dropped.fetch_add(1);
            return;
        }
        if (a.addr != config_.advertise_addr) {
            // Another address speaks for our name. Below this life's first incarnation it is our
            // previous life (elsewhere), which our alives already out-rank: the others take them
            // once they find that life dead or left (a live member's address is never changed,
            // see below). At or above it, it is another live process with this name (site.id
            // copied to a second machine) or a forgery: out-bidding it would make both bid
            // without end while every member flips the name's address, so it is only logged.
            // A previous life still held above ours is out-bid once the others declare it dead
            // (handle_suspect and handle_dead refute by name).
            uint64_t suppressed = 0;
            if (a.incarnation >= config_.initial_incarnation &&
                warn_allowed("name", a.addr, suppressed)) {
                log::warn("gossip_name_conflict",
                          {{"member", a.node},
                           {"claimed_address", a.addr},
                           {"address", config_.advertise_addr},
                           {"suppressed", suppressed},
                           {"detail", "another address gossips this site's name; not refuted, "
                                      "the others keep the address they hold until it is dead. "
                                      "Two sites with one site.id, this site's previous life "
                                      "not yet found dead, or a forged message"}});
            }
            return;
        }
        // Someone speaks for us with a newer incarnation, or with other state at ours (our
        // previous life at this address): out-bid it so the cluster keeps our current state. A
        // life that restarts at the incarnation its predecessor crashed at (with
        // initial_incarnation 0, both at 1) is told apart only by its state bytes, as memberlist's
        // aliveNode compares Meta; a push-pull's entry for us carries them whatever their size.
        const Member& self = members_.at(config_.name);
        const bool other_state =
            a.incarnation == incarnation_ && a.state && *a.state != self.site_bytes;
        if (!leaving_ && a.incarnation >= incarnation_ &&
            (a.incarnation > incarnation_ || a.state_version != state_version_ || other_state)) {
            refute(a.incarnation);
        }
        return;
    }
    Member* m = find(a.node);
    if (m == nullptr) {
        if (implausible_first_incarnation(a.incarnation)) {
            stats_.implausible_dropped.fetch_add(1);
            return;
        }
        if (members_.size() >= config_.max_members) {
            // Far past any real cluster (dead members stay dead_reclaim_time): names forged
            // without end must not grow the table, or every push-pull with it.
            stats_.members_refused.fetch_add(1);
            return;
        }
        Member fresh;
        fresh.name = a.node;
        fresh.addr = a.addr;
        fresh.incarnation = a.incarnation;
        fresh.life = ++lives_begun_;
        // What came before this incarnation may be a previous life's (one reclaimed, say).
        fresh.life_incarnation = a.incarnation;
        fresh.state = NodeState::kDead;  // set_state below counts it in
        stats_.members_dead.fetch_add(1);
        auto [it, inserted] = members_.emplace(a.node, std::move(fresh));
        m = &it->second;
        set_state(*m, NodeState::kAlive);
        // A newcomer goes to a random place in the probe order.
        std::uniform_int_distribution<size_t> pos(0, probe_order_.size());
        probe_order_.insert(probe_order_.begin() + static_cast<std::ptrdiff_t>(pos(rng_)), a.node);
        m->state_version = a.state_version;
        if (a.state) {
            apply_site_bytes(*m, a.incarnation, a.state_version, *a.state);
        }
        emit(MemberEventKind::kJoin, a.node);
        rebroadcast_alive(a);
    } else {
        if (a.incarnation < m->incarnation) {
            return;
        }
        if (implausible_incarnation(m->incarnation, a.incarnation)) {
            stats_.implausible_dropped.fetch_add(1);
            return;
        }
        const bool live = m->state == NodeState::kAlive || m->state == NodeState::kSuspect;
        if (live && a.addr != m->addr) {
            // A live member's address is not changed (memberlist's aliveNode): two processes
            // with one name (site.id copied to a second machine) would otherwise have every
            // member flip the address between them at each bid, with a new life (state dropped,
            // routing's records reset) at each flip. A member restarted on a new address is taken
            // once its previous life is found dead or has left.
            uint64_t suppressed = 0;
            if (warn_allowed("name", a.addr, suppressed)) {
                log::warn("gossip_name_conflict",
                          {{"member", a.node},
                           {"claimed_address", a.addr},
                           {"address", m->addr},
                           {"suppressed", suppressed},
                           {"detail", "another address gossips a live member's name; refused "
                                      "until the member at the address held is dead or has "
                                      "left. Two sites with one site.id, a site restarted on a "
                                      "new address before it was found dead, or a forged "
                                      "message"}});
            }
            return;
        }
        if (a.incarnation == m->incarnation && m->state != NodeState::kAlive) {
            // Only a higher incarnation refutes (SWIM): this alive was sent before the
            // suspicion, death or leave at its incarnation and arrives late (reordered, or
            // replayed by gossip or push-pull). A suspect may still be alive, so its newer state
            // is taken; a member that died or left keeps the state it went with.
            if (m->state == NodeState::kSuspect && a.state) {
                apply_site_bytes(*m, a.incarnation, a.state_version, *a.state);
            }
            return;
        }
        if (a.incarnation == m->incarnation && a.state_version <= m->state_version) {
            return;
        }
        const NodeState prev = m->state;
        // A new life of the member: back after a death or a leave, or at a newer incarnation
        // with versions below those already seen (a restarted member counts them from 1 again,
        // while within one life they never go down). What its previous life served (pools, model
        // versions, load) must not route requests until the new life's state arrives, inline
        // below or by fetch. A suspect that refutes is the same life and keeps its state.
        const bool new_life =
            prev == NodeState::kDead || prev == NodeState::kLeft ||
            (a.incarnation > m->incarnation && a.state_version < m->state_version);
        if (m->suspicion_timer != 0) {
            timers_.cancel(m->suspicion_timer);
            m->suspicion_timer = 0;
        }
        m->suspicion.reset();
        if (a.incarnation != m->incarnation || a.addr != m->addr ||
            a.state_version != m->state_version) {
            ++change_count_;  // The snapshot shows all three (MemberView).
        }
        // A newer incarnation may be a restarted member whose versions start again from 1.
        m->state_version = a.incarnation > m->incarnation
                               ? a.state_version
                               : std::max(m->state_version, a.state_version);
        m->incarnation = a.incarnation;
        m->addr = a.addr;
        if (prev != NodeState::kAlive) {
            set_state(*m, NodeState::kAlive);
            emit(prev == NodeState::kSuspect ? MemberEventKind::kRecover : MemberEventKind::kJoin,
                 a.node);
        }
        if (new_life) {
            // The router starts the life's records afresh by it (MemberView::life).
            m->life = ++lives_begun_;
            m->life_incarnation = a.incarnation;
            ++change_count_;
            // Its key (site_incarnation, site_version) stays, so that state, arriving late by
            // gossip or push-pull, is still refused.
            m->site.reset();
            m->site_bytes.clear();
        }
        if (a.state) {
            apply_site_bytes(*m, a.incarnation, a.state_version, *a.state);
        }
        rebroadcast_alive(a);
    }
    // Too large to travel inline: fetch it by push-pull from its owner. At most
    // max_fetches_in_flight at once (a flood of new names must not open a connection each); one
    // not started now is tried again at the member's next alive or push-pull.
    if (newer_site_state(m->incarnation, m->state_version, m->site_incarnation, m->site_version) &&
        !m->fetch_pending && !leaving_ && fetches_in_flight_ < config_.max_fetches_in_flight) {
        m->fetch_pending = true;
        start_push_pull(m->addr, StreamKind::kFetch, m->name);
    }
}

const Memberlist::Member* Memberlist::stale_correction_target(const std::string& source,
                                                               const std::string& accuser) const {
    // The accuser is looked at first: it is usually the sender.
    auto named = members_.find(accuser);
    if (named != members_.end() && named->first != config_.name && named->second.addr == source) {
        return &named->second;
    }
    // One parse of the source per stale message, then text compared: a flood of replays costs
    // a scan of the members, no parse of each.
    const std::string advertised = source_as_advertised(source);
    for (const auto& [name, m] : members_) {
        if (name != config_.name && (m.addr == source || m.addr == advertised)) {
            return &m;
        }
    }
    return nullptr;
}

void Memberlist::correct_stale(const Member& m, const std::string* reply_to,
                               const std::string& accuser) {
    // Someone still gossips an accusation that the member has already refuted: tell that sender
    // (or the accuser it names) the newer alive directly instead of hoping gossip reaches it
    // before its timer runs out.
    if (reply_to == nullptr || m.state != NodeState::kAlive || leaving_) {
        return;
    }
    // Only to the member at the packet's source (the accuser, or a member passing the
    // accusation on), at the address it advertises. A packet's source is not authenticated: a
    // captured stale accusation replayed from a spoofed address would otherwise have every
    // member send that address an alive (up to a packet, state and piggybacked gossip included)
    // per replay; and sent to the accuser it names whatever the source, a replay from any host
    // would have every member send that member packets, each spending a transmit of every
    // queued broadcast, at the replayer's rate. A member sending from another address than it
    // advertises (behind NAT, a published port, an IPv6 address advertised in other than its
    // canonical text) learns the alive by gossip or push-pull, as it would without this
    // shortcut.
    const Member* to = stale_correction_target(*reply_to, accuser);
    if (to == nullptr) {
        return;
    }
    const std::string addr = to->addr;
    if (m.name == config_.name) {
        send_messages(addr, {encode_message(local_alive())});
        return;
    }
    AliveMsg a{m.incarnation, m.name, m.addr, m.state_version, std::nullopt};
    if (m.site_incarnation == m.incarnation && m.site_version == m.state_version &&
        !m.site_bytes.empty() && m.site_bytes.size() <= config_.max_inline_state) {
        a.state = m.site_bytes;
    }
    send_messages(addr, {encode_message(a)});
}

void Memberlist::handle_suspect(const SuspectMsg& s, const std::string* reply_to) {
    Member* m = find(s.node);
    if (m == nullptr) {
        return;
    }
    if (implausible_incarnation(m->incarnation, s.incarnation)) {
        stats_.implausible_dropped.fetch_add(1);
        return;
    }
    if (s.incarnation < m->incarnation) {
        correct_stale(*m, reply_to, s.from);
        return;
    }
    if (m->state == NodeState::kSuspect && m->suspicion && s.incarnation == m->incarnation) {
        if (m->suspicion->confirm(s.from)) {
            arm_suspicion_timer(*m);
            broadcast(s.node, s);
        }
        return;
    }
    if (m->state == NodeState::kDead || m->state == NodeState::kLeft) {
        return;
    }
    if (s.node == config_.name) {
        if (!leaving_) {
            refute(s.incarnation);
        }
        return;
    }
    // A suspicion of a newer incarnation than the one we suspect means the member refuted
    // (alive at that incarnation, which we missed) and is suspected anew: restart the timer
    // rather than let the stale one declare a member dead that has proven it is alive.
    const bool renewed = m->state == NodeState::kSuspect;
    if (renewed && m->suspicion_timer != 0) {
        timers_.cancel(m->suspicion_timer);
        m->suspicion_timer = 0;
    }
    m->incarnation = s.incarnation;
    if (!renewed) {
        set_state(*m, NodeState::kSuspect);
    } else {
        ++change_count_;  // Suspect still, at the newer incarnation the snapshot shows.
    }
    broadcast(s.node, s);
    const size_t n = live_count_;
    const Duration min = suspicion_timeout(config_.suspicion_mult, n, config_.probe_interval);
    const Duration max = min * config_.suspicion_max_timeout_mult;
    m->suspicion = std::make_unique<Suspicion>(s.from, static_cast<int>(suspicion_k()), min, max,
                                               clock_.now());
    arm_suspicion_timer(*m);
    if (!renewed) {
        emit(MemberEventKind::kSuspect, s.node);
    }
}

void Memberlist::arm_suspicion_timer(Member& m) {
    if (m.suspicion_timer != 0) {
        timers_.cancel(m.suspicion_timer);
    }
    const uint64_t inc = m.incarnation;
    const std::string name = m.name;
    m.suspicion_timer = timers_.schedule(m.suspicion->deadline(), [this, name, inc] {
        Member* t = find(name);
        if (t != nullptr && t->state == NodeState::kSuspect && t->incarnation == inc) {
            t->suspicion_timer = 0;
            stats_.deaths_declared.fetch_add(1);
            handle_dead(DeadMsg{inc, name, config_.name});
        }
    });
}

void Memberlist::handle_dead(const DeadMsg& d, const std::string* reply_to) {
    Member* m = find(d.node);
    if (m == nullptr) {
        return;
    }
    if (implausible_incarnation(m->incarnation, d.incarnation)) {
        stats_.implausible_dropped.fetch_add(1);
        return;
    }
    if (d.incarnation < m->incarnation) {
        correct_stale(*m, reply_to, d.from);
        return;
    }
    if (m->state == NodeState::kDead || m->state == NodeState::kLeft) {
        return;
    }
    if (d.node == config_.name && !leaving_) {
        refute(d.incarnation);
        return;
    }
    if (m->suspicion_timer != 0) {
        timers_.cancel(m->suspicion_timer);
        m->suspicion_timer = 0;
    }
    m->suspicion.reset();
    m->incarnation = d.incarnation;
    const bool left = d.from == d.node;
    set_state(*m, left ? NodeState::kLeft : NodeState::kDead);
    vivaldi_.forget(d.node);
    broadcast(d.node, d);
    emit(left ? MemberEventKind::kLeave : MemberEventKind::kDead, d.node);
}

std::shared_ptr<const MembershipSnapshot> Memberlist::snapshot() const {
    auto snap = std::make_shared<MembershipSnapshot>();
    snap->local_name = config_.name;
    snap->local_coord = vivaldi_.coordinate();
    snap->taken = clock_.now();
    snap->members.reserve(members_.size());
    for (const auto& [name, m] : members_) {
        MemberView v;
        v.name = m.name;
        v.addr = m.addr;
        v.state = m.state;
        v.incarnation = m.incarnation;
        v.state_version = m.state_version;
        v.life = m.life;
        v.site_version = m.site ? m.site_version : 0;
        v.site = m.site;
        v.coord = name == config_.name ? std::optional(vivaldi_.coordinate()) : m.coord;
        v.is_local = name == config_.name;
        snap->members.push_back(std::move(v));
    }
    std::sort(snap->members.begin(), snap->members.end(),
              [](const MemberView& a, const MemberView& b) { return a.name < b.name; });
    return snap;
}

const MemberView* MembershipSnapshot::find(const std::string& name) const {
    auto it = std::lower_bound(members.begin(), members.end(), name,
                               [](const MemberView& v, const std::string& n) { return v.name < n; });
    return it != members.end() && it->name == name ? &*it : nullptr;
}

size_t MembershipSnapshot::count(NodeState state) const {
    return static_cast<size_t>(std::count_if(members.begin(), members.end(),
                                             [&](const MemberView& v) { return v.state == state; }));
}

std::string_view member_event_name(MemberEventKind k) {
    switch (k) {
        case MemberEventKind::kJoin: return "join";
        case MemberEventKind::kUpdate: return "update";
        case MemberEventKind::kSuspect: return "suspect";
        case MemberEventKind::kRecover: return "recover";
        case MemberEventKind::kDead: return "dead";
        case MemberEventKind::kLeave: return "leave";
    }
    return "unknown";
}

}  // namespace edge::routing::membership
