#include "daemon/forward/usage_scanner.h"

#include <doctest/doctest.h>

#include <string>
#include <string_view>

using edge::daemon::forward::UsageScanner;

namespace {

const std::string kStream =
    "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n"
    "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,"
    "\"completion_tokens\":34,\"total_tokens\":46}}\n\n"
    "data: [DONE]\n\n";

// What `scanner` relays of `stream` fed in two pieces, cut at `cut` (the held rest not flushed).
std::string feed_cut(UsageScanner& scanner, std::string_view stream, size_t cut) {
    std::string out = scanner.feed_events(stream.substr(0, cut));
    out += scanner.feed_events(stream.substr(cut));
    return out;
}

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

TEST_CASE("usage scanner: the peer's usage report is read and not relayed, at any split") {
    const std::string relayed =
        "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
        "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,"
        "\"completion_tokens\":1}}\n\n";
    const std::string report =
        ": edgeserve-usage {\"prompt_tokens\":7,\"completion_tokens\":9}\n\n";
    const std::string stream = relayed + report + "data: [DONE]\n\n";
    for (size_t cut = 0; cut <= stream.size(); ++cut) {
        CAPTURE(cut);
        UsageScanner scanner;
        std::string out = feed_cut(scanner, stream, cut);
        out += scanner.flush();
        CHECK(out == relayed + "data: [DONE]\n\n");
        CHECK(scanner.reported());
        CHECK(scanner.prompt_tokens() == 7);  // The report wins over the client's usage chunk.
        CHECK(scanner.completion_tokens() == 9);
    }
    // A report that does not read is withheld but not taken as one: the forward is charged its
    // reservation, not 0 tokens.
    for (const char* bad :
         {": edgeserve-usage {\"prompt_tokens\":7\n\n",
          ": edgeserve-usage {\"prompt_tokens\":\"7\",\"completion_tokens\":9}\n\n",
          ": edgeserve-usage \n\n"}) {
        CAPTURE(bad);
        UsageScanner scanner;
        CHECK(scanner.feed_events(std::string(bad) + "data: [DONE]\n\n") == "data: [DONE]\n\n");
        CHECK_FALSE(scanner.reported());
    }
    UsageScanner held;
    CHECK(held.feed_events("data: {\"a\":1}\n").empty());  // Half an event: held back.
    CHECK(held.feed_events("\ndata: {").size() == std::string("data: {\"a\":1}\n\n").size());
    CHECK(held.flush() == "data: {");
}

TEST_CASE("usage scanner: an over-long event is relayed intact without being held") {
    const std::string huge = "data: {\"pad\":\"" + std::string(3 << 20, 'x') + "\"}\n\n";
    UsageScanner scanner;
    std::string out;
    for (size_t at = 0; at < huge.size(); at += 16 * 1024) {
        std::string piece = scanner.feed_events(std::string_view(huge).substr(at, 16 * 1024));
        out += piece;
    }
    out += scanner.feed_events("data: [DONE]\n\n");
    CHECK(out == huge + "data: [DONE]\n\n");
}

TEST_CASE("usage scanner: the end event and an over-long event left open are seen") {
    UsageScanner scanner;
    scanner.feed_events("data: {\"a\":1}\n\ndata: [DO");
    CHECK_FALSE(scanner.ended());  // Held, not relayed yet.
    scanner.feed_events("NE]\n\n");
    CHECK(scanner.ended());

    UsageScanner open;
    const std::string huge = "data: {\"pad\":\"" + std::string(2 << 20, 'x') + "\"}\n\n";
    open.feed_events(std::string_view(huge).substr(0, (1 << 20) + 10));
    CHECK(open.inside_event());  // Part of it relayed, its end not yet.
    open.feed_events(std::string_view(huge).substr((1 << 20) + 10));
    CHECK_FALSE(open.inside_event());
    CHECK_FALSE(open.ended());
    UsageScanner text;
    text.feed_events("data: the text [DONE]\n\n");  // Only the end event itself counts.
    CHECK_FALSE(text.ended());
}

namespace {

// `text` with each LF replaced by `line_end` (an SSE line may end with LF, CRLF or CR).
std::string with_line_ends(std::string_view text, std::string_view line_end) {
    std::string out;
    for (char ch : text) {
        if (ch == '\n') {
            out += line_end;
        } else {
            out += ch;
        }
    }
    return out;
}

}  // namespace

TEST_CASE("usage scanner: events ended by CRLF or CR pass at once and unchanged, at any split") {
    const std::string first =
        "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
    const std::string relayed = first + ": keep-alive\n\n" +
                                "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,"
                                "\"completion_tokens\":1}}\n\n";
    const std::string report =
        ": edgeserve-usage {\"prompt_tokens\":7,\"completion_tokens\":9}\n\n";
    const std::string done = "data: [DONE]\n\n";
    for (std::string_view line_end : {"\r\n", "\r", "\n"}) {
        CAPTURE(line_end.size());
        CAPTURE(line_end.back() == '\r');
        const std::string want = with_line_ends(relayed + done, line_end);
        const std::string stream = with_line_ends(relayed + report + done, line_end);
        for (size_t cut = 0; cut <= stream.size(); ++cut) {
            CAPTURE(cut);
            UsageScanner scanner;
            std::string out = feed_cut(scanner, stream, cut);
            CHECK(scanner.ended());  // Seen before the end of the stream, not left held.
            out += scanner.flush();
            CHECK(out == want);
            CHECK(scanner.reported());
            CHECK(scanner.prompt_tokens() == 7);
            CHECK(scanner.completion_tokens() == 9);
        }
        // A whole event is relayed when its blank line comes, not held for the next one.
        UsageScanner scanner;
        CHECK(scanner.feed_events(with_line_ends(first, line_end)) ==
              with_line_ends(first, line_end));
        UsageScanner bytewise;
        std::string out;
        for (char ch : stream) {
            out += bytewise.feed_events(std::string_view(&ch, 1));
        }
        CHECK(out == want);  // A CR's LF in the next piece follows its event (or its removal).
        CHECK(bytewise.completion_tokens() == 9);
    }
    // Mixed line ends, as a proxy may leave them: LF then CR, CR then CRLF, LF then CRLF.
    const std::string mixed =
        "data: {\"a\":1}\n\r"
        ": edgeserve-usage {\"prompt_tokens\":2,\"completion_tokens\":3}\r\r\n"
        "data: {\"b\":2}\n\r\n"
        "data: [DONE]\r\n\n";
    UsageScanner scanner;
    CHECK(scanner.feed_events(mixed) ==
          "data: {\"a\":1}\n\rdata: {\"b\":2}\n\r\ndata: [DONE]\r\n\n");
    CHECK(scanner.completion_tokens() == 3);
    CHECK(scanner.ended());
}

TEST_CASE("usage scanner: a usage report left without its blank line at the stream's end") {
    const std::string relayed = "data: {\"id\":\"x\",\"choices\":[]}\n\n";
    for (std::string_view tail : {"", "\n", "\r\n", "\r"}) {
        CAPTURE(tail.size());
        const std::string stream = relayed + "data: [DONE]\n\n" +
                                   ": edgeserve-usage {\"prompt_tokens\":5,"
                                   "\"completion_tokens\":6}" +
                                   std::string(tail);
        for (size_t cut = 0; cut <= stream.size(); ++cut) {
            CAPTURE(cut);
            UsageScanner scanner;
            std::string out = feed_cut(scanner, stream, cut);
            out += scanner.flush();
            CHECK(out == relayed + "data: [DONE]\n\n");  // Not shown to the client.
            CHECK(scanner.reported());                   // And charged.
            CHECK(scanner.prompt_tokens() == 5);
            CHECK(scanner.completion_tokens() == 6);
        }
    }
    UsageScanner other;  // Any other unended event is still relayed as it came.
    other.feed_events("data: {\"a\":1}\r\n");
    CHECK(other.flush() == "data: {\"a\":1}\r\n");
    CHECK_FALSE(other.reported());
}

TEST_CASE("usage scanner: a cut reads a report held without its blank line, drops the rest held") {
    const std::string relayed = "data: {\"id\":\"x\",\"choices\":[]}\n\n";
    const std::string stream =
        relayed + ": edgeserve-usage {\"prompt_tokens\":5,\"completion_tokens\":6}\n\n";
    const size_t report_read = stream.size() - 2;  // The report's JSON is whole from here.
    for (size_t at = 0; at <= stream.size(); ++at) {
        CAPTURE(at);
        UsageScanner scanner;
        const std::string out = scanner.feed_events(std::string_view(stream).substr(0, at));
        CHECK(scanner.cut().empty());  // No over-long event left open.
        CHECK(out == (at >= relayed.size() ? relayed : ""));  // Never part of an event.
        CHECK(scanner.reported() == (at >= report_read));
        CHECK(scanner.completion_tokens() == (at >= report_read ? 6 : 0));
    }
    UsageScanner open;
    const std::string huge = "data: {\"pad\":\"" + std::string(2 << 20, 'x') + "\"}\n\n";
    open.feed_events(std::string_view(huge).substr(0, (1 << 20) + 10));
    CHECK(open.cut() == "\n\n");  // Ends the event the client is inside.
    CHECK_FALSE(open.inside_event());
}

TEST_CASE("usage scanner: an error event marks the stream failed, content mentioning it does not") {
    UsageScanner ok;
    ok.feed_events("data: {\"choices\":[{\"delta\":{\"content\":\"data: {\\\"error\\\":\"}}]}\n\n"
                   "data: [DONE]\n\n");
    CHECK_FALSE(ok.failed());
    UsageScanner failed;
    const std::string stream = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
                               "data: {\"error\":{\"message\":\"lost\",\"code\":null}}\n\n"
                               "data: [DONE]\n\n";
    for (char ch : stream) {
        failed.feed_events(std::string_view(&ch, 1));
    }
    CHECK(failed.failed());
    CHECK(failed.ended());
    CHECK(failed.error_code() == "");  // A null code.
    UsageScanner unavailable;
    unavailable.feed_events(
        "data: {\"error\":{\"message\":\"shutting down\",\"code\":\"service_unavailable\"}}\r\n\r\n");
    CHECK(unavailable.failed());
    CHECK(unavailable.error_code() == "service_unavailable");
}

TEST_CASE("usage scanner: an error event over the partial-event bound marks the stream failed") {
    const std::string huge = "data: {\"error\":{\"message\":\"" + std::string(2 << 20, 'x') +
                             "\",\"code\":null}}\n\n";
    UsageScanner scanner;
    std::string out;
    for (size_t at = 0; at < huge.size(); at += 64 * 1024) {
        out += scanner.feed_events(std::string_view(huge).substr(at, 64 * 1024));
    }
    CHECK(out == huge);  // Relayed intact.
    CHECK(scanner.failed());
    CHECK(scanner.error_code() == "");
    UsageScanner content;  // An over-long content event is not an error.
    const std::string long_content = "data: {\"choices\":[{\"delta\":{\"content\":\"" +
                                     std::string(2 << 20, 'x') + "\"}}]}\n\n";
    content.feed_events(long_content);
    CHECK_FALSE(content.failed());
}
