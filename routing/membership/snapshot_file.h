#pragma once

// The gossip snapshot file (serf's -snapshot): what a member keeps across restarts so that it
// neither starts its user event Lamport clock at 0 nor forgets the cluster. Its clock stamps
// rollout intents, kept newest per model by that time: a restarted member whose clock started
// at 0, joined only to another just restarted at 0, counted as synced and stamped intents every
// other member dropped as older than the one it held. A small versioned text file:
//
//   # comments
//   edgeserve-gossip-snapshot 1
//   event_clock 42
//   member 10.0.0.2:7946 site-b          (address, then the name: the rest of the line)
//   end 1                                (the number of member lines: a cut file is refused)
//
// Written whole to a temporary file beside it, flushed to disk and renamed over it, so a reader
// sees the previous snapshot or the new one, never a mix; a symlink at either name is replaced,
// never written through. The daemon writes it through a SnapshotWriter, on a thread of its own:
// the two fsyncs can take seconds on a busy disk, and the membership strand must keep answering
// probes meanwhile.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/file.h"  // write_file_atomically
#include "common/result.h"

namespace edge::routing::membership {

inline constexpr int kGossipSnapshotVersion = 1;
// Members written at most: enough to find the cluster again, and a bound on the file.
inline constexpr size_t kMaxSnapshotMembers = 1024;
// A file larger than this is refused unread.
inline constexpr uint64_t kMaxSnapshotBytes = uint64_t{1} << 20;

struct GossipSnapshot {
    struct Member {
        std::string name;
        std::string addr;
        bool operator==(const Member&) const = default;
    };
    uint64_t event_clock = 0;
    std::vector<Member> members;  // At most kMaxSnapshotMembers; never this member.
    bool operator==(const GossipSnapshot&) const = default;
};

// The file's text. Members whose name or address could not be read back (a control character,
// an address with a space, over 255 bytes) are left out, as are those past kMaxSnapshotMembers.
std::string encode_gossip_snapshot(const GossipSnapshot& s);
// kDataLoss naming what is wrong: not a snapshot, another version, a clock at or above
// kMaxEventLtime - 1 (the most a clock can stamp; no cluster reaches it), a cut file (no `end`
// line, or a count that differs), more than kMaxSnapshotMembers members, an unknown line.
Result<GossipSnapshot> decode_gossip_snapshot(std::string_view text);

// The snapshot at `path`: kNotFound when there is none, another error (naming the path) when it
// cannot be read or decoded (larger than kMaxSnapshotBytes, not a regular file, malformed).
Result<GossipSnapshot> read_gossip_snapshot(const std::string& path);

// Writes the snapshot file off the membership strand, as serf's snapshotter goroutine does: post()
// hands over the newest text and returns at once, a thread of its own writes it with
// write_file_atomically. Only the newest text matters: one posted while a write is under way
// replaces any other still waiting, so a slow disk costs writes skipped, never a queue. A failed
// write is logged (the path and error, at most once per kWarnInterval, with the count left out)
// and tried again after a back-off (retry_initial, doubling up to kMaxRetryInterval) unless newer
// text comes first, which is tried at once (Memberlist posts at most once per snapshot_interval).
//
// Threading: post() and flush() may be called from any thread; the writer touches nothing but
// its own state. Lifetime: the destructor tries once more to write what is still waiting, waits
// for that at most kFinalWriteWait, and ends the thread (a write stuck in the kernel longer than
// that is left to finish on its own, with a warning, rather than hang the shutdown).
class SnapshotWriter {
public:
    using WriteFn = std::function<Status(const std::string& path, std::string_view text)>;
    static constexpr std::chrono::seconds kMaxRetryInterval{30};
    // Short: it comes on top of the stop path's fixed parts, which systemd's TimeoutStopSec must
    // cover (systemd_units_test); a disk that slow loses the last snapshot, not the process.
    static constexpr std::chrono::seconds kFinalWriteWait{1};
    static constexpr std::chrono::seconds kWarnInterval{10};

    // `write`: write_file_atomically unless a test injects another (one that blocks, say).
    explicit SnapshotWriter(std::string path, WriteFn write = write_file_atomically,
                            Duration retry_initial = std::chrono::seconds(1));
    ~SnapshotWriter();
    SnapshotWriter(const SnapshotWriter&) = delete;
    SnapshotWriter& operator=(const SnapshotWriter&) = delete;

    const std::string& path() const { return path_; }
    // Never waits on I/O: stores `text` for the thread (replacing any not yet written) and wakes
    // it.
    void post(std::string text);
    // Waits, at most `timeout`, for the write under way and until the newest text posted before
    // the call has been tried: returns how the last try went (a failed text stays waiting to be
    // tried again), or kDeadlineExceeded. OK at once when nothing was posted.
    Status flush(Duration timeout);

private:
    struct State;
    static void run(const std::shared_ptr<State>& s);

    std::string path_;
    // Shared with the thread, so that one left running past kFinalWriteWait owns what it uses.
    std::shared_ptr<State> state_;
    std::thread thread_;
};

}  // namespace edge::routing::membership
