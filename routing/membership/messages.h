#pragma once

// The gossip protocol's messages and their codec. A plaintext packet is a protocol version byte
// followed by messages, each a type byte, a varint length and a TLV body; a packet may carry
// several (a probe with piggybacked broadcasts). Unknown message types and unknown fields are
// skipped, a push-pull entry in a node state this version does not know is left out (the rest
// of the push-pull is taken), and so is a coordinate it cannot use (another dimensionality, not
// finite, out of range: routing does without it, the message is taken), so newer peers can
// extend the protocol; every length is checked before use and bad input yields kDataLoss naming
// the message. Plain values and pure functions.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/result.h"
#include "routing/coords/vivaldi.h"

namespace edge::routing::membership {

inline constexpr uint8_t kProtocolVersion = 1;

enum class MessageType : uint8_t {
    kPing = 1,
    kIndirectPing = 2,
    kAck = 3,
    kNack = 4,
    kSuspect = 5,
    kAlive = 6,
    kDead = 7,
    kPushPull = 8,
    kUserEvent = 9,
};

enum class NodeState : uint8_t { kAlive = 1, kSuspect = 2, kDead = 3, kLeft = 4 };
std::string_view node_state_name(NodeState s);

struct PingMsg {
    uint64_t seq = 0;
    std::string target;  // the name the sender believes it is probing
    std::string source;
    std::string source_addr;
};

struct IndirectPingMsg {
    uint64_t seq = 0;
    std::string target;
    std::string target_addr;
    std::string source;
    std::string source_addr;
    bool want_nack = true;
};

struct AckMsg {
    uint64_t seq = 0;
    // The responder's Vivaldi coordinate, so the prober updates its own from the RTT.
    std::optional<coords::Coordinate> coord;
};

struct NackMsg {
    uint64_t seq = 0;
};

// Incarnations at or above this are refused by the decoder: a site's incarnation rises with each
// refutation and each site-state publish (about one a second under load: 2^62 is 10^11 years
// away), and one at 2^64 - 1 would wrap its member's refutation to 0, leaving it dead for good.
inline constexpr uint64_t kMaxIncarnation = uint64_t{1} << 62;
// Messages one packet may hold (DecodeLimits' default; a stream frame holds one); a packet with
// more is refused whole. A 64 KiB datagram of the smallest real messages holds fewer.
inline constexpr size_t kMaxMessagesPerPacket = 8192;

struct SuspectMsg {
    uint64_t incarnation = 0;
    std::string node;
    std::string from;
};

struct DeadMsg {
    uint64_t incarnation = 0;
    std::string node;
    std::string from;  // == node for a graceful leave
};

struct AliveMsg {
    uint64_t incarnation = 0;
    std::string node;
    std::string addr;
    // Version of the member's site state; newer replaces older.
    uint64_t state_version = 0;
    // The encoded SiteState, absent when too large for a packet (fetched by push-pull).
    std::optional<std::vector<uint8_t>> state;
};

// User event Lamport times at or above this are refused by the decoder (events and push-pull
// alike). The clock rises by one per user event sent anywhere in the cluster (rollout intents: a
// handful a day; even a million a second would take 10^5 years to reach 2^62), so no honest
// member comes near it. Without the cap, one ltime near 2^64 would make every member that
// witnesses it wrap its clock on its next event and drop the cluster's events from then on as
// older than the window.
inline constexpr uint64_t kMaxEventLtime = uint64_t{1} << 62;

struct UserEventMsg {
    uint64_t ltime = 0;  // Lamport time, below kMaxEventLtime
    std::string name;
    std::vector<uint8_t> payload;
};

struct PushPullNode {
    std::string name;
    std::string addr;
    uint64_t incarnation = 0;
    NodeState state = NodeState::kAlive;
    uint64_t state_version = 0;
    std::vector<uint8_t> site_state;  // empty when unknown
    std::optional<coords::Coordinate> coord;
};

struct PushPullMsg {
    bool join = false;
    std::vector<PushPullNode> nodes;
    uint64_t event_ltime = 0;
    std::vector<UserEventMsg> events;
    // Set: a request for this member's entry alone (a site state too large for a packet),
    // sending no entries of its own; the answer carries that entry only. A member that does not
    // know the field answers with its whole table, which holds the entry too.
    std::string fetch;
    // The application's own anti-entropy state (Memberlist::set_local_state: the cluster's
    // rollout targets), opaque here, at most kMaxPushPullAppState bytes; empty when none. A
    // member that does not know the field skips it.
    std::vector<uint8_t> app_state;
};

// The most application state one push-pull carries: the cluster's rollout book at its cap (4096
// models, two fields of up to 255 bytes each) is about 2.2 MB.
inline constexpr size_t kMaxPushPullAppState = size_t{4} << 20;

using Message = std::variant<PingMsg, IndirectPingMsg, AckMsg, NackMsg, SuspectMsg, AliveMsg,
                             DeadMsg, PushPullMsg, UserEventMsg>;

// One message framed as type + length + body (what the broadcast queue holds).
std::vector<uint8_t> encode_message(const Message& m);
// Frames messages into one plaintext packet.
std::vector<uint8_t> encode_packet(std::span<const std::vector<uint8_t>> framed);
// What one packet or stream frame may carry, checked as it is decoded: a stream frame of
// max_stream_bytes (32 MiB) holds millions of minimal entries or events, each decoding into a far
// larger value (about 1 GiB in all). An honest member sends its member table, which holds at most
// max_members entries, and the events it remembers, at most user_event_buffer: Memberlist passes
// its configuration's or these defaults (lan_profile()'s), whichever is larger. The entry and
// event bounds hold for all the push-pulls of a packet together: held per push-pull, a frame of
// many push-pulls would decode into as many times the bound (3.3 GiB for 255 of them).
struct DecodeLimits {
    size_t max_push_pull_nodes = size_t{1} << 16;
    size_t max_push_pull_events = 512;
    // Messages of known types; a stream, which is one request and one answer, passes 1, so the
    // second is refused before it is decoded.
    size_t max_messages = kMaxMessagesPerPacket;
};

// Decodes a plaintext packet; messages of unknown types are skipped, and so are push-pull entries
// in unknown node states. A packet over `limits` is kDataLoss naming what it has too many of.
Result<std::vector<Message>> decode_packet(std::span<const uint8_t> bytes,
                                           const DecodeLimits& limits = {});

// Bytes of framing added by encode_message around a body of `body` bytes (upper bound).
inline constexpr size_t kMessageOverhead = 1 + 5;

}  // namespace edge::routing::membership
