#include "tls/http_types.h"

namespace edge::tls {
namespace {

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) {
        return false;
    }
    for (size_t i = 0; i < a.size(); ++i) {
        char x = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] + 32) : a[i];
        char y = b[i] >= 'A' && b[i] <= 'Z' ? static_cast<char>(b[i] + 32) : b[i];
        if (x != y) {
            return false;
        }
    }
    return true;
}

}  // namespace

std::string_view HttpRequest::header(std::string_view name) const {
    for (const HttpHeader& h : headers) {
        if (iequals(h.name, name)) {
            return h.value;
        }
    }
    return {};
}

size_t HttpRequest::header_count(std::string_view name) const {
    size_t n = 0;
    for (const HttpHeader& h : headers) {
        n += iequals(h.name, name) ? 1 : 0;
    }
    return n;
}

std::string_view HttpRequest::path() const {
    std::string_view t = target;
    // The absolute form ("http://host/v1/models", RFC 9112 section 3.2.2), which a server must
    // accept: the path after the authority.
    const size_t scheme = t.find("://");
    if (scheme != std::string_view::npos && t.front() != '/') {
        const std::string_view name = t.substr(0, scheme);
        if (iequals(name, "http") || iequals(name, "https")) {
            const size_t slash = t.find_first_of("/?", scheme + 3);
            t = slash == std::string_view::npos ? std::string_view() : t.substr(slash);
        }
    }
    const size_t q = t.find('?');
    t = q == std::string_view::npos ? t : t.substr(0, q);
    return t.empty() ? std::string_view("/") : t;
}

std::string percent_decode(std::string_view s, bool plus_is_space) {
    const auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') {
            return c - '0';
        }
        if (c >= 'a' && c <= 'f') {
            return c - 'a' + 10;
        }
        if (c >= 'A' && c <= 'F') {
            return c - 'A' + 10;
        }
        return -1;
    };
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
            out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
            i += 2;
        } else if (s[i] == '+' && plus_is_space) {
            out += ' ';
        } else {
            out += s[i];
        }
    }
    return out;
}

std::string_view reason_phrase(int status) {
    switch (status) {
        case 100: return "Continue";
        case 200: return "OK";
        case 204: return "No Content";
        case 400: return "Bad Request";
        case 401: return "Unauthorized";
        case 403: return "Forbidden";
        case 404: return "Not Found";
        case 405: return "Method Not Allowed";
        case 408: return "Request Timeout";
        case 413: return "Payload Too Large";
        case 414: return "URI Too Long";
        case 415: return "Unsupported Media Type";
        case 429: return "Too Many Requests";
        case 431: return "Request Header Fields Too Large";
        case 500: return "Internal Server Error";
        case 501: return "Not Implemented";
        case 503: return "Service Unavailable";
        case 502: return "Bad Gateway";
        case 504: return "Gateway Timeout";
        case 505: return "HTTP Version Not Supported";
        default: return "Unknown";
    }
}

}  // namespace edge::tls
