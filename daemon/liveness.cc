#include "daemon/liveness.h"

namespace edge::daemon {

Liveness::Liveness(std::function<void(std::function<void()>)> post_to_io,
                   std::function<std::vector<engine::ServingStats>()> stats)
    : post_to_io_(std::move(post_to_io)), stats_(std::move(stats)) {}

std::string Liveness::check(TimePoint now, std::chrono::milliseconds stall) {
    std::lock_guard lock(mu_);
    std::string stuck;
    if (probe_ && !probe_->done.load()) {
        if (now - probe_posted_ > stall) {
            stuck = "io";
        }
    } else {
        probe_ = std::make_shared<Probe>();
        probe_posted_ = now;
        post_to_io_([probe = probe_] { probe->done.store(true); });
    }
    const std::vector<engine::ServingStats> stats = stats_();
    if (stats.size() != steps_.size()) {
        steps_.assign(stats.size(), -1);
        layers_.assign(stats.size(), -1);
        progress_at_.assign(stats.size(), now);
        busy_.assign(stats.size(), false);
    }
    for (size_t i = 0; i < stats.size(); ++i) {
        // A step that ended, or a layer of the step still running (one long step, a large
        // prefill chunk, is not a stall while its layers keep finishing). A batch that was
        // empty at the last check began since: its first step is timed from now, not from that
        // check, a whole interval ago (the scheduler publishes the batch before its first
        // layer ends, so the first check after an idle spell saw no progress yet and, with
        // `stall` equal to the interval, withheld the ping: systemd restarted a healthy daemon).
        const bool busy = stats[i].batch_sequences > 0;
        if (stats[i].steps != steps_[i] || stats[i].layers_run != layers_[i] || !busy ||
            !busy_[i]) {
            steps_[i] = stats[i].steps;
            layers_[i] = stats[i].layers_run;
            progress_at_[i] = now;
            busy_[i] = busy;
        } else if (now - progress_at_[i] > stall && stuck.empty()) {
            stuck = "engine";
        }
    }
    return stuck;
}

}  // namespace edge::daemon
