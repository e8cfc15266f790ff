#pragma once

// Memberlist is the SWIM + Lifeguard membership protocol as a sans-IO state machine: it never
// touches a socket, sleeps or waits on a disk. The driver feeds it received packets and stream
// requests, reports stream responses, and calls run_due_timers() whenever the injected Clock
// reaches next_deadline(); Memberlist answers by calling its Transport. The same object therefore
// runs over real sockets (MembershipService, Boost.Asio) and over the test simulator's fake
// network with a manual clock. The one file it touches is the optional snapshot file
// (MembershipConfig::snapshot_file): read once in create(), and written by a SnapshotWriter on a
// thread of its own, to which it hands the text at most once per snapshot_interval (an fsync on a
// busy disk can take seconds, and a member that answers no probe meanwhile is suspected).
//
// What it does: probes one member per probe interval (direct ping, then indirect pings through
// `indirect_checks` members and a TCP ping), suspects a member that answers none, lets the suspect
// refute with a higher incarnation, declares it dead when the suspicion timer (max, shrinking to
// min with independent confirmations) runs out; stretches its own timeouts when it is itself slow
// (awareness); piggybacks updates on every packet and gossips them to `gossip_nodes` members per
// gossip interval, each sent retransmit_mult * ceil(log10(N + 1)) times; exchanges full state by
// push-pull periodically, at join and to fetch site states too large for a packet; delivers
// Lamport-clocked user events once; updates its Vivaldi coordinate from probe RTTs.
//
// Threading: not synchronized. Every method must be called from one thread or strand, and the
// callbacks run on it. MembershipStats may be read from anywhere, and flush_snapshot() called
// from anywhere.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "routing/coords/vivaldi.h"
#include "routing/membership/awareness.h"
#include "routing/membership/broadcast_queue.h"
#include "routing/membership/config.h"
#include "routing/membership/keyring.h"
#include "routing/membership/messages.h"
#include "routing/membership/site_state.h"
#include "routing/membership/snapshot.h"
#include "routing/membership/snapshot_file.h"
#include "routing/membership/stats.h"
#include "routing/membership/suspicion.h"
#include "routing/membership/timer_queue.h"
#include "routing/membership/transport.h"

namespace edge::routing::membership {

class Memberlist {
public:
    using EventCallback = std::function<void(const MemberEvent&)>;
    using UserEventCallback = std::function<void(const UserEventMsg&)>;
    // The application's anti-entropy state (memberlist's LocalState/MergeRemoteState delegate):
    // user events reach only the members up at the time and those a push-pull brings the last
    // user_event_buffer of, so state built from them (the rollout book) rides on every full-state
    // push-pull as well. LocalStateFn returns the encoded state (at most kMaxPushPullAppState
    // bytes); MergeStateFn gets a peer's, with the peer's event clock, which bounds the Lamport
    // times it may hold. Both run on the membership thread.
    using LocalStateFn = std::function<std::vector<uint8_t>()>;
    using MergeStateFn = std::function<void(std::span<const uint8_t> state, uint64_t ltime)>;

    // `clock` and `transport` must outlive the Memberlist. A member's site id is its name:
    // `initial_state.site_id` is empty (and set to config.name) or that name, and peers' states
    // naming another site are refused (counted as decode failures).
    static Result<std::unique_ptr<Memberlist>> create(MembershipConfig config, Keyring keyring,
                                                      Clock& clock, Transport& transport,
                                                      SiteState initial_state);
    ~Memberlist();

    // Schedules the probe, gossip and push-pull timers (and the snapshot file's), and starts
    // joining the members restored from the snapshot file, as join() does its seeds.
    void start();
    // Full-state exchange with each seed address; members learned arrive as join events. Retried
    // with backoff whenever this member knows no other live member; a seed that is not a live
    // member also gets a push-pull every reconnect_interval (it may have left and come back). A
    // seed is a live member when its address, or the one that last answered it, is a live
    // member's; a seed that turns out to be this member is dropped.
    void join(const std::vector<std::string>& seeds);
    // Broadcasts our departure; keep driving timers for a few gossip intervals so it spreads.
    // Site state updates are no longer published from here on (a pending one is dropped).
    void leave();
    bool has_left() const { return leaving_; }

    // Replaces this member's site state (its site_id set to the member name). Changes other
    // than load go out at once; load-only changes go out when material and at most once per
    // load_update_min_interval. Ignored after leave().
    void update_site_state(SiteState state);
    // Sends a user event (a rollout intent) to every member, this one included. Fails with
    // kResourceExhausted when the Lamport clock has reached kMaxEventLtime - 1.
    [[nodiscard]] Status send_user_event(const std::string& name, std::vector<uint8_t> payload);
    // Whether this member has merged another member's full state (a join or periodic push-pull,
    // sent or answered), which carries that member's user event clock. Until then an event it
    // sends may be stamped below times the cluster has seen (a restarted member starts at 0, or
    // at the clock its snapshot file kept, which the cluster may have passed meanwhile).
    bool event_clock_synced() const { return event_clock_synced_; }
    uint64_t event_clock() const { return event_clock_; }
    // The members restored from config.snapshot_file (this one left out), tried as join seeds
    // while no other member is alive. Non-empty: this member was in a cluster before it
    // restarted, so alone it is not the whole cluster, only not back in it yet. Those not alive
    // by dead_reclaim_time after start() are dropped: gone for good, as the cluster deems them.
    size_t snapshot_members() const { return restored_.size(); }
    // Waits, at most `timeout`, until the snapshot file holds the newest snapshot handed to its
    // writer (leave() hands over the last one): the write's Status, kDeadlineExceeded, or OK when
    // there is no snapshot file. Touches only the writer, so any thread may call it (the driver's
    // shutdown does, off the strand; tests do before reading the file).
    Status flush_snapshot(Duration timeout) const;
    // TESTING ONLY: the snapshot file is written with `write` (one that blocks, say) from now on.
    // Call before start().
    void set_snapshot_write_for_testing(SnapshotWriter::WriteFn write);

    // Input from the driver.
    void handle_packet(const std::string& from, std::span<const uint8_t> bytes);
    // A stream request from `from`; returns the sealed response frame (or an error to drop it).
    Result<std::vector<uint8_t>> handle_stream(const std::string& from,
                                               std::span<const uint8_t> bytes);
    // `peer`: the "ip:port" the stream reached, when the transport knows it; it is how a seed
    // given by host name is matched to the member that answered it.
    void handle_stream_response(uint64_t id, Result<std::vector<uint8_t>> response,
                                const std::string& peer = {});
    TimePoint next_deadline() const { return timers_.next(); }
    void run_due_timers() { timers_.run_due(clock_.now()); }

    // A fresh snapshot (O(N)); call on the membership thread.
    std::shared_ptr<const MembershipSnapshot> snapshot() const;
    // Bumped on every change a snapshot would show.
    uint64_t change_count() const { return change_count_; }

    void set_event_callback(EventCallback cb) { on_event_ = std::move(cb); }
    void set_user_event_callback(UserEventCallback cb) { on_user_event_ = std::move(cb); }
    void set_local_state(LocalStateFn fn) { local_state_ = std::move(fn); }
    void set_merge_remote_state(MergeStateFn fn) { merge_state_ = std::move(fn); }

    // Messages waiting to be piggybacked or gossiped (at most user_event_buffer user events, and
    // one message per member).
    size_t broadcasts_queued() const { return broadcasts_.size(); }
    const MembershipStats& stats() const { return stats_; }
    // For the driver, which counts its own transport figures (inbound streams) here too.
    MembershipStats& stats() { return stats_; }
    Keyring& keyring() { return keyring_; }
    // Routing's saturation thresholds changed (a reload): load updates are judged by them
    // (MembershipConfig::saturation), the one held back as immaterial too, at once.
    void set_saturation_limits(const SaturationLimits& limits);
    const MembershipConfig& config() const { return config_; }
    const std::string& name() const { return config_.name; }
    const coords::Coordinate& coordinate() const { return vivaldi_.coordinate(); }
    int awareness_score() const { return awareness_.score(); }
    // Members not dead or left, this one included.
    size_t num_live() const { return live_count_; }
    // Our view of one member's state and incarnation, if known.
    std::optional<NodeState> state_of(const std::string& name) const;
    // Version of the site state we hold for a member (0 when none, as after it restarted), if
    // known.
    std::optional<uint64_t> site_version_of(const std::string& name) const;

private:
    struct Member {
        std::string name;
        std::string addr;
        uint64_t incarnation = 0;
        NodeState state = NodeState::kAlive;
        TimePoint state_change{};
        // The newest state version announced at `incarnation` (by alive messages).
        uint64_t state_version = 0;
        // The key of the site state held: a member's site state is ordered by (incarnation,
        // version), because a restarted member counts versions from 1 again while its
        // refutation lifts its incarnation above its previous life's. When the member turns out
        // to have restarted, `site` is dropped and the key kept (see handle_alive).
        uint64_t site_incarnation = 0;
        uint64_t site_version = 0;
        std::shared_ptr<const SiteState> site;  // Null until known, and after a restart.
        std::vector<uint8_t> site_bytes;
        // Which life of the member this is (MemberView::life): a new number from lives_begun_
        // when it is first heard of and whenever handle_alive finds a new life.
        uint64_t life = 0;
        // The incarnation this life was first heard at. The life's states all lie at or above it
        // (its incarnations only grow), so a state below it may be a previous life's, replayed
        // by a peer that has not heard of the restart yet: apply_site_bytes refuses it.
        uint64_t life_incarnation = 0;
        std::optional<coords::Coordinate> coord;
        std::unique_ptr<Suspicion> suspicion;
        uint64_t suspicion_timer = 0;
        bool fetch_pending = false;
    };

    struct ProbeRound {
        uint64_t seq = 0;
        std::string target;
        TimePoint sent{};
        // When the round fails if no ack came (end_timer's deadline).
        TimePoint ends{};
        bool concluded = false;
        bool timed_out = false;
        size_t expected_nacks = 0;
        size_t nacks = 0;
        uint64_t timeout_timer = 0;
        uint64_t end_timer = 0;
    };

    struct Relay {
        uint64_t orig_seq = 0;
        std::string source_addr;
        bool want_nack = false;
        uint64_t timer = 0;
    };

    enum class StreamKind { kJoin, kPushPull, kFetch, kFallbackPing };
    struct PendingStream {
        StreamKind kind;
        std::string addr;
        std::string node;  // kFetch: whose state; kFallbackPing: the target
        uint64_t seq = 0;  // kFallbackPing
    };

    Memberlist(MembershipConfig config, Keyring keyring, Clock& clock, Transport& transport);

    // memberlist.cc: member table and the state rules.
    Member* find(const std::string& name);
    void set_state(Member& m, NodeState state);
    void handle_alive(const AliveMsg& a);
    // `reply_to`: the address the accusation came from, told the newer truth if it is stale.
    void handle_suspect(const SuspectMsg& s, const std::string* reply_to = nullptr);
    void handle_dead(const DeadMsg& d, const std::string* reply_to = nullptr);
    // Sends m's newer alive to stale_correction_target(*reply_to, accuser), if any; `accuser` is
    // the member the accusation names as its source.
    void correct_stale(const Member& m, const std::string* reply_to, const std::string& accuser);
    // The member other than this one to tell: the one advertising `source` (an IPv4-mapped
    // source as its IPv4 address; `accuser` looked at first); null if none.
    const Member* stale_correction_target(const std::string& source,
                                          const std::string& accuser) const;
    void arm_suspicion_timer(Member& m);
    void refute(uint64_t accused_incarnation);
    // Takes `bytes` as m's site state if (incarnation, version) is newer than the one held and
    // the incarnation is not below m's current life's (Member::life_incarnation).
    void apply_site_bytes(Member& m, uint64_t incarnation, uint64_t version,
                          std::vector<uint8_t> bytes);
    void publish_local_state();
    void flush_pending_load();
    void broadcast(const std::string& key, const Message& msg);
    // Passes a member's alive on; a site state too large for any packet is left out (members
    // then fetch it from its owner).
    void rebroadcast_alive(const AliveMsg& a);
    // Bytes of messages one packet holds (mtu less the keyring's sealing and the version byte).
    size_t packet_budget() const { return config_.mtu - keyring_.overhead(config_.label) - 1; }
    void emit(MemberEventKind kind, const std::string& name);
    AliveMsg local_alive() const;
    size_t suspicion_k() const;

    // memberlist_probe.cc: failure detection.
    void probe_tick();
    Member* next_probe_target();
    void on_direct_timeout(uint64_t seq);
    void on_probe_end(uint64_t seq);
    // An ack ended the round; `direct`: the target's own, in time (its RTT feeds Vivaldi).
    void conclude_probe(bool direct, Duration rtt, const std::optional<coords::Coordinate>& c);
    void handle_ping(const std::string& from, const PingMsg& p);
    void handle_indirect_ping(const IndirectPingMsg& p);
    void handle_ack(const AckMsg& a, bool direct);
    void handle_nack(const NackMsg& n);
    // Up to k distinct members but this one and `exclude`: alive or suspect ones, and with
    // `include_dead` those dead (not left) for at most gossip_to_the_dead_time.
    std::vector<Member*> random_members(size_t k, const std::string& exclude, bool include_dead);

    // memberlist_sync.cc: dissemination, push-pull, user events, packet I/O.
    void gossip_tick();
    void push_pull_tick();
    void reconnect_tick();
    // Starts a join push-pull with every seed that has none in flight.
    void try_join();
    // Arms the join retry timer (once) when there are seeds and we know no other live member.
    void schedule_join_retry();
    void join_retry_tick();
    // Records that `peer` answered a push-pull to `seed` (if it is one); drops the seed when the
    // peer is this member.
    void note_seed_peer(const std::string& seed, const std::string& peer);
    void start_push_pull(const std::string& addr, StreamKind kind, const std::string& node);
    PushPullMsg local_push_pull(bool join) const;
    PushPullNode push_pull_node(const Member& m) const;  // Its entry in a push-pull.
    // `full_state`: a join or periodic push-pull (not a fetch), which carries the sender's clock.
    void merge_push_pull(const PushPullMsg& pp, bool full_state);
    // Takes the Lamport time `ltime` a peer's clock or event carries, as a Lamport witness;
    // false (counted in implausible_dropped, the clock left as it is) for one implausibly far
    // past this member's clock. `sync`: from the first full state merged, which may jump.
    bool witness_ltime(uint64_t ltime, bool sync = false);
    void handle_user_event(const UserEventMsg& e);
    bool remember_event(const UserEventMsg& e);
    void send_messages(const std::string& addr, std::vector<std::vector<uint8_t>> framed);
    // The snapshot file (config.snapshot_file, snapshot_file.h): restored at create(); its text
    // built here and handed to snapshot_writer_ by snapshot_tick when it changed, and at leave().
    // A bad or unwritable file is logged (by the writer, for a write) and otherwise ignored.
    void restore_snapshot();
    // dead_reclaim_time after start(): drops the restored members not alive among members_.
    void expire_restored();
    void snapshot_tick();
    void post_snapshot();
    // `from`: the sender's address, for the log ("" when unknown). A packet holding more than
    // `max_messages` messages is refused before the one over is decoded.
    Result<std::vector<Message>> open_and_decode(std::span<const uint8_t> bytes,
                                                 const std::string& from, size_t max_messages);
    // Whether a warning of `kind` about what `from` sent may be logged now: each kind and sending
    // host at most once per kWarnInterval (a flood from one host hides no other). Sets
    // `suppressed` to how many were not logged since the last one.
    bool warn_allowed(std::string_view kind, const std::string& from, uint64_t& suppressed);
    void warn_auth_failed(const std::string& from, const Status& error);
    void dispatch(const std::string& from, const Message& m);
    void reap_dead();

    MembershipConfig config_;
    Keyring keyring_;
    Clock& clock_;
    static constexpr std::chrono::seconds kWarnInterval{10};
    struct WarnState {
        TimePoint last{};
        uint64_t suppressed = 0;
    };
    std::unordered_map<std::string, WarnState> warned_;  // By kind and sender; strand only.
    Transport& transport_;
    std::mt19937_64 rng_;
    TimerQueue timers_;
    Awareness awareness_;
    BroadcastQueue broadcasts_;
    coords::VivaldiClient vivaldi_;
    MembershipStats stats_;

    std::unordered_map<std::string, Member> members_;
    std::vector<std::string> probe_order_;
    size_t probe_index_ = 0;
    size_t live_count_ = 0;
    uint64_t incarnation_ = 0;
    uint64_t state_version_ = 0;
    SiteState site_;
    std::optional<SiteState> pending_site_;
    TimePoint last_load_publish_{};
    uint64_t pending_site_timer_ = 0;
    bool leaving_ = false;
    bool started_ = false;

    std::vector<std::string> seeds_;
    // The members the snapshot file held at create() (not this one): join seeds while alone,
    // written back in place of the live members while none is known. Those not alive by
    // dead_reclaim_time after start() are dropped (expire_restored).
    std::vector<GossipSnapshot::Member> restored_;
    // Null without a snapshot file. Set in create() (and by set_snapshot_write_for_testing) and
    // not changed after start(), so flush_snapshot() may read it from another thread.
    std::unique_ptr<SnapshotWriter> snapshot_writer_;
    // The text last handed to the writer (which writes it, or keeps trying), and the change count
    // and clock it was built at: nothing changed, nothing to build.
    std::string snapshot_posted_;
    uint64_t snapshot_change_ = ~uint64_t{0};
    uint64_t snapshot_clock_ = ~uint64_t{0};
    // The "ip:port" that last answered a push-pull to each seed: a seed given by host name never
    // equals a member's address, so it is found among the members by this one.
    std::unordered_map<std::string, std::string> seed_peers_;
    Duration join_backoff_{};
    uint64_t join_retry_timer_ = 0;
    // A failed join is logged as a warning once, until a join succeeds; retries log at debug.
    bool join_failure_logged_ = false;

    uint64_t seq_ = 0;
    std::optional<ProbeRound> probe_;
    std::unordered_map<uint64_t, Relay> relays_;
    uint64_t next_stream_id_ = 0;
    std::unordered_map<uint64_t, PendingStream> streams_;
    int64_t fetches_in_flight_ = 0;  // kFetch streams in streams_.

    uint64_t event_clock_ = 0;
    bool event_clock_synced_ = false;
    std::deque<UserEventMsg> recent_events_;
    std::unordered_set<std::string> seen_events_;

    uint64_t change_count_ = 0;
    // Lives numbered so far (Member::life): a number is never given twice, so a member reclaimed
    // and heard of again does not repeat the life it had.
    uint64_t lives_begun_ = 0;
    EventCallback on_event_;
    UserEventCallback on_user_event_;
    LocalStateFn local_state_;
    MergeStateFn merge_state_;
};

}  // namespace edge::routing::membership
