#pragma once

// Pure helpers of the HTTP/1.1 session (tls/http_session.cc): the reading of a request's framing
// (Transfer-Encoding, the request line of a head Beast has not parsed, what a parse error means),
// the formatting of a response head and of the server's own error bodies, and the naming of a
// handshake failure for ServerObserver. Stateless; thread-safe. Includes Beast: include it only
// from the session's files.

#include <boost/beast/http/message.hpp>
#include <boost/system/error_code.hpp>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "tls/http_types.h"

namespace edge::tls {

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
