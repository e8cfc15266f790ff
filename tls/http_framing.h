#pragma once

// Pure helpers of the HTTP/1.1 session (tls/http_session.cc): the framing of the requests of a
// connection without its reads (the empty lines before a request, Beast's parser fed as the
// session feeds it, the checks of a parsed head, which answer each error gets), the formatting of
// a response head and of the server's own error bodies, and the naming of a handshake failure for
// ServerObserver. The session and tests/fuzz/http_session_fuzz.cc run the same code. Stateless
// but for RequestReadPhase (one per phase of a request); thread-safe. Includes Beast: include it
// only from the session's files and their tests.

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/system/error_code.hpp>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "tls/http_types.h"

namespace edge::tls {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// Empty lines a client may send before a request line, as Apache's limit (10): RFC 9112 section
// 2.2 asks a server to ignore at least one (a client that ends a POST body with an extra CRLF, as
// old browsers do), and a bound keeps a stream of them from holding a connection forever. More
// than that reach the parser, which refuses them (400).
constexpr int kMaxEmptyLines = 10;

// The bytes of the empty lines (CRLF, or a bare LF) at the start of `bytes` that are skipped:
// `empty_lines` counts those of the request so far, up to kMaxEmptyLines, and is advanced.
size_t empty_lines_prefix(std::string_view bytes, int& empty_lines);

// `buffered` (what is read and not parsed, empty lines skipped) holds no byte of a next request
// yet: nothing, or the CR of an empty line's CRLF whose LF is still to come.
inline bool awaiting_request(std::string_view buffered, int empty_lines) {
    return buffered.empty() ||
           (buffered.size() == 1 && buffered.front() == '\r' && empty_lines < kMaxEmptyLines);
}

// The parser of one request, with the connection's bounds on its header and body.
void set_request_limits(RequestParser& parser, size_t max_header_bytes, size_t max_body_bytes);

// One phase of a request's read, the header (`header_only`) or what follows it (the body: data,
// chunk-size lines, the trailer), as the session runs it: advance() feeds the parser what the
// buffer holds (in the header, only whole parts of it: the same answer however the bytes came
// in), the session reads at most read_size more bytes into the buffer when it asks, and
// calls advance() again, or at_eof() at the end of the stream.
// Beast bounds the fields of a header (not with its request line) and the payload, not a
// chunk-size line with its extensions nor the trailer section: each is held to max_header_bytes
// here (the request line and fields together), and an error is http::error::header_limit. A
// chunk line the parser holds whole (with the last chunk, its trailer too) and cannot finish is
// refused at once (http::error::bad_chunk_extension): given it again with more bytes, Beast
// counted its size against the body's bound again, so its answer depended on the reads.
class RequestReadPhase {
  public:
    RequestReadPhase(size_t max_header_bytes, bool header_only)
        : limit_(max_header_bytes), header_only_(header_only) {}

    struct Step {
        boost::system::error_code ec;  // Set: the phase failed (the parser's error, or ours).
        bool finished = false;         // The phase is done (ec clear).
        size_t read_size = 0;          // Neither: read at most this many bytes, then advance().
    };
    Step advance(RequestParser& parser, boost::beast::flat_buffer& buffer);

    // The client closed mid-phase: the parser's verdict (partial_message if it has none), as
    // Beast's readers report it.
    static boost::system::error_code at_eof(RequestParser& parser);

    // Bytes chunk_line_whole() has searched over the phase: tests check that a chunk line or
    // trailer that comes a byte at a time is searched in time linear in its length.
    size_t chunk_bytes_examined_for_test() const { return chunk_examined_; }

  private:
    // Of the unparsed head `bytes`, how much the parser gets now: the request line once it is
    // whole, then the fields once the empty line that ends them is here; 0 until then.
    size_t head_part(std::string_view bytes);

    // Of `rest`, what the parser left of a chunked body when it asked for more (a chunk-size
    // line, after the CRLF that ends the previous chunk's data), whether the line is whole, and
    // for the last chunk its trailer section too. See http_framing.cc.
    bool chunk_line_whole(std::string_view rest);
    // The first `pattern` in `rest` at or after `from`, not searching again what an earlier
    // search of the same rest covered (chunk_scanned_).
    size_t find_resumed(std::string_view rest, std::string_view pattern, size_t from);

    size_t limit_;
    bool header_only_;
    size_t header_bytes_ = 0;  // Of the header, consumed by the parser (header_only_).
    size_t scanned_ = 0;       // Of the unparsed head, searched for line ends (head_part).
    size_t line_start_ = 0;    // Of the unparsed head, where its first line not whole starts.
    // After the header: the parser is given what it left again only once the buffer holds this
    // many bytes (0: whatever it holds). See advance().
    static constexpr size_t kBeastRetryBytes = 5;
    size_t retry_bytes_ = 0;
    // Of the rest the parser left at the buffer's front after the header (chunk_line_whole),
    // given again with more bytes until the parser takes some: how far it was searched, where
    // its chunk line ends (npos: not found yet) and whether that is the last chunk's. Searching
    // it whole each time cost O(n^2) for a line or trailer that came a byte at a time.
    size_t chunk_scanned_ = 0;
    size_t chunk_eol_ = std::string_view::npos;
    bool last_chunk_ = false;
    size_t chunk_examined_ = 0;  // Bytes searched, over all the rests (for tests).
};

// The failure_reason of ServerObserver::on_handshake for a handshake that ended with `ec`.
std::string_view handshake_failure_reason(const boost::system::error_code& ec, bool timed_out);

// Method and target of the request line at the start of `unparsed` when the line is complete
// (both empty otherwise): a line that came in pieces Beast parses only with the whole header, and
// an answer made before that (a 408) is still recorded under the request's route.
std::pair<std::string_view, std::string_view> request_line_parts(std::string_view unparsed);

struct FramingError {
    int status = 0;  // 0: the framing is fine.
    std::string_view message;
};

// The answer to the error `ec` of a request's header phase (RequestReadPhase, header_only):
// 414/431 past max_header_bytes, 413 for a Content-Length past the body's bound, 505 or 400 for
// what the parser refused. Status 0 for an end of stream, a reset or a timeout: not an answer of
// the framing (the session answers a timeout, 408). `unparsed`: what the parser left in the
// buffer (the start of the head it refused).
FramingError header_phase_error(const boost::system::error_code& ec, const RequestParser& parser,
                                std::string_view unparsed, size_t max_header_bytes);

// The answer to a parsed request head the server does not serve, in the order the session checks
// them: the version (505), the Host count of HTTP/1.1 (400), a method Beast does not know (501),
// the target's form (check_request_target), the Transfer-Encoding (check_transfer_encoding).
// Each closes the connection after the answer.
FramingError check_request_head(const boost::beast::http::request_header<>& head);

// The answer to the error `ec` of the phase after a request's head (the body): 400 for a chunk
// line or trailer past max_header_bytes or one the parser refused, 413 for a body past its bound.
// Status 0 as header_phase_error.
FramingError body_phase_error(const boost::system::error_code& ec,
                              const boost::beast::http::request_header<>& head);

// Transfer-Encoding is accepted only as exactly "chunked" on HTTP/1.1 without Content-Length
// (RFC 9112 section 6): any other coding, or one the server cannot frame, closes the connection
// after the answer.
FramingError check_transfer_encoding(const boost::beast::http::request_header<>& head);

// The request target's form against the method (RFC 9112 section 3.2): asterisk-form ("*") is
// only OPTIONS's (400 for any other method), and CONNECT, whose authority-form target asks for a
// tunnel, is not served at all (501: what follows it on the connection is not HTTP, so the
// connection closes after the answer).
FramingError check_request_target(std::string_view method, std::string_view target);

// The message of the 400 for a request that Beast's parser refused with `ec` (one of its
// http::error codes), naming what is wrong: `head` holds the fields parsed so far; `in_body`: the
// error came while reading the body (a chunk or a trailer). Fixed texts, safe for error_body().
std::string_view parse_error_message(const boost::system::error_code& ec,
                                     const boost::beast::http::request_header<>& head,
                                     bool in_body);

// The JSON error body (OpenAI's shape) of an answer the server makes itself. `message` is one of
// the fixed texts of the session (not escaped).
std::string error_body(std::string_view message);

// Appends the status line and header of `response` to `out`: Content-Length when
// `content_length` is set, else chunked framing (HTTP/1.1) or none (HTTP/1.0, close-delimited),
// and the Connection field `keep_alive` and `version` call for.
void format_head(std::string& out, const HttpResponse& response, int version, bool keep_alive,
                 std::optional<size_t> content_length);

}  // namespace edge::tls
