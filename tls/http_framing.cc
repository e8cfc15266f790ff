#include "tls/http_framing.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <boost/asio/error.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <array>
#include <charconv>
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
