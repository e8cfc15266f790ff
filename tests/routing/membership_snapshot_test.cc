// The gossip snapshot file (snapshot_file.h, MembershipConfig::snapshot_file; serf's -snapshot):
// its codec and atomic write, a member restoring its user event clock and rejoining the members
// it saved, bad files ignored with a message, the file written off the strand (a slow disk holds
// up no timer; a failed write is retried), and the rolling restart it exists for: seed and
// member restarted together, the member joined to the seed alone, its rollout event still taken
// by the members that never restarted.

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "routing/membership/memberlist.h"
#include "routing/membership/snapshot_file.h"
#include "tests/routing/memberlist_fixture.h"
#include "tests/testing/fake_network.h"
#include "tests/testing/test_certs.h"

namespace edge::routing::membership {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Log lines, collected while it lives.
class LogCapture {
  public:
    LogCapture() {
        log::set_sink([this](std::string_view line) { lines.emplace_back(line); });
    }
    ~LogCapture() { log::set_sink(nullptr); }
    // The lines that contain every one of `parts`.
    size_t count(std::initializer_list<std::string_view> parts) const {
        size_t n = 0;
        for (const std::string& l : lines) {
            bool all = true;
            for (std::string_view p : parts) {
                all = all && l.find(p) != std::string::npos;
            }
            n += all ? 1 : 0;
        }
        return n;
    }
    std::string all() const {
        std::string out;
        for (const std::string& l : lines) {
            out += l + "\n";
        }
        return out;
    }
    std::vector<std::string> lines;
};

std::string addr_of(size_t i) { return "site" + std::to_string(i) + ":7946"; }

// One site's gossip process on the simulated network, restartable as a new process that keeps
// only its snapshot file (its timers run every 10 ms). It keeps the newest "rollout" event by
// (Lamport time, payload), as the daemon's RolloutBook keeps a model's target.
class Site final : public Transport {
  public:
    Site(edge::testing::FakeNetwork& net, size_t index, MembershipConfig base,
         std::string snapshot_file, std::vector<std::string> join)
        : net_(net),
          index_(index),
          base_(std::move(base)),
          snapshot_file_(std::move(snapshot_file)),
          join_(std::move(join)) {}

    Memberlist& ml() { return *ml_; }
    bool started() const { return ml_ != nullptr; }
    // Starts a new process (the first, or the next after kill()).
    void start() {
        ++generation_;
        MembershipConfig c = base_;
        c.name = "site" + std::to_string(index_);
        c.advertise_addr = addr_of(index_);
        c.seed = 7 + index_ * 31 + generation_ * 1009;
        c.snapshot_file = snapshot_file_;
        // As MembershipService does with the wall clock: a new life out-ranks the previous one.
        c.initial_incarnation = 1000 * generation_;
        SiteState site;
        site.site_id = c.name;
        ml_ = Memberlist::create(c, Keyring{}, net_.clock(), *this, site).value();
        held.reset();
        ml_->set_user_event_callback([this](const UserEventMsg& e) {
            const std::string version(e.payload.begin(), e.payload.end());
            if (!held || e.ltime > held->first ||
                (e.ltime == held->first && version > held->second)) {
                held = std::make_pair(e.ltime, version);
            }
        });
        net_.attach(
            addr_of(index_),
            [this](const std::string& from, std::vector<uint8_t> b) {
                ml_->handle_packet(from, b);
            },
            [this](const std::string& from, std::vector<uint8_t> b) {
                return ml_->handle_stream(from, b);
            });
        alive_ = true;
        ml_->start();
        if (!join_.empty()) {
            ml_->join(join_);
        }
        tick(generation_);
    }
    // The process ends at once (after a leave() its leave has been gossiped meanwhile), with
    // its snapshot file written, as MembershipService::stop waits for.
    void kill() {
        alive_ = false;
        net_.detach(addr_of(index_));
        if (ml_) {
            CHECK(ml_->flush_snapshot(seconds(10)).ok());
        }
    }

    void send_packet(const std::string& to, std::vector<uint8_t> bytes) override {
        net_.send_packet(addr_of(index_), to, std::move(bytes));
    }
    void send_stream(const std::string& to, uint64_t id, std::vector<uint8_t> req) override {
        net_.send_stream(addr_of(index_), to, std::move(req),
                         [this, id, gen = generation_](Result<std::vector<uint8_t>> r) {
                             if (alive_ && gen == generation_) {
                                 ml_->handle_stream_response(id, std::move(r));
                             }
                         });
    }

    // The newest rollout event delivered: (Lamport time, version).
    std::optional<std::pair<uint64_t, std::string>> held;

  private:
    void tick(uint64_t gen) {
        if (!alive_ || gen != generation_) {
            return;
        }
        ml_->run_due_timers();
        net_.schedule(net_.now() + milliseconds(10), [this, gen] { tick(gen); });
    }

    edge::testing::FakeNetwork& net_;
    size_t index_;
    MembershipConfig base_;
    std::string snapshot_file_;
    std::vector<std::string> join_;
    std::unique_ptr<Memberlist> ml_;
    bool alive_ = false;
    uint64_t generation_ = 0;
};

// Sites 0..n-1; site 0 is the seed (no join list), the others join it. Declared after the
// network, so destroyed before it.
struct Cluster {
    Cluster(size_t n, const MembershipConfig& c, const std::string& dir, uint64_t seed)
        : net(seed) {
        net.set_stream_timeout(c.stream_timeout);
        for (size_t i = 0; i < n; ++i) {
            std::vector<std::string> join;
            if (i != 0) {
                join.push_back(addr_of(0));
            }
            sites.push_back(std::make_unique<Site>(
                net, i, c, dir + "/site" + std::to_string(i) + ".snap", join));
        }
    }
    ~Cluster() {
        for (auto& s : sites) {
            s->kill();
        }
    }
    Site& operator[](size_t i) { return *sites.at(i); }
    // Every one of `ids` sees exactly those alive.
    bool sees_each_other(std::initializer_list<size_t> ids) {
        for (size_t i : ids) {
            if (!sites[i]->started() || sites[i]->ml().num_live() != ids.size()) {
                return false;
            }
            for (size_t j : ids) {
                if (sites[i]->ml().state_of("site" + std::to_string(j)) != NodeState::kAlive) {
                    return false;
                }
            }
        }
        return true;
    }

    edge::testing::FakeNetwork net;
    std::vector<std::unique_ptr<Site>> sites;
};

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::string valid_snapshot(uint64_t clock, const std::vector<GossipSnapshot::Member>& members) {
    GossipSnapshot s;
    s.event_clock = clock;
    s.members = members;
    return encode_gossip_snapshot(s);
}

}  // namespace

TEST_CASE("gossip snapshot: text round trip, bounds, and what a bad file says") {
    GossipSnapshot s;
    s.event_clock = 42;
    s.members = {{"site-b", "10.0.0.2:7946"}, {"site c", "[fd00::3]:7946"}};
    const std::string text = encode_gossip_snapshot(s);
    CHECK(text.find("edgeserve-gossip-snapshot 1\n") != std::string::npos);
    Result<GossipSnapshot> back = decode_gossip_snapshot(text);
    REQUIRE_MESSAGE(back.ok(), back.status().to_string());
    CHECK(*back == s);

    // At most kMaxSnapshotMembers written; a name that could not be read back is left out.
    GossipSnapshot big;
    for (size_t i = 0; i < kMaxSnapshotMembers + 10; ++i) {
        big.members.push_back({"n" + std::to_string(i), "10.1.0.1:" + std::to_string(i + 1)});
    }
    big.members.insert(big.members.begin(), {"evil\nevent_clock 9", "10.0.0.9:1"});
    Result<GossipSnapshot> bounded = decode_gossip_snapshot(encode_gossip_snapshot(big));
    REQUIRE_MESSAGE(bounded.ok(), bounded.status().to_string());
    CHECK(bounded->members.size() == kMaxSnapshotMembers);
    CHECK(bounded->members.front().name == "n0");

    auto error_of = [](const std::string& t) {
        Result<GossipSnapshot> r = decode_gossip_snapshot(t);
        REQUIRE_FALSE(r.ok());
        return r.status().message();
    };
    CHECK(error_of("").find("empty") != std::string::npos);
    CHECK(error_of("hello\n").find("not a gossip snapshot") != std::string::npos);
    CHECK(error_of("edgeserve-gossip-snapshot 2\nevent_clock 1\nend 0\n")
              .find("snapshot version '2'; this build reads version 1") != std::string::npos);
    // Cut short: no end line, or fewer members than it counts.
    CHECK(error_of(text.substr(0, text.find("end"))).find("cut short") != std::string::npos);
    std::string dropped = text;
    dropped.erase(dropped.find("member"),
                  dropped.find('\n', dropped.find("member")) - dropped.find("member") + 1);
    CHECK(error_of(dropped).find("counts '2' members, the file has 1") != std::string::npos);
    CHECK(error_of("edgeserve-gossip-snapshot 1\nevent_clock 4611686018427387903\nend 0\n")
              .find("implausible") != std::string::npos);
    CHECK(error_of("edgeserve-gossip-snapshot 1\nevent_clock 99999999999999999999\nend 0\n")
              .find("is not a number") != std::string::npos);
    CHECK(
        error_of("edgeserve-gossip-snapshot 1\nevent_clock -1\nend 0\n").find("is not a number") !=
        std::string::npos);
    CHECK(error_of("edgeserve-gossip-snapshot 1\nevent_clock 1\nbogus\nend 0\n")
              .find("line 3: unknown line 'bogus'") != std::string::npos);
    CHECK(error_of("edgeserve-gossip-snapshot 1\nevent_clock 1\nend 0\nmember a b\n")
              .find("after the end line") != std::string::npos);
    // The most a clock can stamp, less one, is still a clock.
    CHECK(decode_gossip_snapshot("edgeserve-gossip-snapshot 1\nevent_clock 4611686018427387902\n"
                                 "end 0\n")
              .ok());
}

TEST_CASE("gossip snapshot: written atomically, never through a symlink") {
    edge::testing::TempDir dir;
    const std::string path = dir.file("gossip.snapshot");
    REQUIRE(write_file_atomically(path, "one\n").ok());
    CHECK(edge::testing::read_file(path) == "one\n");
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    // A symlink at the file's name, or at the temporary's, is replaced, not written through.
    const std::string victim = dir.write("victim", "keep\n");
    std::filesystem::remove(path);
    std::filesystem::create_symlink(victim, path);
    std::filesystem::create_symlink(victim, path + ".tmp");
    REQUIRE(write_file_atomically(path, "two\n").ok());
    CHECK_FALSE(std::filesystem::is_symlink(path));
    CHECK(edge::testing::read_file(path) == "two\n");
    CHECK(edge::testing::read_file(victim) == "keep\n");
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
    // A directory that does not exist: an error naming the file, nothing else.
    Status bad = write_file_atomically(dir.file("no/such/dir/snap"), "x");
    CHECK_FALSE(bad.ok());
    CHECK(bad.message().find(dir.file("no/such/dir/snap.tmp")) != std::string::npos);
}

TEST_CASE("gossip snapshot: a member restores its clock and joins the members it saved") {
    edge::testing::TempDir dir;
    MembershipConfig c = lan_profile();
    c.snapshot_file = dir.write(
        "a.snap", valid_snapshot(20, {{"B", "10.0.0.2:7946"},
                                      {"C", "10.0.0.3:7946"},
                                      {"A", "10.0.0.1:7946"},         // This member: dropped.
                                      {"A-old", "10.0.0.1:7946"}}));  // Its address: dropped.
    LogCapture logs;
    Member a(c);
    CHECK(a.ml().event_clock() == 20);
    CHECK_FALSE(a.ml().event_clock_synced());
    CHECK(a.ml().snapshot_members() == 2);
    CHECK(logs.count({"gossip_snapshot_restored", c.snapshot_file, "\"event_clock\":20"}) == 1);
    // start() joins them, with no seeds of its own; a join carries the restored clock.
    a.ml().start();
    std::vector<std::string> joined;
    for (const auto& s : a.transport().streams) {
        if (const auto* pp = std::get_if<PushPullMsg>(&s.msg); pp && pp->join) {
            joined.push_back(s.to);
            CHECK(pp->event_ltime == 20);
        }
    }
    std::sort(joined.begin(), joined.end());
    CHECK(joined == std::vector<std::string>{"10.0.0.2:7946", "10.0.0.3:7946"});
    // An event sent now is stamped past the restored clock.
    REQUIRE(a.ml().send_user_event("rollout", bytes("v")).ok());
    CHECK(a.ml().event_clock() == 21);

    // Written back within snapshot_interval: the clock, and the members alive (the saved ones
    // while it knows no other).
    a.run_until(a.clock().now() + c.snapshot_interval + milliseconds(1));
    REQUIRE(a.ml().flush_snapshot(seconds(10)).ok());
    Result<GossipSnapshot> written = read_gossip_snapshot(c.snapshot_file);
    REQUIRE_MESSAGE(written.ok(), written.status().to_string());
    CHECK(written->event_clock == 21);
    CHECK(written->members ==
          std::vector<GossipSnapshot::Member>{{"B", "10.0.0.2:7946"}, {"C", "10.0.0.3:7946"}});
    a.receive(AliveMsg{5, "D", "10.0.0.4:7946", 1, std::nullopt});
    a.receive(UserEventMsg{30, "rollout", bytes("w")});
    a.run_until(a.clock().now() + c.snapshot_interval + milliseconds(1));
    REQUIRE(a.ml().flush_snapshot(seconds(10)).ok());
    written = read_gossip_snapshot(c.snapshot_file);
    REQUIRE(written.ok());
    CHECK(written->event_clock == 30);
    CHECK(written->members == std::vector<GossipSnapshot::Member>{{"D", "10.0.0.4:7946"}});
    // And at leave, whatever the interval.
    a.receive(UserEventMsg{31, "rollout", bytes("x")});
    a.ml().leave();
    REQUIRE(a.ml().flush_snapshot(seconds(10)).ok());
    CHECK(read_gossip_snapshot(c.snapshot_file)->event_clock == 31);
}

// A site with no join list restarted while a member its snapshot names was decommissioned: it
// never hears of that member again. Kept, the site retried it, wrote it back while alone, and
// refused rollouts (snapshot_members() > 0) across every restart until the file was deleted.
TEST_CASE("gossip snapshot: a saved member that never answers expires after dead_reclaim_time") {
    edge::testing::TempDir dir;
    MembershipConfig c = lan_profile();
    c.dead_reclaim_time = std::chrono::minutes(5);
    c.snapshot_file = dir.write("a.snap", valid_snapshot(20, {{"B", "10.0.0.2:7946"}}));
    LogCapture logs;
    Member a(c);
    a.ml().start();
    const TimePoint started = a.clock().now();
    // B is gone: every stream to it fails (the transport's timeout), so the joins are retried.
    auto run_until = [&](TimePoint until) {
        while (a.clock().now() < until) {
            a.run_until(std::min(until, a.clock().now() + seconds(5)));
            for (uint64_t id = 1; id <= a.transport().streams.size(); ++id) {
                a.ml().handle_stream_response(id, unavailable_error("connection refused"));
            }
        }
    };
    auto joins_to_b = [&](TimePoint since) {
        size_t n = 0;
        for (const auto& s : a.transport().streams) {
            const auto* pp = std::get_if<PushPullMsg>(&s.msg);
            n += (pp && pp->join && s.to == "10.0.0.2:7946" && s.at >= since) ? 1 : 0;
        }
        return n;
    };

    // Before the bound it still counts: retried, and written back while alone.
    run_until(started + c.dead_reclaim_time - seconds(1));
    CHECK(a.ml().snapshot_members() == 1);
    CHECK(a.ml().num_live() == 1);
    CHECK(joins_to_b(started + c.dead_reclaim_time - seconds(90)) > 0);
    REQUIRE(a.ml().flush_snapshot(seconds(10)).ok());
    Result<GossipSnapshot> written = read_gossip_snapshot(c.snapshot_file);
    REQUIRE(written.ok());
    CHECK(written->members == std::vector<GossipSnapshot::Member>{{"B", "10.0.0.2:7946"}});
    CHECK(logs.count({"gossip_snapshot_members_expired"}) == 0);

    // After it: gone (a lone site with no join list is a cluster of its own again, so the
    // daemon takes rollouts), no longer joined, and the file rewritten without it.
    const TimePoint bound = started + c.dead_reclaim_time;
    run_until(bound + c.snapshot_interval + milliseconds(1));
    CHECK(a.ml().snapshot_members() == 0);
    REQUIRE(a.ml().flush_snapshot(seconds(10)).ok());
    written = read_gossip_snapshot(c.snapshot_file);
    REQUIRE(written.ok());
    CHECK(written->members.empty());
    CHECK(written->event_clock == 20);
    run_until(bound + std::chrono::minutes(5));
    CHECK(joins_to_b(bound + seconds(1)) == 0);
    CHECK(a.ml().snapshot_members() == 0);
    CHECK(logs.count({"gossip_snapshot_members_expired", "B@10.0.0.2:7946"}) == 1);
    a.ml().leave();
    REQUIRE(a.ml().flush_snapshot(seconds(10)).ok());
    CHECK(read_gossip_snapshot(c.snapshot_file)->members.empty());
}

TEST_CASE("gossip snapshot: a corrupt, cut, foreign-version or huge file is ignored, said why") {
    edge::testing::TempDir dir;
    const std::string good = valid_snapshot(20, {{"B", "10.0.0.2:7946"}});
    struct Bad {
        std::string name;
        std::string text;
        std::string says;
    };
    const std::vector<Bad> cases = {
        {"garbage", "\x01\x02 not a snapshot\n", "not a gossip snapshot"},
        {"truncated", good.substr(0, good.size() - 6), "cut short"},
        {"version", "edgeserve-gossip-snapshot 7\nevent_clock 20\nend 0\n", "snapshot version '7'"},
        {"clock", "edgeserve-gossip-snapshot 1\nevent_clock 4611686018427387903\nend 0\n",
         "implausible"},
        {"huge", good + std::string(kMaxSnapshotBytes, '#'), "larger than 1048576 bytes"},
    };
    for (const Bad& b : cases) {
        CAPTURE(b.name);
        MembershipConfig c = lan_profile();
        c.snapshot_file = dir.write(b.name + ".snap", b.text);
        LogCapture logs;
        Member a(c);  // Starts as without a snapshot.
        CHECK(a.ml().event_clock() == 0);
        CHECK(a.ml().snapshot_members() == 0);
        CHECK_MESSAGE(logs.count({"gossip_snapshot_ignored", c.snapshot_file, b.says}) == 1,
                      logs.all());
        a.ml().start();
        CHECK(a.transport().streams.empty());
        // Replaced by a good one at the first write.
        a.run_until(a.clock().now() + c.snapshot_interval + milliseconds(1));
        CHECK(a.ml().flush_snapshot(seconds(10)).ok());
        CHECK(read_gossip_snapshot(c.snapshot_file).ok());
    }
    // A directory where the file belongs: ignored, and its writes fail with a message (rate
    // limited), never a crash.
    MembershipConfig c = lan_profile();
    c.snapshot_file = dir.file("a-dir");
    std::filesystem::create_directory(c.snapshot_file);
    {
        LogCapture logs;
        Member a(c);
        CHECK(logs.count({"gossip_snapshot_ignored", c.snapshot_file, "not a regular file"}) == 1);
        a.ml().start();
        a.receive(UserEventMsg{3, "rollout", bytes("v")});
        a.run_until(a.clock().now() + seconds(5));
        CHECK_FALSE(a.ml().flush_snapshot(seconds(10)).ok());
        CHECK_MESSAGE(logs.count({"gossip_snapshot_write_failed", c.snapshot_file}) == 1,
                      logs.all());
    }
    // No file yet (a first start): said at info, not as a problem.
    c.snapshot_file = dir.file("none.snap");
    LogCapture logs;
    Member fresh(c);
    CHECK(fresh.ml().event_clock() == 0);
    CHECK(logs.count({"gossip_snapshot_none", c.snapshot_file}) == 1);
    CHECK(logs.count({"gossip_snapshot_ignored"}) == 0);
}

// Polls `done` every millisecond for at most 10 s: for what a thread of the writer does.
template <typename F>
bool wait_until(F done) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(10);
    while (!done()) {
        if (std::chrono::steady_clock::now() >= deadline) {
            return false;
        }
        std::this_thread::sleep_for(milliseconds(1));
    }
    return true;
}

// The write's two fsyncs can take seconds on a busy disk (a model of hundreds of GB being paged
// in, a slow cloud volume). Written on the strand, they held up every timer, probes and acks
// included, and the peers suspected this member; the strand now only hands the text over.
TEST_CASE("gossip snapshot: a write stuck on a slow disk holds up no timer, the newest text wins") {
    edge::testing::TempDir dir;
    MembershipConfig c = lan_profile();
    c.snapshot_file = dir.file("a.snap");
    Member a(c);
    // The first write is stuck (at most 5 s) until released, as an fsync on a busy disk is.
    struct Disk {
        std::mutex mu;
        std::vector<std::string> texts;  // Every write begun, in order.
        std::promise<void> release;
        std::shared_future<void> released = release.get_future().share();
    };
    auto disk = std::make_shared<Disk>();
    a.ml().set_snapshot_write_for_testing([disk](const std::string& path, std::string_view text) {
        bool first = false;
        {
            std::lock_guard lock(disk->mu);
            disk->texts.emplace_back(text);
            first = disk->texts.size() == 1;
        }
        if (first) {
            (void)disk->released.wait_for(seconds(5));
        }
        return write_file_atomically(path, text);
    });
    auto writes = [&] {
        std::lock_guard lock(disk->mu);
        return disk->texts;
    };
    a.ml().start();
    // Three snapshot intervals, each with a new clock to write.
    for (uint64_t t : {3, 4, 5}) {
        CAPTURE(t);
        a.receive(UserEventMsg{t, "rollout", bytes("v" + std::to_string(t))});
        const auto began = std::chrono::steady_clock::now();
        a.run_until(a.clock().now() + c.snapshot_interval + milliseconds(1));
        const auto took = std::chrono::steady_clock::now() - began;
        CHECK_MESSAGE(took < seconds(2), "the timers took " << to_seconds(took) << " s");
        if (t == 3) {
            // The writer took the first text and is stuck in it before the next is posted.
            REQUIRE(wait_until([&] { return !writes().empty(); }));
        }
    }
    // Still stuck: the two texts posted meanwhile wait as one, the newer.
    CHECK(writes().size() == 1);
    CHECK(a.ml().flush_snapshot(milliseconds(50)).code() == StatusCode::kDeadlineExceeded);
    disk->release.set_value();
    REQUIRE(a.ml().flush_snapshot(seconds(10)).ok());
    const std::vector<std::string> w = writes();
    REQUIRE(w.size() == 2);
    CHECK(decode_gossip_snapshot(w[0])->event_clock == 3);
    CHECK(decode_gossip_snapshot(w[1])->event_clock == 5);
    CHECK(read_gossip_snapshot(c.snapshot_file)->event_clock == 5);
}

// Tests may run as root, which a read-only directory does not stop: the directory is a regular
// file instead (ENOTDIR for anyone), then replaced by a directory.
TEST_CASE("gossip snapshot: a failed write is tried again until it lands, and said once") {
    edge::testing::TempDir dir;
    const std::string parent = dir.write("state", "not a directory\n");
    const std::string path = parent + "/gossip.snapshot";
    {
        LogCapture logs;
        SnapshotWriter w(path, write_file_atomically, milliseconds(10));
        w.post("one\n");
        const Status failed = w.flush(seconds(10));
        CHECK_FALSE(failed.ok());
        CHECK(failed.message().find(path + ".tmp") != std::string::npos);
        // The directory appears (a volume mounted late, an operator's fix): written with no other
        // post, after a back-off of 10 ms, then 20, 40...
        std::filesystem::remove(parent);
        std::filesystem::create_directory(parent);
        REQUIRE(wait_until([&] { return std::filesystem::exists(path); }));
        CHECK(w.flush(seconds(10)).ok());
        CHECK(edge::testing::read_file(path) == "one\n");
        CHECK_MESSAGE(logs.count({"gossip_snapshot_write_failed", path, "Not a directory"}) == 1,
                      logs.all());
        CHECK(logs.count({"gossip_snapshot_write_recovered", path}) == 1);
    }
    // What still waits when the writer goes is written before it does: the newest text.
    const std::string last = dir.file("last.snap");
    {
        SnapshotWriter w(last);
        w.post("a\n");
        w.post("b\n");
    }
    CHECK(edge::testing::read_file(last) == "b\n");
}

// The rolling restart, seed first: the seed (no join list) comes back, and a member restarted
// meanwhile joins it alone: both had sent and seen ~20 events. Without the snapshot both came
// back at clock 0, the member took the seed's 0 as synced and stamped its rollout 1; the members
// that never restarted held 20 and dropped it, while the member answered that it was sent.
TEST_CASE("gossip snapshot: a rollout sent after a restart joined to a restarted seed is taken") {
    edge::testing::TempDir dir;
    MembershipConfig c = lan_profile();
    Cluster sites(4, c, dir.path(), 31);
    for (size_t i = 0; i < 4; ++i) {
        sites.net.schedule(sites.net.now() + milliseconds(10 * static_cast<int64_t>(i)),
                           [&sites, i] { sites[i].start(); });
    }
    REQUIRE(sites.net.run_until_true(
        [&] {
            return sites.sees_each_other({0, 1, 2, 3});
        },
        seconds(30)));
    for (int k = 1; k <= 20; ++k) {
        Memberlist& from = sites[static_cast<size_t>(k % 4)].ml();
        REQUIRE(from.send_user_event("rollout", bytes("v" + std::to_string(k))).ok());
        sites.net.run_for(milliseconds(200));
    }
    sites.net.run_for(seconds(5));
    for (size_t i = 0; i < 4; ++i) {
        REQUIRE(sites[i].held == std::make_pair(uint64_t{20}, std::string("v20")));
    }

    // Seed first, then the member, each leaving gracefully (SIGTERM).
    for (size_t i : {0u, 3u}) {
        sites[i].ml().leave();
        sites.net.run_for(seconds(1));
        sites[i].kill();
    }
    // They come back while the others are out of their reach (their joins to them not answered
    // yet): the member joins the seed alone and counts its clock as synced.
    sites.net.partition({{addr_of(0), addr_of(3)}, {addr_of(1), addr_of(2)}});
    sites[0].start();
    sites[3].start();
    REQUIRE(sites.net.run_until_true(
        [&] {
            return sites.sees_each_other({0, 3}) && sites[3].ml().event_clock_synced();
        },
        seconds(10)));
    CHECK(sites[0].ml().event_clock() >= 20);
    REQUIRE(sites[3].ml().send_user_event("rollout", bytes("v-new")).ok());
    const uint64_t sent_at = sites[3].held ? sites[3].held->first : 0;
    CHECK(sent_at > 20);
    sites.net.run_for(seconds(1));
    sites.net.heal();

    const bool taken = sites.net.run_until_true(
        [&] {
            return sites.sees_each_other({0, 1, 2, 3}) && sites[1].held && sites[2].held &&
                   sites[1].held->second == "v-new" && sites[2].held->second == "v-new";
        },
        seconds(120));
    CHECK_MESSAGE(taken, "site1 holds " << (sites[1].held ? sites[1].held->second : "nothing")
                                        << ", site2 "
                                        << (sites[2].held ? sites[2].held->second : "nothing")
                                        << "; sent at Lamport time " << sent_at);
    CHECK(sites[3].held->second == "v-new");
    CHECK(sites[0].held->second == "v-new");
}

TEST_CASE("gossip snapshot: a seed with no join list rejoins the members it saved") {
    edge::testing::TempDir dir;
    MembershipConfig c = lan_profile();
    // The others do not look for a lost seed within the test: only the seed's own joins count.
    c.reconnect_interval = std::chrono::minutes(10);
    Cluster sites(3, c, dir.path(), 47);
    for (size_t i = 0; i < 3; ++i) {
        sites.net.schedule(sites.net.now() + milliseconds(10 * static_cast<int64_t>(i)),
                           [&sites, i] { sites[i].start(); });
    }
    REQUIRE(sites.net.run_until_true(
        [&] {
            return sites.sees_each_other({0, 1, 2});
        },
        seconds(30)));
    REQUIRE(sites[1].ml().send_user_event("rollout", bytes("v1")).ok());
    sites.net.run_for(seconds(3));
    sites[0].ml().leave();
    sites.net.run_for(seconds(1));
    sites[0].kill();
    sites.net.run_for(seconds(5));

    sites[0].start();
    // Alone, with members saved: not a new cluster (the daemon refuses rollouts until it has
    // rejoined), and its clock is where it was.
    CHECK(sites[0].ml().snapshot_members() == 2);
    CHECK(sites[0].ml().num_live() == 1);
    CHECK(sites[0].ml().event_clock() == 1);
    CHECK_FALSE(sites[0].ml().event_clock_synced());
    const TimePoint restarted = sites.net.now();
    const bool rejoined = sites.net.run_until_true(
        [&] {
            return sites.sees_each_other({0, 1, 2});
        },
        seconds(5));
    MESSAGE("rejoined in " << to_seconds(sites.net.now() - restarted) << " s");
    CHECK(rejoined);
    CHECK(sites[0].ml().event_clock_synced());

    // The others leave for good: they are no longer saved as the way back (serf drops left and
    // failed members too). Kept, site 0 (no join list) would after its next restart wait for
    // them without end, and the daemon refuse rollouts as not yet rejoined.
    for (size_t i : {1u, 2u}) {
        sites[i].ml().leave();
    }
    sites.net.run_for(seconds(3));
    sites[1].kill();
    sites[2].kill();
    sites.net.run_for(seconds(5));
    CHECK(sites[0].ml().num_live() == 1);
    CHECK(sites[0].ml().snapshot_members() == 0);
    sites[0].kill();
    sites[0].start();
    CHECK(sites[0].ml().snapshot_members() == 0);  // A lone site again: a cluster of its own.
    CHECK(sites[0].ml().event_clock() == 1);
}

}  // namespace edge::routing::membership
