// Seeded random mutations of valid inputs through every parser of untrusted bytes: each must
// return a value or an error, never crash or hang (the libFuzzer targets in tests/fuzz go further).

#include <doctest/doctest.h>

#include <random>
#include <string>

#include "daemon/api/openai_request.h"
#include "daemon/config.h"
#include "tests/testing/config_yaml.h"
#include "tls/http_request_parser.h"
#include "tls/proxy_protocol.h"

using namespace edge;

namespace {

std::string mutate(std::string s, std::mt19937& rng) {
    std::uniform_int_distribution<int> op(0, 3);
    std::uniform_int_distribution<int> byte(0, 255);
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < edits && !s.empty(); ++i) {
        size_t pos = rng() % s.size();
        switch (op(rng)) {
            case 0: s[pos] = static_cast<char>(byte(rng)); break;
            case 1: s.erase(pos, 1 + rng() % 8); break;
            case 2: s.insert(pos, 1, static_cast<char>(byte(rng))); break;
            default: s = s.substr(0, pos); break;
        }
    }
    return s;
}

}  // namespace

TEST_CASE("mutated inputs never crash the parsers") {
    std::mt19937 rng(12345);
    const std::string http =
        "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\nPOST /v1/completions HTTP/1.1\r\nHost: a\r\n"
        "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    const std::string chat =
        R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],)"
        R"("stream":true,"stream_options":{"include_usage":true},"stop":["a"],"seed":1})";
    const std::string yaml = testing::config_yaml("c", "k",
                                                  "tenants:\n  - name: a\n    api_key_sha256: [" +
                                                      std::string(64, 'a') + "]\n");
    tls::HttpLimits limits;
    int ok = 0;
    for (int i = 0; i < 2000; ++i) {
        std::string h = mutate(http, rng);
        auto proxy = tls::parse_proxy_header(h);
        std::string_view rest = h;
        if (proxy.ok() && proxy->state == tls::ProxyParseState::kDone) {
            rest.remove_prefix(proxy->header.consumed);
        }
        ok += tls::parse_http_request(rest, limits).ok();
        auto parsed = daemon::api::parse_openai_request(
            i % 2 ? daemon::api::Endpoint::kChatCompletions : daemon::api::Endpoint::kCompletions,
            mutate(chat, rng));
        ok += std::holds_alternative<daemon::api::ParsedRequest>(parsed);
        if (i % 10 == 0) {
            ok += daemon::parse_config(mutate(yaml, rng), "m.yaml").ok();
        }
    }
    CHECK(ok > 0);  // Some mutations stay valid; the point is that none crashed.
    CHECK(tls::parse_http_request(http.substr(http.find("\r\n") + 2), limits)->body == "abc");
}
