// PeerClient::Impl's pool of idle keep-alive connections, per peer (site and address): bounded
// by max_idle_connections, closed past pool_idle_timeout (by a timer armed while any is pooled,
// so with no traffic too), and never reused across a certificate reload. Strand only.

#include <algorithm>

#include "daemon/forward/peer_client_impl.h"

namespace edge::daemon::forward {

std::unique_ptr<Connection> PeerClient::Impl::take_pooled(const std::string& peer) {
    auto it = pool_.find(peer);
    if (it == pool_.end()) {
        return nullptr;
    }
    drop_expired(it->second, SteadyClock::now());
    std::unique_ptr<Connection> c;
    if (!it->second.empty()) {
        c = std::move(it->second.back());
        it->second.pop_back();
        idle_.fetch_sub(1);
        c->reused = true;
    }
    if (it->second.empty()) {
        pool_.erase(it);
    }
    if (pool_.empty()) {
        disarm_sweep();
    }
    return c;
}

void PeerClient::Impl::drop_expired(std::deque<std::unique_ptr<Connection>>& idle,
                                    SteadyClock::time_point now) {
    const auto old = std::remove_if(idle.begin(), idle.end(), [&](auto& c) {
        if (now - c->idle_since <= config_.pool_idle_timeout) {
            return false;
        }
        // Uncounted before it is closed: whoever sees the close (the peer, a test) never reads
        // a count that still holds it.
        idle_.fetch_sub(1);
        c->close();
        return true;
    });
    idle.erase(old, idle.end());
}

void PeerClient::Impl::give_back(const std::string& peer, std::unique_ptr<Connection> connection) {
    const auto it = pool_.find(peer);
    const size_t pooled = it == pool_.end() ? 0 : it->second.size();
    // One opened before a certificate reload keeps the old certificates: not reused.
    if (stopping_.load() || pooled >= static_cast<size_t>(config_.max_idle_connections) ||
        connection->context != context()) {
        connection->close();
        return;
    }
    connection->idle_since = SteadyClock::now();
    pool_[peer].push_back(std::move(connection));
    idle_.fetch_add(1);
    arm_sweep();
}

void PeerClient::Impl::arm_sweep() {
    if (sweep_armed_) {
        return;
    }
    SteadyClock::time_point oldest = SteadyClock::time_point::max();
    for (const auto& [peer, idle] : pool_) {
        for (const auto& c : idle) {
            oldest = std::min(oldest, c->idle_since);
        }
    }
    if (oldest == SteadyClock::time_point::max()) {
        return;  // Nothing pooled.
    }
    // Just past the timeout: drop_expired keeps a connection idle for exactly the timeout.
    sweep_timer_.expires_at(oldest + config_.pool_idle_timeout + SteadyClock::duration(1));
    sweep_armed_ = true;
    sweep_timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
        std::shared_ptr<Impl> self = weak.lock();
        // Cancelled (close_idle(), or re-armed): whoever did it owns sweep_armed_ now.
        if (ec || self == nullptr) {
            return;
        }
        self->sweep_armed_ = false;
        self->sweep_idle();
    });
}

void PeerClient::Impl::disarm_sweep() {
    sweep_timer_.cancel();
    sweep_armed_ = false;
}

void PeerClient::Impl::sweep_idle() {
    const auto now = SteadyClock::now();
    // Idle past the timeout (the peer has likely closed its end: the socket sits in CLOSE_WAIT),
    // for every peer, one that left the cluster or changed its address too.
    for (auto it = pool_.begin(); it != pool_.end();) {
        drop_expired(it->second, now);
        it = it->second.empty() ? pool_.erase(it) : std::next(it);
    }
    arm_sweep();
}

void PeerClient::Impl::close_idle() {
    for (auto& [peer, idle] : pool_) {
        idle_.fetch_sub(static_cast<int64_t>(idle.size()));  // Before the closes: drop_expired.
        for (auto& c : idle) {
            c->close();
        }
    }
    pool_.clear();
    disarm_sweep();
}

}  // namespace edge::daemon::forward
