// The session's framing of a request head without its socket (tls/http_framing.h): the same bytes
// get the same answer however they came in (one segment, or pieces), as the HTTP session fuzz
// target (tests/fuzz/http_session_fuzz.cc) checks on any input.

#include <doctest/doctest.h>

#include <algorithm>
#include <boost/beast/core/flat_buffer.hpp>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

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

// What the phase after a chunked request's head came to (read_chunked_body).
struct BodyOutcome {
    RequestReadPhase::Step step;  // The last: an error, finished, or a read asked for.
    size_t fed = 0;               // Bytes of the body read.
    size_t examined = 0;          // RequestReadPhase::chunk_bytes_examined_for_test().
};

// The body of a chunked POST, its head parsed first, read as HttpSession::parse_request reads it:
// `next_read(read_size)` gives what each read brings (at most read_size bytes), nothing when the
// client has sent all it will (the phase then still waiting: neither an error nor finished).
BodyOutcome read_chunked_body(size_t max_header_bytes, size_t max_body_bytes,
                              const std::function<std::string_view(size_t)>& next_read) {
    boost::beast::flat_buffer buffer;
    RequestParser parser;
    set_request_limits(parser, max_header_bytes, max_body_bytes);
    const std::string_view head =
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    std::memcpy(buffer.prepare(head.size()).data(), head.data(), head.size());
    buffer.commit(head.size());
    RequestReadPhase header(max_header_bytes, true);
    REQUIRE(header.advance(parser, buffer).finished);
    RequestReadPhase body(max_header_bytes, false);
    BodyOutcome outcome;
    for (;;) {
        outcome.step = body.advance(parser, buffer);
        outcome.examined = body.chunk_bytes_examined_for_test();
        if (outcome.step.ec || outcome.step.finished) {
            CHECK(parser.is_done() == outcome.step.finished);
            return outcome;
        }
        const std::string_view read = next_read(outcome.step.read_size);
        if (read.empty()) {
            return outcome;
        }
        std::memcpy(buffer.prepare(read.size()).data(), read.data(), read.size());
        buffer.commit(read.size());
        outcome.fed += read.size();
    }
}

// read_chunked_body over `body` cut into reads at `cuts` (ascending offsets into it).
BodyOutcome read_chunked_body_cut(std::string_view body, std::vector<size_t> cuts,
                                  size_t max_header_bytes = 1024, size_t max_body_bytes = 1024) {
    cuts.push_back(body.size());
    size_t at = 0;
    size_t cut = 0;
    return read_chunked_body(max_header_bytes, max_body_bytes, [&](size_t read_size) {
        while (cut < cuts.size() && cuts[cut] <= at) {
            ++cut;
        }
        const size_t end = cut < cuts.size() ? std::min(cuts[cut], at + read_size) : at;
        const std::string_view read = body.substr(at, end - at);
        at = end;
        return read;
    });
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
        // Each piece, as one read (one TLS record) of the session gets it.
        std::string bytes;
        std::vector<size_t> cuts;
        for (const char c : body) {
            if (c == '|') {
                cuts.push_back(bytes.size());
            } else {
                bytes += c;
            }
        }
        const BodyOutcome outcome = read_chunked_body_cut(bytes, cuts);
        CHECK_FALSE(outcome.step.ec);
        CHECK(outcome.step.finished);
    }
}

TEST_CASE("a chunk line or trailer split anywhere across reads gets the one-segment answer") {
    // The search for the end of a chunk line, and of the last chunk's trailer, resumes where the
    // last read's search stopped: a CRLF or the empty line's CRLFCRLF split across two reads, or
    // three, must still be found.
    const std::string_view bodies[] = {
        "0\r\n\r\n",
        "0\r\nT: 1\r\nU: 2\r\n\r\n",
        "3;e=1\r\nabc\r\n00\r\nT: 1\r\n\r\n",
        "1\r\nx\r\n0;a=\"x\r\n\r\n",      // A quote run past the last chunk's line.
        // A long first line, then a shorter one: a search position kept from the first line
        // (not reset when the parser took it) would start past the second's end.
        "1;aaaaaaaaaaaa\r\nx\r\n0;a=\"x\r\n\r\n",
        "5;a=\"x\r\nhello\r\n0\r\n\r\n",  // A quote run past a chunk line: refused.
        "0\r\nT: 1\r\n\r",                 // The empty line not whole: still waiting.
    };
    for (const std::string_view body : bodies) {
        CAPTURE(body);
        const BodyOutcome whole = read_chunked_body_cut(body, {});
        for (size_t first = 0; first <= body.size(); ++first) {
            for (size_t second = first; second <= body.size(); ++second) {
                CAPTURE(first);
                CAPTURE(second);
                const BodyOutcome split = read_chunked_body_cut(body, {first, second});
                CHECK(split.step.ec == whole.step.ec);
                CHECK(split.step.finished == whole.step.finished);
            }
        }
    }
}

TEST_CASE("a chunk line or trailer that comes a byte at a time is searched in linear time") {
    // Each read of a byte gave the parser the whole line again, and the line's end was searched
    // for from its start each time: O(n^2), about 9 s of an I/O thread for a 1 MiB line. Now
    // each byte is searched a bounded number of times. A byte at a time for 256 KiB, then in the
    // reads the session asks for (16 KiB) up to the bound of 1 MiB: refused as too long.
    constexpr size_t kMaxHeader = size_t{1} << 20;
    constexpr size_t kByteAtATime = size_t{256} << 10;
    for (const std::string_view line_start : {"0\r\nX: ", "1;"}) {
        CAPTURE(line_start);
        std::string bytes(line_start);
        bytes.resize(kMaxHeader + 64, 'a');
        size_t at = 0;
        const BodyOutcome outcome =
            read_chunked_body(kMaxHeader, size_t{4} << 20, [&](size_t read_size) {
                const size_t n = at < kByteAtATime ? 1 : std::min(read_size, bytes.size() - at);
                const std::string_view read = std::string_view(bytes).substr(at, n);
                at += read.size();
                return read;
            });
        CHECK(outcome.step.ec == boost::beast::http::error::header_limit);
        CHECK(outcome.fed >= kMaxHeader);
        CHECK(outcome.examined < 8 * outcome.fed);
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
