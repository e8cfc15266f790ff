#pragma once

// BroadcastQueue holds the updates waiting to be piggybacked on gossip and probe packets. Each is
// sent at most retransmit_limit(mult, N) times; the least-sent go first and, among equals, the
// newest, so a fresh update overtakes stale ones. Queueing an update with the same key (a member
// name) replaces the older one, so a member's superseded state is never sent again. Packets are
// bounded by a byte budget. Messages without a key (user events) are replaced by nothing, so
// their number is capped: past it the oldest is dropped (serf's MaxQueueDepth prunes the same
// way), or a flood of distinct events would grow the queue without end; keyed ones are bounded by
// their keys (one per member). Not synchronized: owned by the membership strand.

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace edge::routing::membership {

class BroadcastQueue {
public:
    // `max_unkeyed`: messages without a key held at once.
    explicit BroadcastQueue(int retransmit_mult, size_t max_unkeyed = 4096)
        : mult_(retransmit_mult), max_unkeyed_(max_unkeyed) {}

    // Queues one encoded message. A non-empty `key` invalidates any queued message with that key;
    // an empty one drops the oldest message without a key when max_unkeyed are queued.
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
    // Messages without a key dropped unsent (or not sent as often as the rest) because
    // max_unkeyed newer ones were queued.
    uint64_t overflow_dropped() const { return overflow_dropped_; }

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

    // Drops the item `id` if it is still queued.
    void drop(uint64_t id);

    int mult_;
    size_t max_unkeyed_;
    uint64_t next_id_ = 0;
    uint64_t oversized_dropped_ = 0;
    uint64_t overflow_dropped_ = 0;
    std::set<Item> items_;
    std::unordered_map<std::string, uint64_t> key_ids_;  // key -> id of its live item
    std::unordered_map<uint64_t, int> id_transmits_;     // id -> transmits (to find the item)
    std::set<uint64_t> unkeyed_ids_;                     // ids of live items without a key
};

}  // namespace edge::routing::membership
