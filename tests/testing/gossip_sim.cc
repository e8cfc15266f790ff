#include "tests/testing/gossip_sim.h"

#include <cmath>

#include "common/check.h"

namespace edge::testing {

using routing::membership::Keyring;
using routing::membership::MemberEvent;
using routing::membership::MemberEventKind;
using routing::membership::Memberlist;
using routing::membership::MembershipConfig;
using routing::membership::NodeState;
using routing::membership::SiteState;

namespace {

// A member's view of time: runs at `rate` times the simulation's clock from `origin` on.
class NodeClock final : public Clock {
public:
    explicit NodeClock(const ManualClock& global) : global_(global) {}
    TimePoint now() const override {
        if (rate_ == 1.0) {
            return global_.now();
        }
        const double elapsed = static_cast<double>((global_.now() - origin_).count());
        return origin_ + Duration(static_cast<int64_t>(std::floor(elapsed * rate_)));
    }
    int64_t wall_now_us() const override { return global_.wall_now_us(); }
    // The global time at which this clock shows `local`.
    TimePoint to_global(TimePoint local) const {
        if (rate_ == 1.0 || local == TimePoint::max()) {
            return local;
        }
        const double elapsed = static_cast<double>((local - origin_).count());
        return origin_ + Duration(static_cast<int64_t>(std::ceil(elapsed / rate_)) + 1);
    }
    void set_rate(double rate) {
        origin_ = global_.now();
        rate_ = rate;
    }

private:
    const ManualClock& global_;
    double rate_ = 1.0;
    TimePoint origin_{};
};

}  // namespace

struct GossipSim::Node final : routing::membership::Transport {
    GossipSim* sim = nullptr;
    size_t index = 0;
    std::string addr;
    std::unique_ptr<NodeClock> clock;
    std::unique_ptr<Memberlist> ml;
    bool alive = true;
    TimePoint pending = TimePoint::max();
    // Bumped by restart(): callbacks of an earlier process are dropped.
    uint64_t generation = 0;

    void send_packet(const std::string& to, std::vector<uint8_t> bytes) override {
        sim->net_.send_packet(addr, to, std::move(bytes));
    }
    void send_stream(const std::string& to, uint64_t id, std::vector<uint8_t> req) override {
        sim->net_.send_stream(addr, to, std::move(req),
                              [this, id, gen = generation](Result<std::vector<uint8_t>> r) {
                                  if (!alive || generation != gen) {
                                      return;
                                  }
                                  ml->handle_stream_response(id, std::move(r));
                                  sim->reschedule(*this);
                              });
    }
};

GossipSim::GossipSim(size_t n, MembershipConfig base, uint64_t seed,
                     std::optional<routing::membership::GossipKey> key)
    : net_(seed), base_(std::move(base)), key_(key), seed_(seed) {
    for (size_t i = 0; i < n; ++i) {
        auto node = std::make_unique<Node>();
        node->sim = this;
        node->index = i;
        node->addr = addr(i);
        node->clock = std::make_unique<NodeClock>(net_.clock());
        SiteState site;
        site.site_id = name(i);
        site.region = i % 2 == 0 ? "eu" : "us";
        site.peer_addr = node->addr;
        index_[name(i)] = i;
        create_member(*node, std::move(site));
        nodes_.push_back(std::move(node));
    }
    net_.set_stream_timeout(base_.stream_timeout);
}

void GossipSim::create_member(Node& node, SiteState site) {
    const size_t i = node.index;
    MembershipConfig c = base_;
    c.name = name(i);
    c.advertise_addr = node.addr;
    c.seed = seed_ * 1000003 + i + 7919 * node.generation;
    Keyring ring;
    if (key_) {
        ring = Keyring::create({*key_}).value();
    }
    auto ml = Memberlist::create(c, std::move(ring), *node.clock, node, std::move(site));
    EDGE_CHECK(ml.ok(), ml.status().to_string());
    node.ml = std::move(ml).value();
    Node* raw = &node;
    node.ml->set_event_callback([this, i](const MemberEvent& e) {
        if (e.kind == MemberEventKind::kDead) {
            auto it = index_.find(e.name);
            if (it != index_.end() && nodes_[it->second]->alive) {
                ++false_deaths_;
                false_death_log_.push_back(name(i) + "->" + e.name);
            }
        }
    });
    net_.attach(
        node.addr,
        [this, raw](const std::string& from, std::vector<uint8_t> bytes) {
            if (!raw->alive) {
                return;
            }
            raw->ml->handle_packet(from, bytes);
            reschedule(*raw);
        },
        [this, raw](const std::string& from,
                    std::vector<uint8_t> bytes) -> Result<std::vector<uint8_t>> {
            auto r = raw->ml->handle_stream(from, bytes);
            reschedule(*raw);
            return r;
        });
}

GossipSim::~GossipSim() = default;

Memberlist& GossipSim::node(size_t i) { return *nodes_.at(i)->ml; }

void GossipSim::set_clock_rate(size_t i, double rate) { nodes_.at(i)->clock->set_rate(rate); }

void GossipSim::reschedule(Node& n) {
    if (!n.alive) {
        return;
    }
    const TimePoint at = n.clock->to_global(n.ml->next_deadline());
    if (at == TimePoint::max() || (n.pending != TimePoint::max() && n.pending <= at)) {
        return;
    }
    n.pending = at;
    Node* raw = &n;
    net_.schedule(at, [this, raw, at] {
        if (!raw->alive || raw->pending != at) {
            return;
        }
        raw->pending = TimePoint::max();
        raw->ml->run_due_timers();
        reschedule(*raw);
    });
}

void GossipSim::start_all(Duration spacing) {
    for (size_t i = 0; i < nodes_.size(); ++i) {
        Node* raw = nodes_[i].get();
        net_.schedule(net_.now() + spacing * static_cast<int64_t>(i), [this, raw] {
            raw->ml->start();
            if (raw->index != 0) {
                raw->ml->join({addr(0)});
            }
            reschedule(*raw);
        });
    }
}

void GossipSim::kill(size_t i) {
    nodes_.at(i)->alive = false;
    net_.detach(nodes_[i]->addr);
}

bool GossipSim::is_killed(size_t i) const { return !nodes_.at(i)->alive; }

void GossipSim::restart(size_t i, SiteState site) {
    Node& n = *nodes_.at(i);
    EDGE_CHECK(!n.alive, "restart a killed member");
    // Whatever the previous process had in flight (streams, timers) must not reach the new one.
    ++n.generation;
    n.pending = TimePoint::max();
    create_member(n, std::move(site));
    n.alive = true;
    n.ml->start();
    if (i != 0) {
        n.ml->join({addr(0)});
    }
    reschedule(n);
}

bool GossipSim::run_until(const std::function<bool()>& pred, Duration limit, Duration step) {
    const TimePoint end = net_.now() + limit;
    while (!pred()) {
        if (net_.now() >= end) {
            return false;
        }
        net_.run_until(std::min(end, net_.now() + step));
    }
    return true;
}

bool GossipSim::converged() const {
    size_t live = 0;
    for (const auto& n : nodes_) {
        live += n->alive ? 1 : 0;
    }
    for (const auto& n : nodes_) {
        if (!n->alive) {
            continue;
        }
        const auto& s = n->ml->stats();
        if (n->ml->num_live() != live || s.members_suspect.load() != 0 ||
            static_cast<size_t>(s.members_alive.load()) != live) {
            return false;
        }
    }
    return true;
}

size_t GossipSim::count_seeing_dead(size_t target) const {
    size_t count = 0;
    for (const auto& n : nodes_) {
        if (!n->alive || n->index == target) {
            continue;
        }
        auto st = n->ml->state_of(name(target));
        if (st && (*st == NodeState::kDead || *st == NodeState::kLeft)) {
            ++count;
        }
    }
    return count;
}

size_t GossipSim::count_with_version(size_t target, uint64_t version) const {
    size_t count = 0;
    for (const auto& n : nodes_) {
        if (!n->alive) {
            continue;
        }
        auto v = n->ml->site_version_of(name(target));
        if (v && *v >= version) {
            ++count;
        }
    }
    return count;
}

}  // namespace edge::testing
