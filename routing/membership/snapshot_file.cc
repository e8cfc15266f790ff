#include "routing/membership/snapshot_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>

#include "common/file.h"
#include "common/log.h"
#include "routing/membership/messages.h"

namespace edge::routing::membership {

namespace {

constexpr std::string_view kMagic = "edgeserve-gossip-snapshot";

// What a line can carry and be read back as it was: no line break or other control byte.
bool printable(std::string_view s) {
    return !s.empty() && s.size() <= 255 && std::none_of(s.begin(), s.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
    });
}

std::optional<uint64_t> parse_u64(std::string_view s) {
    if (s.empty() || s.size() > 20 || s.find_first_not_of("0123456789") != std::string_view::npos) {
        return std::nullopt;
    }
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size()) {
        return std::nullopt;
    }
    return v;
}

// A line for an error message: printable, bounded.
std::string quoted(std::string_view line) {
    std::string out = "'";
    for (const char c : line.substr(0, 64)) {
        out.push_back(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f ? c : '?');
    }
    return out + (line.size() > 64 ? "...'" : "'");
}

}  // namespace

std::string encode_gossip_snapshot(const GossipSnapshot& s) {
    std::string out =
        "# edgeserve gossip snapshot: written by the daemon, read at its start; safe to delete\n";
    out += std::string(kMagic) + " " + std::to_string(kGossipSnapshotVersion) + "\n";
    out += "event_clock " + std::to_string(s.event_clock) + "\n";
    size_t n = 0;
    for (const GossipSnapshot::Member& m : s.members) {
        if (n == kMaxSnapshotMembers) {
            break;
        }
        if (!printable(m.name) || !printable(m.addr) || m.addr.find(' ') != std::string::npos) {
            continue;
        }
        out += "member " + m.addr + " " + m.name + "\n";
        ++n;
    }
    out += "end " + std::to_string(n) + "\n";
    return out;
}

Result<GossipSnapshot> decode_gossip_snapshot(std::string_view text) {
    GossipSnapshot s;
    bool header = false;
    bool clock = false;
    bool end = false;
    size_t line_no = 0;
    auto bad = [&](const std::string& what) {
        return data_loss_error("line " + std::to_string(line_no) + ": " + what);
    };
    while (!text.empty()) {
        const size_t nl = text.find('\n');
        const std::string_view line = text.substr(0, nl);
        text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
        ++line_no;
        if (line.empty() || line[0] == '#') {
            continue;
        }
        if (end) {
            return bad("text after the end line");
        }
        const size_t sp = line.find(' ');
        const std::string_view word = line.substr(0, sp);
        const std::string_view rest =
            sp == std::string_view::npos ? std::string_view() : line.substr(sp + 1);
        if (!header) {
            if (word != kMagic) {
                return bad("not a gossip snapshot (expected '" + std::string(kMagic) + " " +
                           std::to_string(kGossipSnapshotVersion) + "', found " + quoted(line) +
                           ")");
            }
            const std::optional<uint64_t> v = parse_u64(rest);
            if (v != uint64_t{kGossipSnapshotVersion}) {
                return bad("snapshot version " + quoted(rest) + "; this build reads version " +
                           std::to_string(kGossipSnapshotVersion));
            }
            header = true;
        } else if (word == "event_clock") {
            const std::optional<uint64_t> v = parse_u64(rest);
            if (clock || !v) {
                return bad(clock ? "a second event_clock line"
                                 : "event_clock " + quoted(rest) + " is not a number");
            }
            if (*v >= kMaxEventLtime - 1) {
                // No cluster reaches it (it rises by one a rollout): restored, this member could
                // stamp no event, and it would carry every member it joins there.
                return bad("event_clock " + std::to_string(*v) +
                           " is implausible (at or above 2^62 - 1, the most a clock can stamp)");
            }
            s.event_clock = *v;
            clock = true;
        } else if (word == "member") {
            const size_t sp2 = rest.find(' ');
            if (sp2 == std::string_view::npos) {
                return bad("expected 'member ADDRESS NAME', found " + quoted(line));
            }
            GossipSnapshot::Member m{std::string(rest.substr(sp2 + 1)),
                                     std::string(rest.substr(0, sp2))};
            if (!printable(m.name) || !printable(m.addr)) {
                return bad("member name or address empty, over 255 bytes or not printable");
            }
            if (s.members.size() == kMaxSnapshotMembers) {
                return bad("more than " + std::to_string(kMaxSnapshotMembers) + " members");
            }
            s.members.push_back(std::move(m));
        } else if (word == "end") {
            const std::optional<uint64_t> v = parse_u64(rest);
            if (v != s.members.size()) {
                return bad("the end line counts " + quoted(rest) + " members, the file has " +
                           std::to_string(s.members.size()) + " (cut short or edited)");
            }
            end = true;
        } else {
            return bad("unknown line " + quoted(line));
        }
    }
    if (!header) {
        return data_loss_error("empty: no '" + std::string(kMagic) + "' line");
    }
    if (!clock) {
        return data_loss_error("no event_clock line");
    }
    if (!end) {
        return data_loss_error("no end line: the file was cut short");
    }
    return s;
}

Result<GossipSnapshot> read_gossip_snapshot(const std::string& path) {
    Result<std::string> text = read_small_file(path, kMaxSnapshotBytes);
    if (!text.ok()) {
        return text.status();  // read_small_file's messages name the path.
    }
    Result<GossipSnapshot> s = decode_gossip_snapshot(*text);
    if (!s.ok()) {
        return s.status().with_context(path);
    }
    return s;
}

struct SnapshotWriter::State {
    State(std::string p, WriteFn w, Duration r)
        : path(std::move(p)), write(std::move(w)), retry_initial(r) {}
    const std::string path;
    const WriteFn write;
    const Duration retry_initial;

    std::mutex mu;
    std::condition_variable wake;      // The thread: text posted, or stopping.
    std::condition_variable tried_cv;  // flush() and the destructor: a write ended, or the thread.
    // The newest text not yet written (a failed one included, until newer replaces it), and the
    // number of the post that brought it.
    std::optional<std::string> pending;
    uint64_t pending_post = 0;
    uint64_t posted = 0;   // Posts so far.
    uint64_t tried = 0;    // The post whose text was tried last,
    Status last;           // and how that went.
    bool writing = false;  // A write is under way.
    bool stopping = false;
    bool exited = false;
    // The owner gave up waiting (kFinalWriteWait) and went on to exit: the thread logs nothing
    // more, the logger may be gone with the process' statics.
    bool detached = false;
};

SnapshotWriter::SnapshotWriter(std::string path, WriteFn write, Duration retry_initial)
    : path_(std::move(path)),
      state_(std::make_shared<State>(path_, std::move(write), retry_initial)),
      thread_([s = state_] { run(s); }) {}

SnapshotWriter::~SnapshotWriter() {
    std::unique_lock lock(state_->mu);
    state_->stopping = true;
    state_->wake.notify_all();
    const bool exited =
        state_->tried_cv.wait_for(lock, kFinalWriteWait, [&] { return state_->exited; });
    if (!exited) {
        state_->detached = true;
    }
    lock.unlock();
    if (exited) {
        thread_.join();
        return;
    }
    log::warn("gossip_snapshot_write_slow",
              {{"path", path_},
               {"waited_ms",
                std::chrono::duration_cast<std::chrono::milliseconds>(kFinalWriteWait).count()},
               {"detail",
                "a snapshot write is still stuck in the disk: shutting down without "
                "waiting for it; the file holds the previous snapshot or the new one"}});
    thread_.detach();  // It holds state_ and nothing else of this object.
}

void SnapshotWriter::post(std::string text) {
    std::lock_guard lock(state_->mu);
    state_->pending = std::move(text);
    state_->pending_post = ++state_->posted;
    state_->wake.notify_all();
}

Status SnapshotWriter::flush(Duration timeout) {
    std::unique_lock lock(state_->mu);
    const uint64_t target = state_->posted;
    if (!state_->tried_cv.wait_for(lock, timeout, [&] {
            return (state_->tried >= target && !state_->writing) || state_->exited;
        })) {
        return deadline_exceeded_error("the gossip snapshot " + path_ + " is still being written");
    }
    if (state_->tried < target) {
        return failed_precondition_error("the gossip snapshot writer has stopped");
    }
    return state_->last;
}

void SnapshotWriter::run(const std::shared_ptr<State>& s) {
    using Steady = std::chrono::steady_clock;
    Duration backoff = s->retry_initial;
    std::optional<Steady::time_point> retry_at;  // Set while the pending text is a failed one.
    std::optional<Steady::time_point> warned;
    uint64_t suppressed = 0;
    bool failing = false;
    std::unique_lock lock(s->mu);
    for (;;) {
        if (!s->pending) {
            if (s->stopping) {
                break;
            }
            s->wake.wait(lock, [&] { return s->pending || s->stopping; });
            continue;
        }
        if (retry_at && !s->stopping) {
            // The failed text again after the back-off; newer text, or stopping, goes at once.
            const uint64_t failed_post = s->pending_post;
            s->wake.wait_until(lock, *retry_at,
                               [&] { return s->stopping || s->pending_post != failed_post; });
        }
        const bool last_try = s->stopping;
        std::string text = std::move(*s->pending);
        const uint64_t post = s->pending_post;
        s->pending.reset();
        s->writing = true;
        lock.unlock();
        Status st = s->write(s->path, text);
        const Steady::time_point now = Steady::now();
        bool quiet = false;
        {
            std::lock_guard detached(s->mu);
            quiet = s->detached;
        }
        if (quiet) {
            // Nothing is logged after the owner left (see State::detached).
        } else if (!st.ok()) {
            if (!warned || now - *warned >= kWarnInterval) {
                log::warn("gossip_snapshot_write_failed",
                          {{"path", s->path},
                           {"error", st.to_string()},
                           {"suppressed", suppressed},
                           {"retry_in_ms",
                            std::chrono::duration_cast<std::chrono::milliseconds>(backoff).count()},
                           {"detail",
                            "the event clock and members are not kept across a restart "
                            "until it can be written (gossip.snapshot_file)"}});
                warned = now;
                suppressed = 0;
            } else {
                ++suppressed;
            }
            failing = true;
        } else if (failing) {
            log::info("gossip_snapshot_write_recovered", {{"path", s->path}});
            failing = false;
            suppressed = 0;
        }
        lock.lock();
        s->tried = post;
        s->last = st;
        s->writing = false;
        if (st.ok()) {
            backoff = s->retry_initial;
            retry_at.reset();
        } else if (!s->pending) {  // Nothing newer: this text is still the one to write.
            s->pending = std::move(text);
            s->pending_post = post;
            retry_at = now + backoff;
            backoff = std::min<Duration>(backoff * 2, kMaxRetryInterval);
        } else {
            retry_at.reset();
        }
        s->tried_cv.notify_all();
        if (last_try) {
            break;
        }
    }
    s->exited = true;
    s->tried_cv.notify_all();
}

}  // namespace edge::routing::membership
