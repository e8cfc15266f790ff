#pragma once

// Transport is what the sans-IO Memberlist needs from a network: send a datagram, and run one
// request/response exchange over a stream (push-pull state sync and the TCP fallback probe).
// UdpTransport implements it on Boost.Asio; the test simulator implements it over a fake network.
// Contract: calls come from the membership strand/thread; an implementation must report the
// outcome of every send_stream by calling Memberlist::handle_stream_response(id, ...) later on
// that same strand/thread (never from inside send_stream), exactly once.

#include <cstdint>
#include <string>
#include <vector>

namespace edge::routing::membership {

class Transport {
public:
    virtual ~Transport() = default;

    // Best effort: a lost datagram is the protocol's problem, not the transport's.
    virtual void send_packet(const std::string& addr, std::vector<uint8_t> bytes) = 0;

    // Opens a stream to `addr`, writes `request` as one frame and reads one response frame.
    virtual void send_stream(const std::string& addr, uint64_t id,
                             std::vector<uint8_t> request) = 0;
};

}  // namespace edge::routing::membership
