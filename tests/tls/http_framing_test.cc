// The session's framing of a request head without its socket (tls/http_framing.h): the same bytes
// get the same answer however they came in (one segment, or pieces), as the HTTP session fuzz
// target (tests/fuzz/http_session_fuzz.cc) checks on any input.

#include <doctest/doctest.h>

#include <algorithm>
#include <boost/beast/core/flat_buffer.hpp>
#include <cstring>
#include <string>
#include <string_view>

#include "tls/http_framing.h"

using namespace edge::tls;

namespace {

struct HeadOutcome {
    bool header_done = false;
    int status = 0;  // The server's answer (header_phase_error), 0: none.
    std::string message;
    std::string target;
    size_t unparsed = 0;  // Bytes left in the buffer.
};

// One phase of a request's read as HttpSession::parse_request runs it (its RequestReadPhase), the
// bytes from `bytes` at `at`, at most `piece` at a time (0: as much as the session asks for), the
// client closing after them.
boost::system::error_code run_phase(RequestParser& parser, boost::beast::flat_buffer& buffer,
                                    std::string_view bytes, size_t& at, size_t piece,
                                    size_t max_header_bytes, bool header_only) {
    RequestReadPhase phase(max_header_bytes, header_only);
    for (;;) {
        const RequestReadPhase::Step step = phase.advance(parser, buffer);
        if (step.ec || step.finished) {
            return step.ec;
        }
        if (at == bytes.size()) {
            return RequestReadPhase::at_eof(parser);
        }
        size_t n = std::min(step.read_size, bytes.size() - at);
        if (piece != 0) {
            n = std::min(n, piece);
        }
        std::memcpy(buffer.prepare(n).data(), bytes.data() + at, n);
        buffer.commit(n);
        at += n;
    }
}

// The header phase over `bytes` (run_phase).
HeadOutcome read_head(std::string_view bytes, size_t piece, size_t max_header_bytes) {
    boost::beast::flat_buffer buffer;
    RequestParser parser;
    set_request_limits(parser, max_header_bytes, 1 << 20);
    size_t at = 0;
    const boost::system::error_code ec =
        run_phase(parser, buffer, bytes, at, piece, max_header_bytes, true);
    const std::string_view unparsed(static_cast<const char*>(buffer.data().data()),
                                    buffer.size());
    const FramingError answer = header_phase_error(ec, parser, unparsed, max_header_bytes);
    return {parser.is_header_done() && !ec, answer.status, std::string(answer.message),
            std::string(parser.get().target()), buffer.size()};
}

void check_same_however_split(std::string_view bytes, size_t max_header_bytes,
                              int expected_status) {
    // The session's first read of a request takes up to 4 KiB: the whole head in one segment.
    const HeadOutcome whole = read_head(bytes, 0, max_header_bytes);
    CHECK(whole.status == expected_status);
    for (size_t piece : {1, 2, 3, 5, 7, 16}) {
        CAPTURE(piece);
        const HeadOutcome split = read_head(bytes, piece, max_header_bytes);
        CHECK(split.status == whole.status);
        CHECK(split.message == whole.message);
        CHECK(split.header_done == whole.header_done);
    }
}

struct RequestOutcome {
    bool done = false;  // The whole request was read.
    int status = 0;     // The server's answer (header_phase_error, body_phase_error), 0: none.
    std::string message;
};

// A request's header and then its body, read as HttpSession::read_request reads them (each phase
// its RequestReadPhase), from `bytes` at most `piece` bytes at a time (0: as much as the session
// asks for), the client closing after them.
RequestOutcome read_request(std::string_view bytes, size_t piece, size_t max_header_bytes,
                            size_t max_body_bytes) {
    boost::beast::flat_buffer buffer;
    RequestParser parser;
    set_request_limits(parser, max_header_bytes, max_body_bytes);
    size_t at = 0;
    auto phase = [&](bool header_only) {
        return run_phase(parser, buffer, bytes, at, piece, max_header_bytes, header_only);
    };
    boost::system::error_code ec = phase(true);
    const std::string_view unparsed(static_cast<const char*>(buffer.data().data()),
                                    buffer.size());
    FramingError answer = header_phase_error(ec, parser, unparsed, max_header_bytes);
    if (ec || answer.status != 0) {
        return {false, answer.status, std::string(answer.message)};
    }
    if (!parser.is_done()) {
        ec = phase(false);
        answer = body_phase_error(ec, parser.get());
    }
    return {!ec && parser.is_done(), answer.status, std::string(answer.message)};
}

}  // namespace

TEST_CASE("a request line ended by a bare LF gets its 400 however it came in") {
    // In one segment Beast refused the line at once; in pieces it waited for a CRLF CRLF that
    // never comes, until the client's close (no answer) or header_timeout (408).
    check_same_however_split("GET / HTTP/1.1\nHost: a\n\n", 16 * 1024, 400);
    CHECK(read_head("GET / HTTP/1.1\nHost: a\n\n", 3, 16 * 1024).message ==
          "malformed request line: lines end with CRLF");
}

TEST_CASE("a malformed field in a header past the bound gets the same answer however it came") {
    // In one segment Beast parsed the fields within the bound and refused the field (400); in
    // pieces it waited for the header's end, past the bound (431).
    const std::string head = "GET / HTTP/1.1\r\nHost: a\r\nBad Field: x\r\nX-Pad: " +
                             std::string(80, 'y') + "\r\n\r\n";
    check_same_however_split(head, 64, 431);
    // Within the bound, the field is refused however it came.
    check_same_however_split("GET / HTTP/1.1\r\nHost: a\r\nBad Field: x\r\n\r\n", 64, 400);
}

TEST_CASE("a valid head is parsed whole, and what follows it stays for the next request") {
    const std::string_view bytes =
        "GET /first HTTP/1.1\r\nHost: a\r\n\r\nGET /second HTTP/1.1\r\nHost: a\r\n\r\n";
    for (size_t piece : {0, 1, 4, 9}) {
        CAPTURE(piece);
        const HeadOutcome outcome = read_head(bytes, piece, 16 * 1024);
        CHECK(outcome.header_done);
        CHECK(outcome.status == 0);
        CHECK(outcome.target == "/first");
    }
    CHECK(read_head(bytes, 0, 16 * 1024).unparsed == 33);  // The second request, all of it.
    // A head exactly at the bound passes; one byte more does not.
    const std::string at_bound = "GET / HTTP/1.1\r\nHost: a\r\nX: " + std::string(32, 'v') +
                                 "\r\n\r\n";
    REQUIRE(at_bound.size() == 64);
    CHECK(read_head(at_bound, 0, 64).header_done);
    CHECK(read_head(at_bound, 1, 64).header_done);
    CHECK(read_head(at_bound, 0, 63).status == 431);
    CHECK(read_head(at_bound, 1, 63).status == 431);
}

TEST_CASE("a chunked body whose last chunk and empty line come in pieces is read whole") {
    // "0\r\n" and then one byte more: Beast asserted that it was given at least 5 bytes after
    // the last chunk, and the daemon (built with assertions) aborted.
    for (const std::string_view body : {"0\r\n|\r|\n", "0\r\n|\r|\n|", "3\r\nabc|\r\n0\r\n|\r|\n",
                                        "0;e=1\r\n|X|:|1\r\n|\r|\n", "0\r\n|\r\n"}) {
        CAPTURE(body);
        boost::beast::flat_buffer buffer;
        RequestParser parser;
        set_request_limits(parser, 1024, 1024);
        const std::string_view head =
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
        std::memcpy(buffer.prepare(head.size()).data(), head.data(), head.size());
        buffer.commit(head.size());
        RequestReadPhase header(1024, true);
        REQUIRE(header.advance(parser, buffer).finished);
        RequestReadPhase rest(1024, false);
        RequestReadPhase::Step step;
        std::string_view pieces = body;
        for (;;) {
            step = rest.advance(parser, buffer);
            if (step.ec || step.finished || pieces.empty()) {
                break;
            }
            // The next piece, as one read (one TLS record) of the session gets it.
            const std::string_view piece = pieces.substr(0, pieces.find('|'));
            pieces.remove_prefix(std::min(pieces.size(), piece.size() + 1));
            std::memcpy(buffer.prepare(piece.size()).data(), piece.data(), piece.size());
            buffer.commit(piece.size());
        }
        CHECK_FALSE(step.ec);
        CHECK(step.finished);
        CHECK(parser.is_done());
    }
}

TEST_CASE("a chunk line whose quoted extension runs past its end gets one answer however it came") {
    // Beast took the chunk's size off the body's bound each time it parsed such a line again,
    // once per read that brought more bytes: one segment got no answer (the client's close) or
    // the 400 of a quote closed further on, a byte at a time got a 413.
    const std::string head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (const std::string& body :
         {std::string("5;a=\"x\r\nhello\r\n0\r\n\r\n"),          // Never closed.
          std::string("5;a=\"x\r\nhel\"lo\r\n0\r\n\r\n"),        // Closed in the data.
          std::string("2\r\nab\r\n3;e=\"\\\r\nabc\r\n0\r\n\r\n"),  // Escaped CR, 2nd chunk.
          std::string("0;a=\"x\r\n\r\n"),                         // The last chunk's.
          std::string("0;a=\"x\r\nT: 1\r\n\r\n\"")}) {           // Closed past the trailer.
        CAPTURE(body);
        const RequestOutcome whole = read_request(head + body, 0, 1024, 16);
        CHECK_FALSE(whole.done);
        CHECK(whole.status == 400);
        CHECK(whole.message == "malformed chunk extension");
        for (size_t piece : {1, 2, 3, 7}) {
            CAPTURE(piece);
            const RequestOutcome split = read_request(head + body, piece, 1024, 16);
            CHECK(split.status == whole.status);
            CHECK(split.message == whole.message);
        }
    }
    // A chunk past the body's bound is refused as that, however it came, before its extension.
    const std::string large = head + "20;a=\"x\r\n" + std::string(32, 'd') + "\r\n0\r\n\r\n";
    CHECK(read_request(large, 0, 1024, 16).status == 413);
    CHECK(read_request(large, 1, 1024, 16).status == 413);
    // Well-formed extensions, quoted ones included, still pass in any pieces.
    const std::string good = head + "5;a=\"x;y\\\"z\";b=c\r\nhello\r\n0;d\r\nT: 1\r\n\r\n";
    for (size_t piece : {0, 1, 2, 3, 7}) {
        CAPTURE(piece);
        CHECK(read_request(good, piece, 1024, 16).done);
    }
}
