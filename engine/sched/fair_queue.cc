#include "engine/sched/fair_queue.h"

#include <algorithm>

namespace edge::engine::sched {

FairQueue::FairQueue(int64_t quantum_tokens) : quantum_(std::max<int64_t>(quantum_tokens, 1)) {}

int64_t FairQueue::cost(const Sequence& seq) {
    return std::max<int64_t>(1, int64_t{seq.prompt_len} + std::max(seq.params.max_tokens, 0));
}

size_t FairQueue::tenant_new_size(const std::string& tenant) const {
    auto it = flows_.find(tenant);
    return it == flows_.end() ? 0 : it->second.queue.size() - it->second.preempted;
}

FairQueue::Flow& FairQueue::flow_for(const std::string& tenant) {
    auto [it, inserted] = flows_.try_emplace(tenant);
    if (inserted) {
        it->second.id = next_flow_id_++;
        active_.push_back(tenant);
    }
    return it->second;
}

void FairQueue::drop_if_empty(const std::string& tenant) {
    auto it = flows_.find(tenant);
    if (it == flows_.end() || !it->second.queue.empty()) {
        return;
    }
    flows_.erase(it);
    auto pos = std::find(active_.begin(), active_.end(), tenant);
    if (pos == active_.begin()) {
        turn_open_ = false;
    }
    active_.erase(pos);
}

void FairQueue::push_back(std::unique_ptr<Sequence> seq) {
    Flow& f = flow_for(seq->tenant);
    f.weight = std::max<int64_t>(seq->tenant_weight, 1);
    queued_cost_ += cost(*seq);
    f.preempted += seq->preemptions > 0 ? 1 : 0;
    f.queue.push_back(std::move(seq));
    ++size_;
}

void FairQueue::push_front(std::unique_ptr<Sequence> seq) {
    Flow& f = flow_for(seq->tenant);
    if (f.queue.empty()) {
        f.weight = std::max<int64_t>(seq->tenant_weight, 1);  // A new flow's weight.
    }
    f.deficit += cost(*seq);
    if (seq->preemptions > 0) {
        f.preempted_cost += cost(*seq);  // Taken back with it (take_head, take_if).
    }
    queued_cost_ += cost(*seq);
    f.preempted += seq->preemptions > 0 ? 1 : 0;
    f.queue.push_front(std::move(seq));
    ++size_;
}

std::unique_ptr<Sequence> FairQueue::pop() {
    return pop_if([](const std::string&) { return true; });
}

std::unique_ptr<Sequence> FairQueue::pop_if(
    const std::function<bool(const std::string&)>& eligible) {
    if (std::none_of(active_.begin(), active_.end(), eligible)) {
        return nullptr;
    }
    // Terminates: every pass over the active tenants adds at least quantum_ to each eligible
    // one's deficit.
    while (true) {
        const std::string tenant = active_.front();
        if (!eligible(tenant)) {
            // Its turn passes without a quantum.
            active_.pop_front();
            active_.push_back(tenant);
            turn_open_ = false;
            continue;
        }
        Flow& f = flows_.at(tenant);
        if (!turn_open_) {
            // At most one turn's quantum beyond its next request: a tenant whose turns pass
            // while it is ineligible (after one admission, by the scheduler's places) keeps what
            // it did not spend, and would otherwise bank it turn after turn, to take a run of
            // admissions once eligible; credit from a higher weight before a reload goes too.
            // Credit given back is no such thing: capped, the refund for a preempted request
            // would not pay its re-admission (taken out of turn, or by a time-shared place).
            const int64_t kept = f.preempted_cost + f.refunded;
            f.deficit = std::min(f.deficit - kept + quantum_ * f.weight,
                                 quantum_ * f.weight + cost(*f.queue.front())) +
                        kept;
            f.refunded = 0;
            turn_open_ = true;
        }
        if (f.deficit >= cost(*f.queue.front())) {
            return take_head(tenant, f);  // An emptied queue loses its deficit and its turn.
        }
        // The turn ends; the deficit carries to the tenant's next turn.
        active_.pop_front();
        active_.push_back(tenant);
        turn_open_ = false;
    }
}

std::unique_ptr<Sequence> FairQueue::pop_tenant(const std::string& tenant, bool charge) {
    auto it = flows_.find(tenant);
    if (it == flows_.end()) {
        return nullptr;
    }
    return take_head(tenant, it->second, charge);
}

std::unique_ptr<Sequence> FairQueue::take_head(const std::string& tenant, Flow& f, bool charge) {
    const int64_t c = cost(*f.queue.front());
    std::unique_ptr<Sequence> seq = std::move(f.queue.front());
    if (charge || seq->preemptions > 0) {
        // A preempted request takes back what push_front refunded, charged or not.
        f.deficit -= c;
    }
    f.queue.pop_front();
    --size_;
    queued_cost_ -= c;
    if (seq->preemptions == 0) {
        // A preempted request's admission is paid by the backlog that first admitted it
        // (push_front refunded this charge in advance). One not charged is owed no refund.
        seq->charged_flow = charge ? f.id : 0;
    } else {
        --f.preempted;
        f.preempted_cost -= c;
    }
    drop_if_empty(tenant);
    return seq;
}

std::vector<FairQueue::Backlog> FairQueue::backlog() const {
    std::vector<Backlog> out;
    out.reserve(flows_.size());
    for (const auto& [tenant, f] : flows_) {
        out.push_back(Backlog{tenant, f.queue.size(), static_cast<int32_t>(f.weight)});
    }
    return out;
}

int32_t FairQueue::head_priority(const std::string& tenant) const {
    const Sequence* seq = head(tenant);
    return seq == nullptr ? 0 : seq->priority;
}

const Sequence* FairQueue::head(const std::string& tenant) const {
    auto it = flows_.find(tenant);
    return it == flows_.end() ? nullptr : it->second.queue.front().get();
}

void FairQueue::refund(const Sequence& seq, int64_t tokens) {
    auto it = flows_.find(seq.tenant);
    // A backlog that came after the one charged (the tenant's queue emptied in between) did not
    // pay: crediting it would carry credit across idle time.
    if (it != flows_.end() && it->second.id == seq.charged_flow && tokens > 0) {
        it->second.deficit += tokens;
        it->second.refunded += tokens;
    }
}

std::vector<std::unique_ptr<Sequence>> FairQueue::take_if(
    const std::function<bool(const Sequence&)>& pred) {
    std::vector<std::unique_ptr<Sequence>> out;
    std::vector<std::string> touched;
    for (auto& [tenant, f] : flows_) {
        for (auto it = f.queue.begin(); it != f.queue.end();) {
            if (pred(**it)) {
                queued_cost_ -= cost(**it);
                if ((*it)->preemptions > 0) {
                    // push_front gave its whole cost back for a re-admission that will not
                    // come: that is taken back, and what it did not use (max_tokens it did not
                    // generate) is refunded as a request that ends while running is (refund()).
                    f.deficit -= cost(**it);
                    f.preempted_cost -= cost(**it);
                    if ((*it)->charged_flow == f.id) {
                        const int64_t unused = std::max<int64_t>(
                            0, int64_t{(*it)->params.max_tokens} - (*it)->generated());
                        f.deficit += unused;
                        f.refunded += unused;
                    }
                }
                f.preempted -= (*it)->preemptions > 0 ? 1 : 0;
                out.push_back(std::move(*it));
                it = f.queue.erase(it);
                --size_;
            } else {
                ++it;
            }
        }
        if (f.queue.empty()) {
            touched.push_back(tenant);
        }
    }
    for (const std::string& tenant : touched) {
        drop_if_empty(tenant);
    }
    return out;
}

}  // namespace edge::engine::sched
