#pragma once

// FairQueue holds a scheduler's waiting sequences and decides which one is admitted next:
// deficit round robin (DRR) on tokens between tenants, first come first served within a tenant.
// Each tenant with waiting requests is visited in turn; at the start of its turn its deficit grows
// by quantum_tokens x weight, and its oldest request is admitted while the deficit covers the
// request's cost (prompt tokens + max_tokens, the most it can use). A tenant whose queue empties
// loses its deficit, so idle time earns no credit. Unused tokens of a finished request may be
// refunded, and a preempted request is requeued first in its tenant's queue with its cost
// refunded, so neither is charged twice; what a request gives back goes only to the backlog that
// paid for it (a tenant's queue that emptied since is a new backlog, owed nothing). With every
// tenant backlogged, each one's share of admitted tokens converges to its weight's share,
// whatever the number of requests it sends.
// The scheduler may restrict a pop to some tenants (those with the fewest places in its batch
// per weight), or take a given tenant's oldest request out of turn (pop_tenant); either is
// charged the same way, a deficit going negative if need be, so DRR makes up for it later;
// except a place the scheduler time-shares by its own count of tokens served, which it does not
// charge (that count, not DRR, keeps such a tenant to its share). A deficit is capped at one
// turn's quantum beyond the tenant's next request when its turn opens, so a tenant whose turns
// pass while the scheduler holds it back banks no credit; credit given back (push_front's refund
// for a preempted request, refund()) is left out of the cap, being no quantum it banked.
//
// Not thread-safe: the scheduler guards it with its mutex.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/sched/sequence.h"

namespace edge::engine::sched {

class FairQueue {
public:
    // One tenant with requests waiting.
    struct Backlog {
        std::string tenant;
        size_t waiting = 0;  // Requests.
        int32_t weight = 1;  // Its weight (the latest request's).
    };

    // `quantum_tokens` (>= 1): deficit added per turn for a weight of 1.
    explicit FairQueue(int64_t quantum_tokens = 512);

    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    // `tenant`'s requests waiting for their first admission: preempted ones, requeued by
    // push_front, are not counted (the scheduler's per-tenant bound leaves them out).
    size_t tenant_new_size(const std::string& tenant) const;
    // Sum of cost() over the waiting requests, tokens.
    int64_t queued_cost() const { return queued_cost_; }

    // A new request: last in its tenant's queue. The tenant's weight becomes the request's.
    void push_back(std::unique_ptr<Sequence> seq);
    // A preempted request: first in its tenant's queue; its cost is refunded.
    void push_front(std::unique_ptr<Sequence> seq);
    // The next request by DRR, charged to its tenant; null when empty.
    std::unique_ptr<Sequence> pop();
    // The next request by DRR among the tenants for which `eligible` is true (the others' turns
    // pass without a quantum); null when there is none.
    std::unique_ptr<Sequence> pop_if(const std::function<bool(const std::string&)>& eligible);
    // `tenant`'s oldest request out of turn, charged to it unless `charge` is false (then no
    // refund() applies to it either); null when it has none waiting.
    std::unique_ptr<Sequence> pop_tenant(const std::string& tenant, bool charge = true);
    // The tenants with requests waiting, by name.
    std::vector<Backlog> backlog() const;
    // Priority of `tenant`'s oldest waiting request (the next it admits); 0 when none.
    int32_t head_priority(const std::string& tenant) const;
    // `tenant`'s oldest waiting request (the next pop_tenant takes), left in place; null when it
    // has none waiting. Valid until the queue changes.
    const Sequence* head(const std::string& tenant) const;
    // Credits `tokens` back to `seq`'s tenant (a request that ended before using all of its
    // max_tokens) while the backlog its admission was charged to still waits.
    void refund(const Sequence& seq, int64_t tokens);
    // Removes and returns every request for which `pred` is true (cancelled ones). A preempted
    // one (refunded by push_front) is charged what it used, as if it had ended running.
    std::vector<std::unique_ptr<Sequence>> take_if(
        const std::function<bool(const Sequence&)>& pred);

    // What admitting `seq` charges its tenant: prompt tokens + max_tokens.
    static int64_t cost(const Sequence& seq);

private:
    struct Flow {
        std::deque<std::unique_ptr<Sequence>> queue;
        int64_t deficit = 0;
        int64_t weight = 1;
        uint64_t id = 0;  // Distinct per backlog: a tenant whose queue empties gets a new one.
        // Of the queue, the requests with preemptions > 0 (not in tenant_new_size()).
        size_t preempted = 0;
        // Of the deficit, credit given back rather than banked, which the cap at a turn's
        // opening leaves alone: what push_front refunded for the preempted requests queued
        // (their re-admission takes it back), and what refund() gave since the turn last opened.
        int64_t preempted_cost = 0;
        int64_t refunded = 0;
    };
    Flow& flow_for(const std::string& tenant);
    // Takes `f`'s oldest request, charged to it (Sequence::charged_flow) if `charge`; drops `f`
    // if emptied.
    std::unique_ptr<Sequence> take_head(const std::string& tenant, Flow& f, bool charge = true);
    void drop_if_empty(const std::string& tenant);

    int64_t quantum_;
    std::map<std::string, Flow> flows_;  // Only tenants with waiting requests.
    std::deque<std::string> active_;     // Round-robin order; the front has the turn.
    bool turn_open_ = false;             // The front's quantum for this turn was added.
    uint64_t next_flow_id_ = 1;
    size_t size_ = 0;
    int64_t queued_cost_ = 0;
};

}  // namespace edge::engine::sched
