#include "tls/http_request_parser.h"

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

namespace edge::tls {

namespace http = boost::beast::http;

Result<HttpRequest> parse_http_request(std::string_view bytes, const HttpLimits& limits) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<uint32_t>(limits.max_header_bytes));
    parser.body_limit(limits.max_body_bytes);
    parser.eager(true);
    boost::system::error_code ec;
    size_t used = 0;
    while (used < bytes.size() && !parser.is_done()) {
        size_t n = parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
        if (ec == http::error::need_more) {
            ec = {};
            break;
        }
        if (ec) {
            break;
        }
        if (n == 0) {
            break;
        }
        used += n;
    }
    if (ec == http::error::header_limit || ec == http::error::body_limit) {
        return resource_exhausted_error("HTTP request exceeds limits: " + ec.message());
    }
    if (ec) {
        return invalid_argument_error("malformed HTTP request: " + ec.message());
    }
    if (!parser.is_done()) {
        return out_of_range_error("HTTP request incomplete after " + std::to_string(bytes.size()) +
                                  " bytes");
    }
    auto& msg = parser.get();
    HttpRequest out;
    out.method = std::string(msg.method_string());
    out.target = std::string(msg.target());
    out.version = msg.version();
    for (const auto& field : msg) {
        out.headers.push_back(HttpHeader{std::string(field.name_string()),
                                         std::string(field.value())});
    }
    out.body = std::move(msg.body());
    return out;
}

}  // namespace edge::tls
