// Admission to the running batch (engine/sched/scheduler.h): which waiting request gets a free
// place (the tenant furthest behind its weighted share first), preemption for fairness and for
// KV blocks, and the prefix cache's attach and publish. Scheduler's own thread only, like the rest
// of its step.

#include <algorithm>
#include <cmath>

#include "common/log.h"
#include "engine/sched/prefix_hash.h"
#include "engine/sched/scheduler.h"

namespace edge::engine::sched {

bool Scheduler::fail_unadmittable() {
    std::unique_ptr<Sequence> seq;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (waiting_.empty()) {
            return false;
        }
        seq = waiting_.pop();
    }
    finish(seq.get(), FinishReason::kError,
           unavailable_error("the model has no free sequence slot"));
    return true;
}

namespace {

// Places per weight are fractions; this absorbs their rounding.
constexpr double kLevelSlack = 1e-9;

// Whether `tenant` (load `l`) is owed a place: it has requests waiting, and with one more place
// its level would still be no higher than another running tenant's level with one fewer.
template <typename Loads, typename Load>
bool is_owed(const Loads& loads, const std::string& tenant, const Load& l) {
    if (l.waiting == 0) {
        return false;
    }
    const double level = l.level(1);
    for (const auto& [other, o] : loads) {
        if (other != tenant && o.running > 0 && o.level(-1) + kLevelSlack >= level) {
            return true;
        }
    }
    return false;
}

}  // namespace

bool Scheduler::admit() {
    if (running_.empty()) {
        admission_blocked_ = false;  // Nothing left to wait for.
    }
    {
        std::vector<FairQueue::Backlog> backlog;
        {
            std::lock_guard<std::mutex> lock(mu_);
            backlog = waiting_.backlog();
        }
        track_service(tenant_loads(backlog));
    }
    while (true) {
        std::vector<FairQueue::Backlog> backlog;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (waiting_.empty()) {
                return false;
            }
            backlog = waiting_.backlog();
        }
        const auto running = static_cast<int32_t>(running_.size());
        Result<int32_t> slot = resource_exhausted_error("the batch is full");
        if (!admission_blocked_ && running < config_.max_batch_sequences) {
            slot = model_->acquire_slot();
        }
        const std::map<std::string, TenantLoad> loads = tenant_loads(backlog);
        std::unique_ptr<Sequence> seq;
        if (slot.ok()) {
            // A free place goes to the waiting tenants with the fewest places per weight (with
            // it), by DRR among them; so no admission leaves a tenant owed a place.
            double least = 0.0;
            bool any = false;
            for (const FairQueue::Backlog& b : backlog) {
                const double level = loads.at(b.tenant).level(1);
                least = any ? std::min(least, level) : level;
                any = true;
            }
            const std::string shared = time_share_claim(backlog, loads, least);
            std::lock_guard<std::mutex> lock(mu_);
            if (!shared.empty()) {
                // Not charged to its DRR deficit: served_ keeps it to its share.
                seq = waiting_.pop_tenant(shared, /*charge=*/false);
            }
            if (seq == nullptr) {
                seq = waiting_.pop_if([&](const std::string& tenant) {
                    const auto it = loads.find(tenant);  // A tenant that came since: next round.
                    return it != loads.end() && it->second.level(1) <= least + kLevelSlack;
                });
            }
        } else {
            // No free place: a tenant owed one takes it from a tenant further ahead.
            const Claim* claim = nullptr;
            const std::vector<Claim> claims = owed_claims(loads);
            for (const Claim& c : claims) {
                if (preempt_for_fairness(c, loads)) {
                    claim = &c;
                    break;
                }
            }
            if (claim == nullptr) {
                // The queue waits for a sequence to finish; with none running, none will.
                return running_.empty();
            }
            slot = model_->acquire_slot();
            if (!slot.ok()) {
                return running_.empty();
            }
            std::lock_guard<std::mutex> lock(mu_);
            seq = waiting_.pop_tenant(claim->tenant);
        }
        seq->slot = *slot;
        seq->computed = 0;
        seq->admitted_at = next_admission_++;
        seq->admitted_step = stats_.steps;
        if (!restore_kv(seq.get())) {
            // Its saved KV does not fit yet: it waits (first in line) for a sequence to finish.
            model_->release_slot(seq->slot);
            seq->slot = -1;
            admission_blocked_ = true;
            std::lock_guard<std::mutex> lock(mu_);
            waiting_.push_front(std::move(seq));
            return false;  // Only while others run (restore_kv).
        }
        if (seq->computed == 0) {
            attach_prefix(seq.get());
        }
        {
            std::lock_guard<std::mutex> lock(stats_mu_);
            TenantServingStats& t = tenant_stats(seq->tenant);
            --t.queued;
            ++t.running;
            if (!seq->admitted_once) {
                t.queue_time.observe(
                    std::chrono::duration<double>(clock_->now() - seq->submitted_at).count());
            }
        }
        seq->admitted_once = true;
        running_.push_back(std::move(seq));
    }
}

std::map<std::string, Scheduler::TenantLoad> Scheduler::tenant_loads(
    const std::vector<FairQueue::Backlog>& backlog) const {
    std::map<std::string, TenantLoad> loads;
    for (const auto& seq : running_) {
        if (!seq->finished) {
            TenantLoad& l = loads[seq->tenant];
            ++l.running;
            l.weight = std::max(seq->tenant_weight, 1);
        }
    }
    for (const FairQueue::Backlog& b : backlog) {
        TenantLoad& l = loads[b.tenant];
        l.waiting = static_cast<int64_t>(b.waiting);
        l.weight = std::max(b.weight, 1);
    }
    return loads;
}

void Scheduler::track_service(const std::map<std::string, TenantLoad>& loads) {
    std::erase_if(served_, [&](const auto& entry) { return !loads.contains(entry.first); });
    double least = 0.0;
    bool any = false;
    for (const auto& [tenant, count] : served_) {
        least = any ? std::min(least, count) : count;
        any = true;
    }
    // Rebased so that the counts stay small; a tenant that came (or came back after going idle:
    // idle time earns no credit) joins at the least.
    for (auto& [tenant, count] : served_) {
        count -= least;
    }
    for (const auto& [tenant, l] : loads) {
        served_.try_emplace(tenant, 0.0);
    }
}

double Scheduler::served(const std::string& tenant) const {
    const auto it = served_.find(tenant);
    if (it != served_.end()) {
        return it->second;
    }
    double least = 0.0;
    bool any = false;
    for (const auto& [other, count] : served_) {
        least = any ? std::min(least, count) : count;
        any = true;
    }
    return least;
}

void Scheduler::add_service(Sequence* seq) {
    // Only positions past those charged before: what a preemption dropped and is computed (or
    // attached) again was served once.
    const int32_t tokens = seq->computed - seq->served_most;
    if (tokens > 0) {
        served_.try_emplace(seq->tenant, served(seq->tenant)).first->second +=
            static_cast<double>(tokens) / static_cast<double>(std::max(seq->tenant_weight, 1));
        seq->served_most = seq->computed;
    }
}

double Scheduler::served_for_test(const std::string& tenant) const { return served(tenant); }

std::string Scheduler::time_share_claim(const std::vector<FairQueue::Backlog>& backlog,
                                        const std::map<std::string, TenantLoad>& loads,
                                        double least) const {
    double lowest_served = 0.0;
    bool any_lowest = false;
    for (const FairQueue::Backlog& b : backlog) {
        if (loads.at(b.tenant).level(1) <= least + kLevelSlack) {
            const double s = served(b.tenant);
            lowest_served = any_lowest ? std::min(lowest_served, s) : s;
            any_lowest = true;
        }
    }
    std::string best;
    double best_served = 0.0;
    for (const FairQueue::Backlog& b : backlog) {
        const TenantLoad& l = loads.at(b.tenant);
        if (l.level(1) <= least + kLevelSlack) {
            continue;  // One of the lowest: DRR decides between those.
        }
        const double s = served(b.tenant);
        if ((any_lowest && s >= lowest_served) || (!best.empty() && s >= best_served)) {
            continue;  // Not behind the lowest tenants, or not the furthest behind.
        }
        // With the place taken, no tenant may be owed one (owed_claims), or it would take one
        // back by preemption in this very admit(): not one that its place would make owed, nor
        // one already owed by another tenant's places (the place was its, by places per weight).
        // Checked last, for a tenant that would win: it copies the loads.
        std::map<std::string, TenantLoad> with = loads;
        TenantLoad& taker = with.at(b.tenant);
        ++taker.running;
        --taker.waiting;
        const bool leaves_owed = std::any_of(with.begin(), with.end(), [&](const auto& entry) {
            return is_owed(with, entry.first, entry.second);
        });
        if (!leaves_owed) {
            best = b.tenant;
            best_served = s;
        }
    }
    return best;
}

std::vector<Scheduler::Claim> Scheduler::owed_claims(
    const std::map<std::string, TenantLoad>& loads) const {
    std::vector<Claim> claims;
    for (const auto& [tenant, l] : loads) {
        if (is_owed(loads, tenant, l)) {
            claims.push_back(Claim{tenant, l.level(1), 0});
        }
    }
    // The furthest behind first; ties by tenant name (the map's order).
    std::stable_sort(claims.begin(), claims.end(),
                     [](const Claim& a, const Claim& b) { return a.level < b.level; });
    if (!claims.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        const int32_t bt = model_->kv_block_tokens();
        for (Claim& c : claims) {
            const Sequence* head = waiting_.head(c.tenant);
            c.priority = head->priority;
            if (head->swapped != nullptr && bt > 0) {
                const SavedSlot& saved = head->swapped->saved();
                c.restore_shared = saved.shared / bt;
                c.restore_blocks = (saved.length + bt - 1) / bt - c.restore_shared;
            }
        }
    }
    return claims;
}

bool Scheduler::preempt_for_fairness(const Claim& claim,
                                     const std::map<std::string, TenantLoad>& loads) {
    auto victim = running_.end();
    double victim_level = 0.0;
    for (auto it = running_.begin(); it != running_.end(); ++it) {
        const Sequence& s = **it;
        if (s.finished || s.tenant == claim.tenant || s.priority > claim.priority ||
            stats_.steps - s.admitted_step < config_.fair_preempt_min_steps) {
            continue;
        }
        const TenantLoad& l = loads.at(s.tenant);
        if (l.level(-1) + kLevelSlack < claim.level) {
            continue;  // Its tenant would end up behind the claimant.
        }
        // Lowest priority, then the tenant with the most places per weight, then the newest.
        const double level = l.level(0);
        if (victim == running_.end() || s.priority < (*victim)->priority ||
            (s.priority == (*victim)->priority &&
             (level > victim_level ||
              (level == victim_level && s.admitted_at > (*victim)->admitted_at)))) {
            victim = it;
            victim_level = level;
        }
    }
    if (victim == running_.end()) {
        return false;
    }
    if ((claim.restore_blocks > 0 || claim.restore_shared > 0) && !restore_fits(claim, **victim)) {
        // restore_kv would fail (kResourceExhausted): the claimant would go back to the queue
        // and the victim would have lost its place for nothing, again at every step while the
        // claim holds. It waits for a sequence to finish instead.
        return false;
    }
    preempt(victim, /*for_fairness=*/true);
    return true;
}

bool Scheduler::restore_fits(const Claim& claim, const Sequence& victim) const {
    const KvCacheStats kv = model_->kv_stats();
    const int32_t bt = model_->kv_block_tokens();
    if (kv.blocks_total <= 0 || bt <= 0) {
        return true;  // Nothing to go by (only a paged cache saves KV).
    }
    // A lower bound on the blocks allocatable after the preemption: free and cached ones now,
    // plus the victim's blocks past its published (attached or published) prefix; those are its
    // own, while a published block may be held by others too and then frees nothing.
    const int32_t victim_blocks = (model_->slot_length(victim.slot) + bt - 1) / bt;
    const int32_t available =
        kv.blocks_total - kv.blocks_used + std::max(0, victim_blocks - victim.published_blocks);
    // An upper bound on what the restore takes: its private blocks, plus the shared prefix
    // blocks that no running sequence holds any more (cached ones, which attaching takes out of
    // the allocatable pool; the victim's own published blocks may become such). A prefix that
    // was evicted makes restore_kv recompute instead, which cannot fail.
    const int32_t reattached =
        std::min(claim.restore_shared, kv.blocks_cached + victim.published_blocks);
    return available >= claim.restore_blocks + reattached;
}

void Scheduler::attach_prefix(Sequence* seq) {
    const int32_t bt = model_->kv_block_tokens();
    if (!config_.prefix_cache || bt <= 0) {
        return;
    }
    if (!seq->chain_ready) {
        // The salt is one SHA-256, made again for each prompt rather than kept per scope (the
        // scopes of reloaded configs and forwarded tenants would pile up for good).
        seq->prefix_chain = prefix_chain(
            std::span<const TokenId>(seq->tokens.data(), static_cast<size_t>(seq->prompt_len)),
            bt, tenant_salt(config_.prefix_secret, seq->cache_scope), SIZE_MAX);
        seq->chain_ready = true;
    }
    // The chain is made all the same: the sequence publishes the blocks it computes, and others
    // may wait for them (awaits_shared_prefix).
    if (!may_attach_prefix(*seq)) {
        return;
    }
    if (!seq->admitted_once) {
        // A query per prompt, at its first admission (here, as admit() calls this then). Both
        // counters here, so that they agree; hits are counted when the sequence ends (finish()).
        stats_.prefix_query_tokens += seq->prompt_len;
        std::lock_guard<std::mutex> lock(stats_mu_);
        tenant_stats(seq->tenant).prefix_query_tokens += seq->prompt_len;
    }
    // The slot holds `computed` positions: none at admission, whole blocks of the prompt when
    // in-batch sharing attaches more (a partial block attaches nothing).
    const int32_t length = model_->attach_prefix(
        seq->slot, std::span<const BlockHash>(seq->prefix_chain.data(), attachable_blocks(*seq)));
    if (length <= seq->computed) {
        return;
    }
    seq->computed = length;
    // Prompt tokens taken from the cache count as served, as DRR's cost counts them: a tenant
    // whose prompts hit the cache is not owed more places for it (at admission, or attached
    // in-batch from a sequence computing the same prefix).
    add_service(seq);
    seq->published_blocks = length / bt;
    // Not counted as hits yet: a preemption may drop these blocks before they are used, and the
    // cache evict them, so that the sequence computes them after all; and what it computed
    // itself before a preemption and attaches back now is none. Sequence::cached_tokens() sorts
    // that out when the sequence ends (finish()), at whichever admission each block came.
    seq->attached_most = std::max(seq->attached_most, length);
}

bool Scheduler::may_attach_prefix(const Sequence& seq) const {
    if (!config_.prefix_cache || model_->kv_block_tokens() <= 0) {
        return false;
    }
    // A prompt whose logprobs are asked for is computed whole (cached blocks have no logits)
    // until they are all known, so it is no query at its first admission; preempted after that,
    // it may attach again, only blocks it computed itself (no hits).
    const bool needs_logits =
        seq.prompt_logprobs && !seq.prompt_sent &&
        std::any_of(seq.prompt_lp.begin() + 1, seq.prompt_lp.end(),
                    [](const TokenLogprob& lp) { return std::isnan(lp.logprob); });
    return !needs_logits;
}

size_t Scheduler::attachable_blocks(const Sequence& seq) const {
    if (!may_attach_prefix(seq)) {
        return 0;
    }
    // At least one token is left to compute: its logits give the next token.
    const auto bt = static_cast<size_t>(model_->kv_block_tokens());
    return std::min(seq.prefix_chain.size(), (seq.tokens.size() - 1) / bt);
}

bool Scheduler::awaits_shared_prefix(Sequence* seq, std::span<Sequence* const> computing) {
    const int32_t bt = model_->kv_block_tokens();
    if (!config_.prefix_cache || bt <= 0) {
        return false;
    }
    attach_prefix(seq);  // Blocks published since the last step.
    const auto next = static_cast<size_t>(seq->computed / bt);
    if (seq->computed % bt != 0 || next >= attachable_blocks(*seq)) {
        return false;
    }
    // Equal chain hashes mean the same cache scope and the same tokens up to that block.
    const BlockHash& want = seq->prefix_chain[next];
    return std::any_of(computing.begin(), computing.end(), [&](const Sequence* other) {
        return other->prefix_chain.size() > next && other->prefix_chain[next] == want &&
               other->computed < static_cast<int32_t>(next + 1) * bt;
    });
}

void Scheduler::publish_prefix(Sequence* seq) {
    const int32_t bt = model_->kv_block_tokens();
    if (seq->prefix_chain.empty() || bt <= 0) {
        return;
    }
    const int32_t full =
        std::min(static_cast<int32_t>(seq->prefix_chain.size()),
                 std::min(seq->computed, seq->prompt_len) / bt);
    if (full > seq->published_blocks) {
        model_->publish_prefix(seq->slot, std::span<const BlockHash>(
                                              seq->prefix_chain.data(), static_cast<size_t>(full)));
        seq->published_blocks = full;
    }
}

void Scheduler::preempt_victim() {
    // Lowest priority first; among equals one of the tenant with the most places per weight
    // (a tenant that just got its fair place keeps it), the most recently admitted (it has done
    // least work).
    std::vector<FairQueue::Backlog> backlog;
    {
        std::lock_guard<std::mutex> lock(mu_);
        backlog = waiting_.backlog();
    }
    const std::map<std::string, TenantLoad> loads = tenant_loads(backlog);
    auto victim =
        std::min_element(running_.begin(), running_.end(), [&](const auto& a, const auto& b) {
            if (a->priority != b->priority) {
                return a->priority < b->priority;
            }
            const double la = loads.at(a->tenant).level(0);
            const double lb = loads.at(b->tenant).level(0);
            if (la != lb) {
                return la > lb;
            }
            return a->admitted_at > b->admitted_at;
        });
    preempt(victim, /*for_fairness=*/false);
}

bool Scheduler::save_kv(Sequence* seq) {
    const int32_t length = model_->slot_length(seq->slot);
    if (config_.swap_bytes <= 0 || length == 0) {
        return false;
    }
    // Within what the budget has left, checked before anything is copied.
    Result<SavedSlot> saved = model_->save_slot(seq->slot, config_.swap_bytes - swap_use_->load());
    if (!saved.ok()) {
        return false;
    }
    seq->swapped = std::make_unique<SwappedKv>(std::move(*saved), swap_use_);
    ++stats_.swapped_preemptions;
    return true;
}

bool Scheduler::restore_kv(Sequence* seq) {
    if (seq->swapped == nullptr) {
        return true;
    }
    const SavedSlot& saved = seq->swapped->saved();
    if (saved.shared > 0) {
        // Its prefix blocks that others shared were not copied (KvCache::save): they are
        // attached again first, so the restore needs private blocks for the rest only (what
        // the preemption freed), not copies of blocks the cache still holds.
        const int32_t bt = model_->kv_block_tokens();
        const auto blocks = static_cast<size_t>(bt > 0 ? saved.shared / bt : 0);
        const int32_t length =
            blocks > 0 && blocks <= seq->prefix_chain.size()
                ? model_->attach_prefix(
                      seq->slot, std::span<const BlockHash>(seq->prefix_chain.data(), blocks))
                : 0;
        if (length != saved.shared) {
            // Evicted since (their sharers finished): the sequence is computed again, from
            // what the prefix cache still holds (admit() attaches it).
            model_->truncate_slot(seq->slot, 0);
            seq->swapped.reset();
            return true;
        }
    }
    const Status st = model_->restore_slot(seq->slot, saved);
    if (st.code() == StatusCode::kResourceExhausted && !running_.empty()) {
        return false;  // The caller releases the slot with the prefix attached above.
    }
    if (st.ok()) {
        seq->computed = saved.length;
        seq->published_blocks = saved.shared / std::max(model_->kv_block_tokens(), 1);
    } else {
        // With nothing running every block is free or evictable, so this is not for lack of
        // room; the tokens are computed again (counted as they are: step()).
        model_->truncate_slot(seq->slot, 0);
    }
    seq->swapped.reset();
    return true;
}

void Scheduler::preempt(std::vector<std::unique_ptr<Sequence>>::iterator victim,
                        bool for_fairness) {
    std::unique_ptr<Sequence> seq = std::move(*victim);
    running_.erase(victim);
    // Unsaved positions count in recompute_tokens once they are computed again (step()), less
    // what the prefix cache still holds at the sequence's next admission.
    const bool saved = save_kv(seq.get());
    model_->truncate_slot(seq->slot, 0);
    model_->release_slot(seq->slot);
    log::debug("sequence_preempted", {{"request_id", seq->request_id},
                                      {"tenant", seq->tenant},
                                      {"reason", for_fairness ? "fair_share" : "kv_cache"},
                                      {"kv", saved ? "saved" : "recompute"},
                                      {"tokens", static_cast<int64_t>(seq->tokens.size())}});
    seq->slot = -1;
    seq->computed = 0;
    seq->published_blocks = 0;
    ++seq->preemptions;
    ++stats_.preemptions;
    if (for_fairness) {
        ++stats_.fair_preemptions;
    } else {
        admission_blocked_ = true;  // Until a sequence finishes, the cache holds no more.
    }
    std::lock_guard<std::mutex> lock(mu_);
    {
        std::lock_guard<std::mutex> stats_lock(stats_mu_);
        TenantServingStats& t = tenant_stats(seq->tenant);
        --t.running;
        ++t.queued;
        ++t.preemptions;
        if (for_fairness) {
            ++t.fair_preemptions;
        }
    }
    waiting_.push_front(std::move(seq));
}

}  // namespace edge::engine::sched
