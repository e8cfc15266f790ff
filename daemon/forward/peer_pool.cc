// PeerClient::Impl's pool of idle keep-alive connections, per peer (site and address): bounded
// by max_idle_connections, closed past pool_idle_timeout, and never reused across a certificate
// reload. Strand only.

#include <algorithm>

#include "daemon/forward/peer_client_impl.h"

namespace edge::daemon::forward {

std::unique_ptr<Connection> PeerClient::Impl::take_pooled(const std::string& peer) {
    auto it = pool_.find(peer);
    if (it == pool_.end()) {
        return nullptr;
    }
    drop_expired(it->second, SteadyClock::now());
    if (it->second.empty()) {
        return nullptr;
    }
    std::unique_ptr<Connection> c = std::move(it->second.back());
    it->second.pop_back();
    idle_.fetch_sub(1);
    c->reused = true;
    return c;
}

void PeerClient::Impl::drop_expired(std::deque<std::unique_ptr<Connection>>& idle,
                                    SteadyClock::time_point now) {
    const auto old = std::remove_if(idle.begin(), idle.end(), [&](auto& c) {
        if (now - c->idle_since <= config_.pool_idle_timeout) {
            return false;
        }
        c->close();
        return true;
    });
    idle_.fetch_sub(static_cast<int64_t>(idle.end() - old));
    idle.erase(old, idle.end());
}

void PeerClient::Impl::give_back(const std::string& peer, std::unique_ptr<Connection> connection) {
    sweep_idle();
    auto& idle = pool_[peer];
    // One opened before a certificate reload keeps the old certificates: not reused.
    if (stopping_.load() || idle.size() >= static_cast<size_t>(config_.max_idle_connections) ||
        connection->context != context()) {
        connection->close();
        return;
    }
    connection->idle_since = SteadyClock::now();
    idle.push_back(std::move(connection));
    idle_.fetch_add(1);
}

void PeerClient::Impl::sweep_idle() {
    const auto now = SteadyClock::now();
    if (now - last_sweep_ < config_.pool_idle_timeout) {
        return;
    }
    last_sweep_ = now;
    // Idle past the timeout (the peer has likely closed its end: the socket sits in CLOSE_WAIT),
    // for every peer, one that left the cluster or changed its address too.
    for (auto it = pool_.begin(); it != pool_.end();) {
        drop_expired(it->second, now);
        it = it->second.empty() ? pool_.erase(it) : std::next(it);
    }
}

void PeerClient::Impl::close_idle() {
    for (auto& [peer, idle] : pool_) {
        for (auto& c : idle) {
            c->close();
        }
        idle_.fetch_sub(static_cast<int64_t>(idle.size()));
    }
    pool_.clear();
}

}  // namespace edge::daemon::forward
