#include "tls/http_framing.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <vector>

namespace edge::tls {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

std::string_view handshake_failure_reason(const boost::system::error_code& ec, bool timed_out) {
    if (timed_out) {
        return "timeout";
    }
    if (ec == net::error::eof || ec == net::ssl::error::stream_truncated ||
        ec == net::error::connection_reset) {
        return "eof";
    }
    if (ec.category() == net::error::get_ssl_category()) {
        switch (ERR_GET_REASON(static_cast<unsigned long>(ec.value()))) {
            case SSL_R_HTTP_REQUEST:
            case SSL_R_HTTPS_PROXY_REQUEST:
            case SSL_R_WRONG_VERSION_NUMBER:
            case SSL_R_PACKET_LENGTH_TOO_LONG:
            case SSL_R_RECORD_LENGTH_MISMATCH:
                return "not_tls";
            case SSL_R_UNSUPPORTED_PROTOCOL:
            case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
                return "version";
            case SSL_R_NO_SHARED_CIPHER:
            case SSL_R_NO_SHARED_GROUPS:
                return "no_shared_cipher";
            case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
            case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
            case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
                return "certificate_rejected";
            case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
            case SSL_R_CERTIFICATE_VERIFY_FAILED:
                return "client_certificate";
            default:
                return "other";
        }
    }
    return "other";
}

size_t empty_lines_prefix(std::string_view bytes, int& empty_lines) {
    size_t at = 0;
    while (empty_lines < kMaxEmptyLines) {
        if (bytes.substr(at).starts_with("\r\n")) {
            at += 2;
        } else if (bytes.substr(at).starts_with("\n")) {
            at += 1;
        } else {
            break;
        }
        ++empty_lines;
    }
    return at;
}

void set_request_limits(RequestParser& parser, size_t max_header_bytes, size_t max_body_bytes) {
    parser.header_limit(static_cast<uint32_t>(max_header_bytes));
    parser.body_limit(max_body_bytes);
}

bool RequestReadPhase::chunk_line_whole(std::string_view rest) {
    // `rest` stopped at a chunk-size line, after the CRLF that ends the previous chunk's data,
    // which the parser reads as part of the line. Whether the line is whole (up to its first
    // CRLF, as Beast finds it), and for the last chunk (size 0) the trailer section through the
    // empty line that ends it.
    const size_t start = rest.starts_with("\r\n") ? 2 : 0;
    if (chunk_eol_ == std::string_view::npos) {
        chunk_eol_ = find_resumed(rest, "\r\n", start);
        if (chunk_eol_ == std::string_view::npos) {
            return false;
        }
        // The line's bytes stay as they are while the parser takes none of them: it is looked
        // at once.
        last_chunk_ = true;
        for (size_t at = start;
             at < chunk_eol_ && std::isxdigit(static_cast<unsigned char>(rest[at])); ++at) {
            last_chunk_ = last_chunk_ && rest[at] == '0';
        }
        chunk_examined_ += chunk_eol_ - start;
    }
    return !last_chunk_ || find_resumed(rest, "\r\n\r\n", chunk_eol_) != std::string_view::npos;
}

size_t RequestReadPhase::find_resumed(std::string_view rest, std::string_view pattern,
                                      size_t from) {
    // `rest` is the last search's with more bytes after it (the parser took none): a match not
    // found then starts past `from` no earlier than pattern.size() - 1 bytes before where that
    // search ended (a CRLF, or an empty line's, split across two reads).
    const size_t overlap = std::min(chunk_scanned_, pattern.size() - 1);
    from = std::max(from, chunk_scanned_ - overlap);
    chunk_examined_ += rest.size() - from;
    const size_t found = rest.find(pattern, from);
    // Found, the search that follows (the trailer's, from the line's end) starts at or past it.
    chunk_scanned_ = found == std::string_view::npos ? rest.size() : found;
    return found;
}

RequestReadPhase::Step RequestReadPhase::advance(RequestParser& parser,
                                                 beast::flat_buffer& buffer) {
    auto finished = [&] { return header_only_ ? parser.is_header_done() : parser.is_done(); };
    boost::system::error_code ec;
    while (buffer.size() > 0 && !finished()) {
        // In the header, the parser gets the request line once it is whole, then the fields once
        // their end is here (head_part). After it, the parser gets at most max_header_bytes at a
        // time: a chunk-size line or trailer it cannot finish within that many bytes is too long.
        size_t offered = std::min(buffer.size(), limit_);
        if (!header_only_ && offered < retry_bytes_) {
            break;
        }
        if (header_only_) {
            offered = head_part({static_cast<const char*>(buffer.data().data()), buffer.size()});
            if (offered == 0) {
                break;
            }
        }
        const size_t used = parser.put(net::buffer(buffer.data().data(), offered), ec);
        buffer.consume(used);
        if (used > 0) {
            // What was searched of the buffer (head_part, chunk_line_whole) is gone from its
            // front: the searches of what follows start over.
            scanned_ = line_start_ = 0;
            chunk_scanned_ = 0;
            chunk_eol_ = std::string_view::npos;
        }
        if (!header_only_ && ec == http::error::need_more && used < offered &&
            parser.chunked() &&
            chunk_line_whole({static_cast<const char*>(buffer.data().data()), offered - used})) {
            // The parser holds a whole chunk line (with the last chunk, its trailer too) and
            // still asks for more: only a quoted extension that runs on past the line's end does
            // that, and the line can never be valid. Given it again with more bytes, Beast took
            // the chunk's size off the body's bound once more each time, and then refused it as
            // too large (413), as malformed (400, a quote closing later) or never (the client's
            // close, a timeout), by how the bytes came in. Refused here, at its first whole
            // parse, it gets the same answer however they came.
            return {http::make_error_code(http::error::bad_chunk_extension)};
        }
        if (header_only_) {
            header_bytes_ += used;
        }
        if (!header_only_) {
            // Beast asks to be given what it left with more after it, but after the last chunk
            // ("0\r\n", its trailer not here) it asserts that it then gets at least 5 bytes:
            // given "0\r\n" and then one byte more (a client's TLS records can end anywhere),
            // the daemon aborted. The bytes left of a chunked body are never fewer than 5 (the
            // last chunk and the empty line), so waiting for 5 delays no complete message.
            retry_bytes_ = ec == http::error::need_more && used == 0
                               ? std::max<size_t>(offered + 1, kBeastRetryBytes)
                               : 0;
        }
        if (ec == http::error::need_more) {
            ec = {};
            if (used > 0 || header_only_) {
                // What it left may go further (a slice ended mid-line); in the header, a line it
                // could not decide on is given again with the next whole part, if one is here.
                continue;
            }
            if (offered == limit_) {
                return {http::make_error_code(http::error::header_limit)};
            }
            break;
        }
        if (ec) {
            return {ec};
        }
        if (used == 0) {
            break;
        }
    }
    if (finished()) {
        if (header_only_ && header_bytes_ > limit_) {
            return {http::make_error_code(http::error::header_limit)};
        }
        return {{}, true};
    }
    // What the parser left unconsumed is a chunk-size line with its extensions, the trailer
    // section, or the header's unfinished part. Each is held to max_header_bytes exactly.
    const size_t held = buffer.size() + header_bytes_;
    if (held > limit_) {
        return {http::make_error_code(http::error::header_limit)};
    }
    // In the header, reads stop one byte past the bound; after it, the slices above bound a
    // chunk line exactly and body bytes are read in full 16 KiB steps.
    const size_t read_size =
        header_only_ ? std::min<size_t>(4096, limit_ + 1 - held) : size_t{16} * 1024;
    return {{}, false, read_size};
}

size_t RequestReadPhase::head_part(std::string_view bytes) {
    // Beast parses what one put() gives it at once, but after a put that needed more it waits for
    // the end of the whole header (\r\n\r\n) before it parses again: given a part, it would refuse
    // a malformed line at once when it came in one segment, and when it came in pieces only
    // later, past the bound (431), or never (the client's close, a timeout; a bare LF ends no
    // header for it). Given only whole parts, it answers the same however the bytes came.
    // Lines are searched within the bound (one byte past it), each byte once.
    const size_t window =
        std::min(bytes.size(), limit_ + 1 - std::min(header_bytes_, limit_));
    while (scanned_ < window) {
        const size_t end = bytes.substr(0, window).find('\n', scanned_);
        if (end == std::string_view::npos) {
            scanned_ = window;
            return 0;
        }
        scanned_ = end + 1;
        const std::string_view line = bytes.substr(line_start_, scanned_ - line_start_);
        if (header_bytes_ == 0 || line == "\r\n" || line == "\n") {
            // The request line (the parser has taken none of the header), or the empty line that
            // ends the fields. After a line ended by a bare LF Beast looks at one more byte
            // before it refuses the line: it gets the same one however the bytes came.
            if (line.ends_with("\r\n")) {
                return scanned_;
            }
            if (scanned_ < window) {
                return scanned_ + 1;
            }
            scanned_ = line_start_;  // Searched again with the next byte.
            return 0;
        }
        line_start_ = scanned_;
    }
    return 0;
}

boost::system::error_code RequestReadPhase::at_eof(RequestParser& parser) {
    if (!parser.got_some()) {
        // The parser was given nothing: not even a whole request line came (Beast asserts that
        // it got some before put_eof).
        return http::make_error_code(http::error::partial_message);
    }
    boost::system::error_code ec;
    parser.put_eof(ec);
    return ec ? ec : http::make_error_code(http::error::partial_message);
}

std::pair<std::string_view, std::string_view> request_line_parts(std::string_view unparsed) {
    const size_t end = unparsed.find('\n');
    if (end == std::string_view::npos) {
        return {};
    }
    const std::string_view line = unparsed.substr(0, end);
    const size_t first = line.find(' ');
    const size_t second = first == std::string_view::npos ? first : line.find(' ', first + 1);
    if (first == 0 || second == std::string_view::npos || second == first + 1) {
        return {};
    }
    return {line.substr(0, first), line.substr(first + 1, second - first - 1)};
}

FramingError check_transfer_encoding(const http::request_header<>& head) {
    std::vector<std::string_view> codings;
    bool present = false;
    const auto [first, last] = head.equal_range(http::field::transfer_encoding);
    for (auto field = first; field != last; ++field) {
        present = true;
        std::string_view value = field->value();
        while (!value.empty()) {
            const size_t comma = value.find(',');
            std::string_view coding = value.substr(0, comma);
            value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
            while (!coding.empty() && (coding.front() == ' ' || coding.front() == '\t')) {
                coding.remove_prefix(1);
            }
            while (!coding.empty() && (coding.back() == ' ' || coding.back() == '\t')) {
                coding.remove_suffix(1);
            }
            if (!coding.empty()) {
                codings.push_back(coding);
            }
        }
    }
    if (!present) {
        return {};
    }
    if (head.version() < 11) {
        return {400, "Transfer-Encoding in an HTTP/1.0 request"};
    }
    if (head.find(http::field::content_length) != head.end()) {
        return {400, "both Transfer-Encoding and Content-Length in the request"};
    }
    if (codings.empty() || !beast::iequals(codings.back(), "chunked")) {
        return {400, "Transfer-Encoding whose final coding is not chunked"};
    }
    if (codings.size() > 1) {
        return {501, "Transfer-Encoding other than chunked is not supported"};
    }
    return {};
}

FramingError check_request_target(std::string_view method, std::string_view target) {
    if (method == "CONNECT") {
        return {501,
                "CONNECT is not supported by this server: it is not a proxy and opens no "
                "tunnels"};
    }
    if (target == "*" && method != "OPTIONS") {
        return {400, "asterisk-form request target (*) is only valid for OPTIONS"};
    }
    return {};
}

FramingError header_phase_error(const boost::system::error_code& ec, const RequestParser& parser,
                                std::string_view unparsed, size_t max_header_bytes) {
    if (ec == http::error::header_limit) {
        // The request line alone passed the limit: a target too long (RFC 9112 section 3). The
        // parser gets the line only once whole (RequestReadPhase), so the line's end is looked
        // for in what is unparsed.
        const size_t line_end = unparsed.find('\n');
        if (parser.get().target().empty() &&
            (line_end == std::string_view::npos || line_end >= max_header_bytes)) {
            return {414, "request target too long"};
        }
        return {431, "request header fields too large"};
    }
    if (ec == http::error::body_limit) {
        return {413, "request body too large"};
    }
    if (ec == http::error::bad_version) {
        // "HTTP/1.1" ended by a bare LF is a malformed line, not another version (RFC 9112
        // section 2.2 lets a server refuse the LF alone).
        const std::string_view line = unparsed.substr(0, unparsed.find('\n'));
        if (line.size() < unparsed.size() &&
            (line.ends_with(" HTTP/1.1") || line.ends_with(" HTTP/1.0"))) {
            return {400, "malformed request line: lines end with CRLF"};
        }
        return {505, "HTTP version not supported: this server speaks HTTP/1.0 and 1.1"};
    }
    if (ec && ec != http::error::partial_message &&
        ec.category() == http::make_error_code(http::error::bad_method).category()) {
        return {400, parse_error_message(ec, parser.get(), false)};
    }
    return {};
}

FramingError check_request_head(const http::request_header<>& head) {
    if (head.version() != 10 && head.version() != 11) {
        return {505, "HTTP version not supported: this server speaks HTTP/1.0 and 1.1"};
    }
    if (head.version() == 11 && head.count(http::field::host) != 1) {
        // RFC 9112 section 3.2: an HTTP/1.1 request has exactly one Host.
        return {400, "an HTTP/1.1 request needs exactly one Host header"};
    }
    if (head.method() == http::verb::unknown) {
        // A method Beast does not know at all (GET, POST, PUT, PROPFIND, ... it does: those get
        // the handler's 404 or 405).
        return {501, "method not implemented"};
    }
    if (auto form = check_request_target(head.method_string(), head.target()); form.status != 0) {
        return form;
    }
    // The body's length is unknown or not ours to trust: the answer closes the connection, so
    // that no byte of it is read as the next request (RFC 9112 section 6.1 and 6.3).
    return check_transfer_encoding(head);
}

FramingError body_phase_error(const boost::system::error_code& ec,
                              const http::request_header<>& head) {
    if (ec == http::error::header_limit) {
        return {400, "chunk size line or trailer section too long"};
    }
    if (ec == http::error::body_limit) {
        return {413, "request body too large"};
    }
    if (ec && ec != http::error::partial_message &&
        ec.category() == http::make_error_code(http::error::bad_method).category()) {
        return {400, parse_error_message(ec, head, true)};
    }
    return {};
}

namespace {

// The text of a Beast parse error, by where it came: `body_text` for one in the body (a chunk
// or the trailer), where it differs from the header's `text`.
struct ParseErrorText {
    http::error code;
    std::string_view text;
    std::string_view body_text = {};  // Empty: `text` wherever it came.
};

constexpr std::array kParseErrorTexts{
    ParseErrorText{http::error::bad_content_length,
                   "invalid Content-Length: not a decimal number of bytes"},
    ParseErrorText{http::error::multiple_content_length, "conflicting Content-Length values"},
    ParseErrorText{http::error::bad_transfer_encoding,
                   "Transfer-Encoding after chunked: chunked must be the final coding, once"},
    ParseErrorText{http::error::bad_field,
                   "malformed header field name (no whitespace is allowed before the colon)",
                   "malformed trailer field name"},
    ParseErrorText{http::error::bad_value,
                   "malformed header field value (a control character or a bare CR)",
                   "malformed trailer field value"},
    ParseErrorText{http::error::bad_line_ending, "malformed line ending: lines end with CRLF"},
    ParseErrorText{http::error::bad_method, "malformed request method"},
    ParseErrorText{http::error::bad_target, "malformed request target"},
    ParseErrorText{http::error::bad_chunk,
                   "malformed chunk: the size line is not a hexadecimal size that fits, or the "
                   "data is not followed by CRLF"},
    ParseErrorText{http::error::bad_chunk_extension, "malformed chunk extension"},
};

}  // namespace

std::string_view parse_error_message(const boost::system::error_code& ec,
                                     const http::request_header<>& head, bool in_body) {
    // Request smuggling (RFC 9112 section 6.3): Beast refuses the second of the two framing
    // fields, whichever came first; the answer names both.
    const bool content_length = head.find(http::field::content_length) != head.end();
    const bool transfer_encoding = head.find(http::field::transfer_encoding) != head.end();
    if ((ec == http::error::bad_content_length && transfer_encoding) ||
        (ec == http::error::bad_transfer_encoding && content_length)) {
        return "both Transfer-Encoding and Content-Length in the request";
    }
    for (const ParseErrorText& entry : kParseErrorTexts) {
        if (ec == entry.code) {
            return in_body && !entry.body_text.empty() ? entry.body_text : entry.text;
        }
    }
    return in_body ? "malformed HTTP request body" : "malformed HTTP request";
}

std::string error_body(std::string_view message) {
    std::string body = R"({"error":{"message":")";
    body += message;  // Fixed texts only: no escaping needed.
    body += R"(","type":"invalid_request_error","param":null,"code":null}})";
    return body;
}

void format_head(std::string& out, const HttpResponse& response, int version, bool keep_alive,
                 std::optional<size_t> content_length) {
    out += version >= 11 ? "HTTP/1.1 " : "HTTP/1.0 ";
    char number[24];
    auto [end, ec] = std::to_chars(number, number + sizeof(number), response.status);
    out.append(number, end);
    out += ' ';
    out += reason_phrase(response.status);
    out += "\r\nContent-Type: ";
    out += response.content_type;
    out += "\r\n";
    for (const HttpHeader& h : response.headers) {
        out += h.name;
        out += ": ";
        out += h.value;
        out += "\r\n";
    }
    if (content_length) {
        out += "Content-Length: ";
        end = std::to_chars(number, number + sizeof(number), *content_length).ptr;
        out.append(number, end);
        out += "\r\n";
    } else if (version >= 11) {
        out += "Transfer-Encoding: chunked\r\n";
    }
    if (!keep_alive) {
        out += "Connection: close\r\n";
    } else if (version < 11) {
        out += "Connection: keep-alive\r\n";
    }
    out += "\r\n";
}

}  // namespace edge::tls
