#include "daemon/cluster/cli.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include <cstdio>
#include <cstring>
#include <string_view>

#include "routing/membership/membership_service.h"

namespace edge::daemon::cluster {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

Result<AdminAnswer> admin_request(const std::string& admin, const std::string& method,
                                  const std::string& target) {
    EDGE_ASSIGN_OR_RETURN(auto hp, routing::membership::split_host_port(admin));
    try {
        net::io_context io;
        tcp::resolver resolver(io);
        beast::tcp_stream stream(io);
        stream.expires_after(std::chrono::seconds(5));
        boost::system::error_code ec;
        auto endpoints = resolver.resolve(hp.first, std::to_string(hp.second), ec);
        if (ec) {
            return unavailable_error("cannot resolve " + admin + ": " + ec.message());
        }
        stream.connect(endpoints, ec);
        if (ec) {
            return unavailable_error("cannot connect to the admin listener at " + admin + ": " +
                                     ec.message());
        }
        http::request<http::empty_body> req{http::string_to_verb(method), target, 11};
        req.set(http::field::host, admin);
        req.keep_alive(false);
        req.prepare_payload();
        http::write(stream, req, ec);
        beast::flat_buffer buf;
        http::response<http::string_body> res;
        if (!ec) {
            http::read(stream, buf, res, ec);
        }
        if (ec) {
            return unavailable_error("admin request to " + admin + target + " failed: " +
                                     ec.message());
        }
        return AdminAnswer{static_cast<int>(res.result_int()), res.body()};
    } catch (const std::exception& e) {
        return unavailable_error(std::string("admin request failed: ") + e.what());
    }
}

namespace {

std::string url_encode(std::string_view s) {
    static const char* kHex = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : s) {
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == ':') {
            out += static_cast<char>(c);
        } else {
            out += '%';
            out += kHex[c >> 4];
            out += kHex[c & 15];
        }
    }
    return out;
}

struct Args {
    std::string admin = "127.0.0.1:9443";
    std::string model;
    std::string version;
    bool json = false;
};

// Parses the shared flags; `want_model`/`want_version` enable --model/--version.
bool parse_args(int argc, char** argv, bool want_model, bool want_version, Args& a) {
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--admin" && i + 1 < argc) {
            a.admin = argv[++i];
        } else if (arg == "--json") {
            a.json = true;
        } else if (want_model && arg == "--model" && i + 1 < argc) {
            a.model = argv[++i];
        } else if (want_version && arg == "--version" && i + 1 < argc) {
            a.version = argv[++i];
        } else {
            return false;
        }
    }
    return true;
}

int run(const Args& a, const std::string& method, std::string target) {
    if (!a.json) {
        target += (target.find('?') == std::string::npos ? "?" : "&") + std::string("format=text");
    }
    Result<AdminAnswer> r = admin_request(a.admin, method, target);
    if (!r.ok()) {
        std::fprintf(stderr, "edgeserve: %s\n", r.status().message().c_str());
        return 1;
    }
    std::fputs(r->body.c_str(), r->status == 200 ? stdout : stderr);
    return r->status == 200 ? 0 : 1;
}

}  // namespace

int members_main(int argc, char** argv) {
    Args a;
    if (!parse_args(argc, argv, false, false, a)) {
        std::fprintf(stderr, "usage: edgeserve members [--admin HOST:PORT] [--json]\n");
        return 2;
    }
    return run(a, "GET", "/admin/members");
}

int pools_main(int argc, char** argv) {
    Args a;
    if (!parse_args(argc, argv, false, false, a)) {
        std::fprintf(stderr, "usage: edgeserve pools [--admin HOST:PORT] [--json]\n");
        return 2;
    }
    return run(a, "GET", "/admin/pools");
}

int route_main(int argc, char** argv) {
    Args a;
    if (!parse_args(argc, argv, true, true, a) || a.model.empty()) {
        std::fprintf(stderr, "usage: edgeserve route --model M [--version DIGEST] "
                             "[--admin HOST:PORT] [--json]\n");
        return 2;
    }
    std::string target = "/admin/route?model=" + url_encode(a.model);
    if (!a.version.empty()) {
        target += "&version=" + url_encode(a.version);
    }
    return run(a, "GET", target);
}

int rollout_main(int argc, char** argv) {
    Args a;
    if (!parse_args(argc, argv, true, true, a) || a.model.empty() || a.version.empty()) {
        std::fprintf(stderr, "usage: edgeserve rollout --model M --version DIGEST "
                             "[--admin HOST:PORT]\n");
        return 2;
    }
    a.json = true;
    return run(a, "POST",
               "/admin/rollout?model=" + url_encode(a.model) + "&version=" + url_encode(a.version));
}

}  // namespace edge::daemon::cluster
