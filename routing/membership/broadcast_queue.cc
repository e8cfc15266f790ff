#include "routing/membership/broadcast_queue.h"

#include "routing/membership/timing.h"

namespace edge::routing::membership {

void BroadcastQueue::drop(uint64_t id) {
    auto t = id_transmits_.find(id);
    if (t != id_transmits_.end()) {
        Item probe{t->second, id, {}, {}};
        items_.erase(probe);
        id_transmits_.erase(t);
    }
    unkeyed_ids_.erase(id);
}

void BroadcastQueue::queue(std::string key, std::vector<uint8_t> message) {
    if (!key.empty()) {
        auto it = key_ids_.find(key);
        if (it != key_ids_.end()) {
            drop(it->second);
        }
    }
    const uint64_t id = next_id_++;
    if (key.empty()) {
        unkeyed_ids_.insert(id);
        // Ids grow with each message queued: the first is the oldest.
        while (unkeyed_ids_.size() > max_unkeyed_) {
            drop(*unkeyed_ids_.begin());
            ++overflow_dropped_;
        }
        if (!unkeyed_ids_.contains(id)) {
            return;  // max_unkeyed is 0
        }
    } else {
        key_ids_[key] = id;
    }
    id_transmits_[id] = 0;
    items_.insert(Item{0, id, std::move(key), std::move(message)});
}

std::set<BroadcastQueue::Item>::iterator BroadcastQueue::forget(std::set<Item>::iterator it) {
    id_transmits_.erase(it->id);
    unkeyed_ids_.erase(it->id);
    auto k = key_ids_.find(it->key);
    if (k != key_ids_.end() && k->second == it->id) {
        key_ids_.erase(k);
    }
    return items_.erase(it);
}

std::vector<std::vector<uint8_t>> BroadcastQueue::get_broadcasts(size_t overhead, size_t limit,
                                                                 size_t members, size_t largest) {
    std::vector<std::vector<uint8_t>> out;
    if (items_.empty()) {
        return out;
    }
    const int max_transmits = std::max(1, retransmit_limit(mult_, members));
    size_t used = 0;
    std::vector<Item> resend;
    // Skipping a few too-large items lets smaller ones fill the packet, but scanning the whole
    // queue for every packet would cost O(queue) per send in a large cluster.
    constexpr size_t kMaxSkips = 16;
    size_t skips = 0;
    for (auto it = items_.begin(); it != items_.end();) {
        const size_t cost = it->message.size() + overhead;
        if (cost > largest) {
            ++oversized_dropped_;
            it = forget(it);
            continue;
        }
        if (used + cost > limit) {
            if (++skips > kMaxSkips) {
                break;
            }
            ++it;
            continue;
        }
        used += cost;
        Item item = std::move(const_cast<Item&>(*it));
        it = items_.erase(it);
        out.push_back(item.message);
        item.transmits += 1;
        if (item.transmits >= max_transmits) {
            id_transmits_.erase(item.id);
            unkeyed_ids_.erase(item.id);
            auto k = key_ids_.find(item.key);
            if (k != key_ids_.end() && k->second == item.id) {
                key_ids_.erase(k);
            }
        } else {
            id_transmits_[item.id] = item.transmits;
            resend.push_back(std::move(item));
        }
        if (limit - used <= overhead) {
            break;
        }
    }
    for (auto& item : resend) {
        items_.insert(std::move(item));
    }
    return out;
}

void BroadcastQueue::clear() {
    items_.clear();
    key_ids_.clear();
    id_transmits_.clear();
    unkeyed_ids_.clear();
}

}  // namespace edge::routing::membership
