// What travels between the client and the peer of a forward besides the answer's bytes: the
// headers (forward_fixture.h's RawPeer sends the peer's).

#include <doctest/doctest.h>

#include <string>

#include "tests/daemon/forward/forward_fixture.h"

using namespace edge;
using namespace edge::testing::forward;

TEST_CASE("a peer's headers that its Connection header names are not relayed to the client") {
    // Hop-by-hop headers include those the Connection header names (RFC 9110 7.6.1): they were
    // meant for this site's connection to the peer, and were passed on to the client.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    const std::string body =
        R"({"id":"1","object":"chat.completion","choices":[{"index":0,"message":)"
        R"({"role":"assistant","content":"ok"},"finish_reason":"stop"}],)"
        R"("usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}})";
    RawPeer raw(cluster,
                "HTTP/1.1 200 OK\r\nConnection: keep-alive,\tX-Peer-Hop \r\n"
                "Connection: x-peer-other\r\nX-Peer-Hop: secret\r\n"
                "X-Peer-Other: secret\r\nX-Peer-Kept: yes\r\n"
                "Content-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body);
    a.planner.route_to({raw.target()});
    auto r = a.ask(chat_request(false));
    CHECK(r->status == 200);
    CHECK(r->headers.count("x-peer-hop") == 0);
    CHECK(r->headers.count("x-peer-other") == 0);
    CHECK(r->headers["x-peer-kept"] == "yes");
    CHECK(r->headers["x-edgeserve-site"] == "raw");
}
