#pragma once

// BroadcastQueue holds the updates waiting to be piggybacked on gossip and probe packets. Each is
// sent at most retransmit_limit(mult, N) times; the least-sent go first and, among equals, the
// newest, so a fresh update overtakes stale ones. Queueing an update with the same key (a member
// name) replaces the older one, so a member's superseded state is never sent again. Packets are
// bounded by a byte budget. Not synchronized: owned by the membership strand.

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace edge::routing::membership {

class BroadcastQueue {
public:
    explicit BroadcastQueue(int retransmit_mult) : mult_(retransmit_mult) {}

    // Queues one encoded message. A non-empty `key` invalidates any queued message with that key.
    void queue(std::string key, std::vector<uint8_t> message);

    // Takes messages whose sizes plus `overhead` each fit in `limit` bytes altogether, counting
    // one transmission each and dropping those that reached the limit for `members` members.
    // A message that alone exceeds `largest` (a whole packet's budget) can never be sent: it is
    // dropped, not left to hold the queue's head (it would be skipped at every call, and past
    // a few such the messages behind them were never retransmitted).
    std::vector<std::vector<uint8_t>> get_broadcasts(size_t overhead, size_t limit, size_t members,
                                                     size_t largest);
    // Messages dropped because no packet could hold them.
    uint64_t oversized_dropped() const { return oversized_dropped_; }

    size_t size() const { return items_.size(); }
    // Drops everything (after leaving the cluster).
    void clear();

private:
    struct Item {
        int transmits;
        uint64_t id;  // larger is newer
        std::string key;
        std::vector<uint8_t> message;
        bool operator<(const Item& o) const {
            if (transmits != o.transmits) {
                return transmits < o.transmits;
            }
            return id > o.id;
        }
    };

    // Forgets the item at `it` (its key and transmit count too); returns the next.
    std::set<Item>::iterator forget(std::set<Item>::iterator it);

    int mult_;
    uint64_t next_id_ = 0;
    uint64_t oversized_dropped_ = 0;
    std::set<Item> items_;
    std::unordered_map<std::string, uint64_t> key_ids_;  // key -> id of its live item
    std::unordered_map<uint64_t, int> id_transmits_;     // id -> transmits (to find the item)
};

}  // namespace edge::routing::membership
