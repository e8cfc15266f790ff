#include "daemon/forward/usage_scanner.h"

#include <doctest/doctest.h>

#include <string>

using edge::daemon::forward::UsageScanner;

namespace {

const std::string kStream =
    "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n"
    "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,"
    "\"completion_tokens\":34,\"total_tokens\":46}}\n\n"
    "data: [DONE]\n\n";

}  // namespace

TEST_CASE("usage scanner: a stream split at every possible point") {
    for (size_t cut = 0; cut <= kStream.size(); ++cut) {
        CAPTURE(cut);
        UsageScanner scanner;
        scanner.feed_events(std::string_view(kStream).substr(0, cut));
        scanner.feed_events(std::string_view(kStream).substr(cut));
        CHECK(scanner.prompt_tokens() == 12);
        CHECK(scanner.completion_tokens() == 34);
    }
    UsageScanner bytewise;
    for (char ch : kStream) {
        bytewise.feed_events(std::string_view(&ch, 1));
    }
    CHECK(bytewise.completion_tokens() == 34);
}

TEST_CASE("usage scanner: JSON bodies, garbage and over-long events") {
    UsageScanner json;
    json.feed_json(R"({"usage":{"prompt_tokens":3,"completion_tokens":4}})");
    CHECK(json.prompt_tokens() == 3);
    CHECK(json.completion_tokens() == 4);

    UsageScanner garbage;
    garbage.feed_json("not json");
    garbage.feed_json(R"({"usage":"many"})");
    garbage.feed_events("data: {\"usage\":{\"prompt_tokens\":\n\ndata: {broken\n\n");
    CHECK(garbage.prompt_tokens() == 0);

    UsageScanner long_event;
    std::string huge = "data: {\"usage\":{\"prompt_tokens\":1},\"pad\":\"" +
                       std::string(2 << 20, 'x') + "\"}\n\n";
    long_event.feed_events(huge);  // One piece: parsed whole, no partial buffering needed.
    CHECK(long_event.prompt_tokens() == 1);
    UsageScanner split_long;
    split_long.feed_events(std::string_view(huge).substr(0, (1 << 20) + 1));
    split_long.feed_events(std::string_view(huge).substr((1 << 20) + 1));
    CHECK(split_long.prompt_tokens() == 0);  // Over the bound: skipped, not buffered.
    split_long.feed_events(kStream);         // And the scanner recovers at the next event.
    CHECK(split_long.prompt_tokens() == 12);
}
