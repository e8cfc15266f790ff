#include "routing/membership/messages.h"

#include <optional>
#include <type_traits>

#include "routing/membership/wire.h"

namespace edge::routing::membership {
namespace {

constexpr size_t kMaxName = 512;
constexpr size_t kCoordBytes = (coords::kDimensions + 3) * 8;

void put_coord(WireWriter& w, uint32_t tag, const coords::Coordinate& c) {
    WireWriter inner;
    for (double v : c.vec) {
        inner.field_double(1, v);
    }
    inner.field_double(2, c.error);
    inner.field_double(3, c.adjustment);
    inner.field_double(4, c.height);
    w.field_bytes(tag, inner.bytes());
}

// A coordinate, or nullopt for one this version cannot use: of another dimensionality, not
// finite, or out of range (coords::Coordinate::is_valid; a bound that has changed between
// versions). Coordinates only steer routing, as in serf: such a coordinate is left out, never its
// message, or a member gossiping one would have every ack refused (its probes fail) and every
// push-pull with it. A field of the wrong encoding is still kDataLoss.
Result<std::optional<coords::Coordinate>> get_coord(const WireField& f) {
    coords::Coordinate c;
    WireReader r(f.value);
    size_t dim = 0;
    while (!r.done()) {
        EDGE_ASSIGN_OR_RETURN(WireField g, r.read_field("coordinate"));
        if (g.tag < 1 || g.tag > 4) {
            continue;  // a newer peer's field, whatever its encoding
        }
        EDGE_ASSIGN_OR_RETURN(double v, g.as_double());
        switch (g.tag) {
            case 1:
                if (dim < coords::kDimensions) {
                    c.vec[dim] = v;
                }
                ++dim;
                break;
            case 2: c.error = v; break;
            case 3: c.adjustment = v; break;
            case 4: c.height = v; break;
            default: break;
        }
    }
    if (dim != coords::kDimensions || !c.is_valid()) {
        return std::optional<coords::Coordinate>();
    }
    return std::optional<coords::Coordinate>(c);
}

// A counter field below `cap` (2^62 for both kinds: no honest member reaches it, and one near
// 2^64 would wrap on its next increment). `what` names it in the error.
Result<uint64_t> get_capped(const WireField& f, uint64_t cap, std::string_view what) {
    EDGE_ASSIGN_OR_RETURN(uint64_t v, f.as_uint());
    if (v >= cap) {
        return data_loss_error(std::string(what) + " " + std::to_string(v) +
                               " at or above 2^62, which no cluster reaches");
    }
    return v;
}

// An incarnation field, refused at or above kMaxIncarnation.
Result<uint64_t> get_incarnation(const WireField& f) {
    return get_capped(f, kMaxIncarnation, "incarnation");
}

// A user event Lamport time (of an event, or a push-pull's clock), refused at or above
// kMaxEventLtime.
Result<uint64_t> get_ltime(const WireField& f) {
    return get_capped(f, kMaxEventLtime, "user event Lamport time");
}

Result<std::string> get_name(const WireField& f, std::string_view what) {
    if (f.value.size() > kMaxName) {
        return data_loss_error(std::string(what) + " longer than 512 bytes");
    }
    return f.as_string();
}

void body(WireWriter& w, const PingMsg& m) {
    w.field_uint(1, m.seq);
    w.field_string(2, m.target);
    w.field_string(3, m.source);
    w.field_string(4, m.source_addr);
}
void body(WireWriter& w, const IndirectPingMsg& m) {
    w.field_uint(1, m.seq);
    w.field_string(2, m.target);
    w.field_string(3, m.target_addr);
    w.field_string(4, m.source);
    w.field_string(5, m.source_addr);
    w.field_uint(6, m.want_nack ? 1 : 0);
}
void body(WireWriter& w, const AckMsg& m) {
    w.field_uint(1, m.seq);
    if (m.coord) {
        put_coord(w, 2, *m.coord);
    }
}
void body(WireWriter& w, const NackMsg& m) { w.field_uint(1, m.seq); }
void body(WireWriter& w, const SuspectMsg& m) {
    w.field_uint(1, m.incarnation);
    w.field_string(2, m.node);
    w.field_string(3, m.from);
}
void body(WireWriter& w, const DeadMsg& m) {
    w.field_uint(1, m.incarnation);
    w.field_string(2, m.node);
    w.field_string(3, m.from);
}
void body(WireWriter& w, const AliveMsg& m) {
    w.field_uint(1, m.incarnation);
    w.field_string(2, m.node);
    w.field_string(3, m.addr);
    w.field_uint(4, m.state_version);
    if (m.state) {
        w.field_bytes(5, *m.state);
    }
}
void body(WireWriter& w, const UserEventMsg& m) {
    w.field_uint(1, m.ltime);
    w.field_string(2, m.name);
    w.field_bytes(3, m.payload);
}
void body(WireWriter& w, const PushPullMsg& m) {
    w.field_uint(1, m.join ? 1 : 0);
    for (const PushPullNode& n : m.nodes) {
        WireWriter nw;
        nw.field_string(1, n.name);
        nw.field_string(2, n.addr);
        nw.field_uint(3, n.incarnation);
        nw.field_uint(4, static_cast<uint64_t>(n.state));
        nw.field_uint(5, n.state_version);
        if (!n.site_state.empty()) {
            nw.field_bytes(6, n.site_state);
        }
        if (n.coord) {
            put_coord(nw, 7, *n.coord);
        }
        w.field_bytes(2, nw.bytes());
    }
    w.field_uint(3, m.event_ltime);
    for (const UserEventMsg& e : m.events) {
        WireWriter ew;
        body(ew, e);
        w.field_bytes(4, ew.bytes());
    }
    if (!m.fetch.empty()) {
        w.field_string(5, m.fetch);
    }
    if (!m.app_state.empty()) {
        w.field_bytes(6, m.app_state);
    }
}

MessageType type_of(const Message& m) {
    return std::visit(
        [](const auto& v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, PingMsg>) return MessageType::kPing;
            if constexpr (std::is_same_v<T, IndirectPingMsg>) return MessageType::kIndirectPing;
            if constexpr (std::is_same_v<T, AckMsg>) return MessageType::kAck;
            if constexpr (std::is_same_v<T, NackMsg>) return MessageType::kNack;
            if constexpr (std::is_same_v<T, SuspectMsg>) return MessageType::kSuspect;
            if constexpr (std::is_same_v<T, AliveMsg>) return MessageType::kAlive;
            if constexpr (std::is_same_v<T, DeadMsg>) return MessageType::kDead;
            if constexpr (std::is_same_v<T, PushPullMsg>) return MessageType::kPushPull;
            if constexpr (std::is_same_v<T, UserEventMsg>) return MessageType::kUserEvent;
        },
        m);
}

// Decoding: each walks the TLV fields of a body and skips unknown tags.
#define EDGE_FIELDS(what)                                           \
    WireReader r(bytes);                                            \
    while (!r.done()) {                                             \
        EDGE_ASSIGN_OR_RETURN(WireField f, r.read_field(what));     \
        switch (f.tag)

Result<PingMsg> decode_ping(std::span<const uint8_t> bytes) {
    PingMsg m;
    EDGE_FIELDS("ping") {
        case 1: { EDGE_ASSIGN_OR_RETURN(m.seq, f.as_uint()); break; }
        case 2: { EDGE_ASSIGN_OR_RETURN(m.target, get_name(f, "ping target")); break; }
        case 3: { EDGE_ASSIGN_OR_RETURN(m.source, get_name(f, "ping source")); break; }
        case 4: { EDGE_ASSIGN_OR_RETURN(m.source_addr, get_name(f, "ping addr")); break; }
        default: break;
    }
    }
    return m;
}

Result<IndirectPingMsg> decode_indirect(std::span<const uint8_t> bytes) {
    IndirectPingMsg m;
    EDGE_FIELDS("indirect ping") {
        case 1: { EDGE_ASSIGN_OR_RETURN(m.seq, f.as_uint()); break; }
        case 2: { EDGE_ASSIGN_OR_RETURN(m.target, get_name(f, "target")); break; }
        case 3: { EDGE_ASSIGN_OR_RETURN(m.target_addr, get_name(f, "target addr")); break; }
        case 4: { EDGE_ASSIGN_OR_RETURN(m.source, get_name(f, "source")); break; }
        case 5: { EDGE_ASSIGN_OR_RETURN(m.source_addr, get_name(f, "source addr")); break; }
        case 6: {
            EDGE_ASSIGN_OR_RETURN(uint64_t v, f.as_uint());
            m.want_nack = v != 0;
            break;
        }
        default: break;
    }
    }
    return m;
}

Result<AckMsg> decode_ack(std::span<const uint8_t> bytes) {
    AckMsg m;
    EDGE_FIELDS("ack") {
        case 1: { EDGE_ASSIGN_OR_RETURN(m.seq, f.as_uint()); break; }
        case 2: { EDGE_ASSIGN_OR_RETURN(m.coord, get_coord(f)); break; }
        default: break;
    }
    }
    return m;
}

Result<NackMsg> decode_nack(std::span<const uint8_t> bytes) {
    NackMsg m;
    EDGE_FIELDS("nack") {
        case 1: { EDGE_ASSIGN_OR_RETURN(m.seq, f.as_uint()); break; }
        default: break;
    }
    }
    return m;
}

template <typename T>
Result<T> decode_accusation(std::span<const uint8_t> bytes) {
    T m;
    EDGE_FIELDS("suspect/dead") {
        case 1: { EDGE_ASSIGN_OR_RETURN(m.incarnation, get_incarnation(f)); break; }
        case 2: { EDGE_ASSIGN_OR_RETURN(m.node, get_name(f, "node")); break; }
        case 3: { EDGE_ASSIGN_OR_RETURN(m.from, get_name(f, "from")); break; }
        default: break;
    }
    }
    return m;
}

Result<AliveMsg> decode_alive(std::span<const uint8_t> bytes) {
    AliveMsg m;
    EDGE_FIELDS("alive") {
        case 1: { EDGE_ASSIGN_OR_RETURN(m.incarnation, get_incarnation(f)); break; }
        case 2: { EDGE_ASSIGN_OR_RETURN(m.node, get_name(f, "node")); break; }
        case 3: { EDGE_ASSIGN_OR_RETURN(m.addr, get_name(f, "addr")); break; }
        case 4: { EDGE_ASSIGN_OR_RETURN(m.state_version, f.as_uint()); break; }
        case 5: m.state = f.as_bytes(); break;
        default: break;
    }
    }
    return m;
}

Result<UserEventMsg> decode_user_event(std::span<const uint8_t> bytes) {
    UserEventMsg m;
    EDGE_FIELDS("user event") {
        case 1: {
            EDGE_ASSIGN_OR_RETURN(m.ltime, get_ltime(f));
            break;
        }
        case 2: { EDGE_ASSIGN_OR_RETURN(m.name, get_name(f, "event name")); break; }
        case 3: m.payload = f.as_bytes(); break;
        default: break;
    }
    }
    return m;
}

// An entry, or nullopt for one in a node state this version does not know (a newer peer's):
// what such a state implies for the member cannot be told, so the entry is left out, and the
// rest of the push-pull is taken (memberlist's merge ignores such an entry too). A malformed
// field still fails the whole message.
Result<std::optional<PushPullNode>> decode_pp_node(std::span<const uint8_t> bytes) {
    PushPullNode n;
    bool known_state = true;
    EDGE_FIELDS("push-pull node") {
        case 1: { EDGE_ASSIGN_OR_RETURN(n.name, get_name(f, "name")); break; }
        case 2: { EDGE_ASSIGN_OR_RETURN(n.addr, get_name(f, "addr")); break; }
        case 3: { EDGE_ASSIGN_OR_RETURN(n.incarnation, get_incarnation(f)); break; }
        case 4: {
            auto s = f.as_enum(static_cast<uint64_t>(NodeState::kAlive),
                               static_cast<uint64_t>(NodeState::kLeft));
            if (!s.ok()) {
                return s.status().with_context("push-pull node state");
            }
            known_state = s->has_value();
            if (known_state) {
                n.state = static_cast<NodeState>(**s);
            }
            break;
        }
        case 5: { EDGE_ASSIGN_OR_RETURN(n.state_version, f.as_uint()); break; }
        case 6: n.site_state = f.as_bytes(); break;
        case 7: { EDGE_ASSIGN_OR_RETURN(n.coord, get_coord(f)); break; }
        default: break;
    }
    }
    if (!known_state) {
        return std::optional<PushPullNode>();
    }
    return std::optional<PushPullNode>(std::move(n));
}

// The push-pull entries and events a packet's messages have carried so far, counted against its
// DecodeLimits across all of them.
struct PushPullUse {
    size_t entries = 0;
    size_t events = 0;
};

Result<PushPullMsg> decode_push_pull(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                                     PushPullUse& used) {
    PushPullMsg m;
    EDGE_FIELDS("push-pull") {
        case 1: {
            EDGE_ASSIGN_OR_RETURN(uint64_t v, f.as_uint());
            m.join = v != 0;
            break;
        }
        case 2: {
            // Entries as sent, those left out included: the bound holds whatever states this
            // version knows.
            if (used.entries++ >= limits.max_push_pull_nodes) {
                return data_loss_error("push-pulls in one packet carry more than " +
                                       std::to_string(limits.max_push_pull_nodes) +
                                       " nodes (max_members)");
            }
            EDGE_ASSIGN_OR_RETURN(std::optional<PushPullNode> n, decode_pp_node(f.value));
            if (n) {
                m.nodes.push_back(std::move(*n));
            }
            break;
        }
        case 3: {
            EDGE_ASSIGN_OR_RETURN(m.event_ltime, get_ltime(f));
            break;
        }
        case 4: {
            if (used.events++ >= limits.max_push_pull_events) {
                return data_loss_error("push-pulls in one packet carry more than " +
                                       std::to_string(limits.max_push_pull_events) +
                                       " user events (user_event_buffer)");
            }
            EDGE_ASSIGN_OR_RETURN(UserEventMsg e, decode_user_event(f.value));
            m.events.push_back(std::move(e));
            break;
        }
        case 5: { EDGE_ASSIGN_OR_RETURN(m.fetch, get_name(f, "fetch")); break; }
        case 6: {
            if (f.value.size() > kMaxPushPullAppState) {
                return data_loss_error("push-pull application state of " +
                                       std::to_string(f.value.size()) + " bytes (at most " +
                                       std::to_string(kMaxPushPullAppState) + ")");
            }
            m.app_state = f.as_bytes();
            break;
        }
        default: break;
    }
    }
    return m;
}

#undef EDGE_FIELDS

// One message's framing: its type byte and its body.
struct Frame {
    uint8_t type = 0;
    std::span<const uint8_t> body;
};

Result<Frame> read_frame(WireReader& r) {
    Frame f;
    EDGE_ASSIGN_OR_RETURN(f.type, r.read_u8("message type"));
    EDGE_ASSIGN_OR_RETURN(uint64_t len, r.read_varint("message length"));
    EDGE_ASSIGN_OR_RETURN(f.body, r.read_span(len, "message body"));
    return f;
}

// Whether this version decodes messages of `type` (it skips the others: a newer peer's). The
// types are numbered from kPing to kUserEvent without a gap.
bool known_type(uint8_t type) {
    return type >= static_cast<uint8_t>(MessageType::kPing) &&
           type <= static_cast<uint8_t>(MessageType::kUserEvent);
}

// The error for a packet whose messages of known types number more than `max`: `seen` is how many
// were read (the one over the bound included); the rest are counted by their framing alone, never
// decoded, so the error says how many the packet carries.
Status too_many_messages(WireReader& r, size_t seen, size_t max) {
    while (!r.done()) {
        EDGE_ASSIGN_OR_RETURN(Frame f, read_frame(r));
        seen += known_type(f.type) ? 1 : 0;
    }
    return data_loss_error("gossip packet: more than " + std::to_string(max) +
                           (max == 1 ? " message" : " messages") + " (it carries " +
                           std::to_string(seen) + " messages)");
}

template <typename T>
Status append(std::vector<Message>& out, Result<T> r, std::string_view what) {
    if (!r.ok()) {
        return r.status().with_context(what);
    }
    out.emplace_back(std::move(r).value());
    return ok_status();
}

}  // namespace

std::string_view node_state_name(NodeState s) {
    switch (s) {
        case NodeState::kAlive: return "alive";
        case NodeState::kSuspect: return "suspect";
        case NodeState::kDead: return "dead";
        case NodeState::kLeft: return "left";
    }
    return "unknown";
}

std::vector<uint8_t> encode_message(const Message& m) {
    WireWriter b;
    std::visit([&](const auto& v) { body(b, v); }, m);
    WireWriter w;
    w.put_u8(static_cast<uint8_t>(type_of(m)));
    w.put_varint(b.bytes().size());
    w.put_bytes(b.bytes());
    return w.take();
}

std::vector<uint8_t> encode_packet(std::span<const std::vector<uint8_t>> framed) {
    std::vector<uint8_t> out;
    size_t total = 1;
    for (const auto& f : framed) {
        total += f.size();
    }
    out.reserve(total);
    out.push_back(kProtocolVersion);
    for (const auto& f : framed) {
        out.insert(out.end(), f.begin(), f.end());
    }
    return out;
}

Result<std::vector<Message>> decode_packet(std::span<const uint8_t> bytes,
                                           const DecodeLimits& limits) {
    WireReader r(bytes);
    EDGE_ASSIGN_OR_RETURN(uint8_t version, r.read_u8("protocol version"));
    if (version != kProtocolVersion) {
        return data_loss_error("gossip packet: unsupported protocol version " +
                               std::to_string(version));
    }
    std::vector<Message> out;
    PushPullUse used;
    while (!r.done()) {
        EDGE_ASSIGN_OR_RETURN(Frame frame, read_frame(r));
        if (!known_type(frame.type)) {
            continue;  // a newer peer's message type
        }
        if (out.size() >= limits.max_messages) {
            // A few bytes a message would otherwise decode into far larger variants, and a
            // stream would be answered once for each.
            return too_many_messages(r, out.size() + 1, limits.max_messages);
        }
        const std::span<const uint8_t> body = frame.body;
        switch (static_cast<MessageType>(frame.type)) {
            case MessageType::kPing: EDGE_RETURN_IF_ERROR(append(out, decode_ping(body), "ping")); break;
            case MessageType::kIndirectPing:
                EDGE_RETURN_IF_ERROR(append(out, decode_indirect(body), "indirect ping"));
                break;
            case MessageType::kAck: EDGE_RETURN_IF_ERROR(append(out, decode_ack(body), "ack")); break;
            case MessageType::kNack: EDGE_RETURN_IF_ERROR(append(out, decode_nack(body), "nack")); break;
            case MessageType::kSuspect:
                EDGE_RETURN_IF_ERROR(append(out, decode_accusation<SuspectMsg>(body), "suspect"));
                break;
            case MessageType::kAlive:
                EDGE_RETURN_IF_ERROR(append(out, decode_alive(body), "alive"));
                break;
            case MessageType::kDead:
                EDGE_RETURN_IF_ERROR(append(out, decode_accusation<DeadMsg>(body), "dead"));
                break;
            case MessageType::kPushPull:
                EDGE_RETURN_IF_ERROR(
                    append(out, decode_push_pull(body, limits, used), "push-pull"));
                break;
            case MessageType::kUserEvent:
                EDGE_RETURN_IF_ERROR(append(out, decode_user_event(body), "user event"));
                break;
        }
    }
    return out;
}

}  // namespace edge::routing::membership
