// libFuzzer target for everything gossip reads from the network: the first byte picks a path.
//   0: plaintext packet decoder (decode_packet) and site-state decoder
//   1: AES-256-GCM open with a fixed test key, then decode (the decryption path)
//   2: a whole Memberlist fed the bytes as a packet and as a stream request (clear mode), so
//      decoded messages drive the protocol's state machine too
// Bad input must give a Status, never a crash, hang, leak or sanitizer report.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/clock.h"
#include "routing/membership/keyring.h"
#include "routing/membership/memberlist.h"
#include "routing/membership/messages.h"
#include "routing/membership/site_state.h"

namespace {

using namespace edge::routing::membership;

class NullTransport final : public Transport {
public:
    void send_packet(const std::string&, std::vector<uint8_t>) override {}
    void send_stream(const std::string&, uint64_t, std::vector<uint8_t>) override {}
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) {
        return 0;
    }
    const uint8_t mode = data[0] % 3;
    std::span<const uint8_t> bytes(data + 1, size - 1);
    switch (mode) {
        case 0: {
            auto msgs = decode_packet(bytes);
            (void)msgs;
            auto site = decode_site_state(bytes);
            if (site.ok()) {
                // Whatever decodes must re-encode and decode to the same value.
                auto again = decode_site_state(encode_site_state(*site));
                if (!again.ok() || !(*again == *site)) {
                    __builtin_trap();
                }
            }
            break;
        }
        case 1: {
            GossipKey key;
            key.fill(0x42);
            static const Keyring ring = Keyring::create({key}).value();
            auto plain = ring.open("fuzz", bytes);
            if (plain.ok()) {
                (void)decode_packet(*plain);
            }
            break;
        }
        case 2: {
            static edge::ManualClock clock;
            static NullTransport transport;
            MembershipConfig c;
            c.name = "fuzz";
            c.advertise_addr = "127.0.0.1:1";
            auto ml = Memberlist::create(c, Keyring(), clock, transport, SiteState{});
            if (!ml.ok()) {
                __builtin_trap();
            }
            (*ml)->start();
            std::vector<uint8_t> framed{0, 0};  // clear mode, empty label
            framed.insert(framed.end(), bytes.begin(), bytes.end());
            (*ml)->handle_packet("127.0.0.1:2", framed);
            (void)(*ml)->handle_stream("127.0.0.1:2", framed);
            clock.advance(std::chrono::seconds(5));
            (*ml)->run_due_timers();
            (void)(*ml)->snapshot();
            break;
        }
    }
    return 0;
}
