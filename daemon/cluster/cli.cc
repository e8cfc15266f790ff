#include "daemon/cluster/cli.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "common/cli_flags.h"
#include "daemon/admin_server.h"
#include "routing/membership/membership_service.h"

namespace edge::daemon::cluster {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// The whole exchange (connect, request, answer) has this long: a listener that accepts and never
// answers must not hang the command.
constexpr auto kAdminDeadline = std::chrono::seconds(5);

Result<AdminAnswer> admin_request(const std::string& admin, const std::string& method,
                                  const std::string& target, const std::string& token) {
    EDGE_ASSIGN_OR_RETURN(auto hp, routing::membership::split_host_port(admin));
    try {
        net::io_context io;
        tcp::resolver resolver(io);
        boost::system::error_code ec;
        auto endpoints = resolver.resolve(hp.first, std::to_string(hp.second), ec);
        if (ec) {
            return unavailable_error("cannot resolve " + admin + ": " + ec.message());
        }
        // Asynchronous, so the stream's deadline applies (blocking calls have none).
        beast::tcp_stream stream(io);
        stream.expires_after(kAdminDeadline);
        http::request<http::empty_body> req{http::string_to_verb(method), target, 11};
        req.set(http::field::host, admin);
        if (!token.empty()) {
            req.set(http::field::authorization, "Bearer " + token);
        }
        req.keep_alive(false);
        req.prepare_payload();
        beast::flat_buffer buf;
        http::response<http::string_body> res;
        std::string failed;  // What failed ("" when the answer came).
        bool done = false;
        // Named without the query: the flags it came from are the user's own.
        const std::string request =
            "admin request to " + admin + target.substr(0, target.find('?'));
        stream.async_connect(endpoints, [&](boost::system::error_code cec, const auto&) {
            if (cec) {
                failed = "cannot connect to the admin listener at " + admin + ": " + cec.message();
                done = true;
                return;
            }
            http::async_write(stream, req, [&](boost::system::error_code wec, size_t) {
                if (wec) {
                    failed = request + " failed: " + wec.message();
                    done = true;
                    return;
                }
                http::async_read(stream, buf, res, [&](boost::system::error_code rec, size_t) {
                    if (rec == beast::error::timeout) {
                        failed = request + " failed: " + rec.message() + " (no answer within " +
                                 std::to_string(kAdminDeadline.count()) + " s)";
                    } else if (rec) {
                        // A TLS listener or another protocol on that port, or a listener that
                        // closed the connection (stopping): no HTTP answer.
                        failed = request + " failed: " + rec.message() +
                                 " (no HTTP answer: is " + admin +
                                 " the site's admin listener, listeners.admin? It speaks plain "
                                 "HTTP)";
                    }
                    done = true;
                });
            });
        });
        io.run();  // Ends with the exchange: its last handler runs, or the deadline closes it.
        if (!done) {
            failed = request + ": no answer";
        }
        if (!failed.empty()) {
            return unavailable_error(failed);
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
    std::string token_file;
    std::string model;
    std::string version;
    bool json = false;
    bool help = false;
};

// Parses the shared flags; `want_model`/`want_version` enable --model/--version. Returns what
// was wrong ("" when nothing was).
std::string parse_args(int argc, char** argv, bool want_model, bool want_version, Args& a) {
    SeenFlags seen;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        std::string* value = nullptr;
        if (arg == "--help" || arg == "-h") {
            a.help = true;
            return "";
        }
        if (std::string twice = seen.repeated(arg); !twice.empty()) {
            return twice;
        }
        if (arg == "--json") {
            a.json = true;
            continue;
        } else if (arg == "--admin") {
            value = &a.admin;
        } else if (arg == "--token-file") {
            value = &a.token_file;
        } else if (want_model && arg == "--model") {
            value = &a.model;
        } else if (want_version && arg == "--version") {
            value = &a.version;
        } else {
            return "unexpected argument '" + std::string(arg) + "'";
        }
        if (i + 1 >= argc) {
            return "missing the value of " + std::string(arg);
        }
        *value = argv[++i];
        // An empty FILE would fall back to EDGESERVE_ADMIN_TOKEN_FILE, or to no token, unasked.
        if (value == &a.token_file && value->empty()) {
            return "--token-file: empty (give the FILE listeners.admin.token_file names)";
        }
    }
    // A malformed address is the user's mistake (exit 2), not a site that cannot be reached.
    if (Result<std::pair<std::string, uint16_t>> hp = routing::membership::split_host_port(a.admin);
        !hp.ok()) {
        return "--admin: " + hp.status().message() + " (give HOST:PORT, e.g. 127.0.0.1:9443)";
    }
    return "";
}

// `text` with its control characters (line breaks, escapes) as '?': what a server sent, printed
// on one line of the terminal.
std::string printable(std::string_view text) {
    std::string out;
    for (unsigned char c : text) {
        out += c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c);
    }
    return out;
}

// One line for an answer other than 200 from `admin` to `method path`: the cluster's JSON error,
// the admin listener's own text, or whatever another kind of server sent.
std::string failure_line(const std::string& admin, const std::string& method,
                         const std::string& path, const AdminAnswer& r, bool sent_token) {
    const std::string where =
        admin + " (" + method + " " + path + ", HTTP " + std::to_string(r.status) + ")";
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(r.body, ec);
    if (!ec && v.is_object()) {
        // The cluster's errors: {"error": "..."}.
        if (const boost::json::value* e = v.as_object().if_contains("error");
            e != nullptr && e->is_string()) {
            return where + ": " + printable(e->as_string());
        }
    }
    // The admin listener's own answer: it serves /admin/* only with a `gossip` section.
    if ((r.status == 404 && r.body == "not found\n") ||
        (r.status == 405 && r.body == "method not allowed\n")) {
        return "the site at " + admin + " does not serve " + path + " (HTTP " +
               std::to_string(r.status) +
               "): it has no `gossip` section, so it runs alone and has no cluster to show or "
               "change";
    }
    if (r.status == 401 && !sent_token) {
        return "the site at " + admin +
               " wants its admin token: pass --token-file FILE (the file its "
               "listeners.admin.token_file names) or set EDGESERVE_ADMIN_TOKEN_FILE";
    }
    // The admin listener's other answers are one line of text ("unauthorized: ...",
    // "unavailable: ..."); a page (HTML) or nothing comes from another kind of server.
    const std::string line =
        printable(std::string_view(r.body).substr(0, std::min(r.body.find('\n'), size_t{200})));
    if (line.empty() || line.front() == '<') {
        return where + ": not an edgeserve admin answer (" +
               (line.empty() ? std::string("an empty body") : "a page: " + line) +
               "); --admin names the site's admin listener (listeners.admin)";
    }
    return where + ": " + line;
}

// Prints `usage` (to stdout for --help, exit 0; else after the error to stderr, exit 2), or
// returns -1 when the arguments are fine.
int usage_exit(const char* command, const std::string& wrong, const Args& a, const char* usage) {
    if (a.help) {
        std::printf("usage: edgeserve %s %s\n", command, usage);
        return 0;
    }
    if (!wrong.empty()) {
        std::fprintf(stderr, "edgeserve %s: %s\nusage: edgeserve %s %s\n", command, wrong.c_str(),
                     command, usage);
        return 2;
    }
    return -1;
}

int run(const Args& a, const std::string& method, std::string target) {
    if (!a.json) {
        target += (target.find('?') == std::string::npos ? "?" : "&") + std::string("format=text");
    }
    std::string token_file = a.token_file;
    if (const char* env = std::getenv("EDGESERVE_ADMIN_TOKEN_FILE");
        token_file.empty() && env != nullptr) {
        token_file = env;
    }
    std::string token;
    if (!token_file.empty()) {
        Result<std::string> read = read_admin_token(token_file);
        if (!read.ok()) {
            std::fprintf(stderr, "edgeserve: admin token: %s\n", read.status().message().c_str());
            return 1;
        }
        token = std::move(read).value();
    }
    Result<AdminAnswer> r = admin_request(a.admin, method, target, token);
    if (!r.ok()) {
        std::fprintf(stderr, "edgeserve: %s\n", r.status().message().c_str());
        return 1;
    }
    if (r->status != 200) {
        const std::string path = target.substr(0, target.find('?'));
        const std::string line = failure_line(a.admin, method, path, *r, !token.empty());
        std::fprintf(stderr, "edgeserve: %s\n", line.c_str());
        return 1;
    }
    std::fputs(r->body.c_str(), stdout);
    return 0;
}

}  // namespace

int members_main(int argc, char** argv) {
    Args a;
    const std::string wrong = parse_args(argc, argv, false, false, a);
    if (int rc =
            usage_exit("members", wrong, a, "[--admin HOST:PORT] [--token-file FILE] [--json]");
        rc >= 0) {
        return rc;
    }
    return run(a, "GET", "/admin/members");
}

int pools_main(int argc, char** argv) {
    Args a;
    const std::string wrong = parse_args(argc, argv, false, false, a);
    if (int rc = usage_exit("pools", wrong, a, "[--admin HOST:PORT] [--token-file FILE] [--json]");
        rc >= 0) {
        return rc;
    }
    return run(a, "GET", "/admin/pools");
}

int route_main(int argc, char** argv) {
    Args a;
    std::string wrong = parse_args(argc, argv, true, true, a);
    if (wrong.empty() && a.model.empty()) {
        wrong = "missing --model M";
    }
    if (int rc = usage_exit(
            "route", wrong, a,
            "--model M [--version DIGEST] [--admin HOST:PORT] [--token-file FILE] [--json]");
        rc >= 0) {
        return rc;
    }
    std::string target = "/admin/route?model=" + url_encode(a.model);
    if (!a.version.empty()) {
        target += "&version=" + url_encode(a.version);
    }
    return run(a, "GET", target);
}

int rollout_main(int argc, char** argv) {
    Args a;
    std::string wrong = parse_args(argc, argv, true, true, a);
    if (wrong.empty() && a.model.empty()) {
        wrong = "missing --model M";
    } else if (wrong.empty() && a.version.empty()) {
        wrong = "missing --version DIGEST";
    }
    if (int rc = usage_exit("rollout", wrong, a,
                            "--model M --version DIGEST [--admin HOST:PORT] [--token-file FILE]");
        rc >= 0) {
        return rc;
    }
    a.json = true;
    return run(a, "POST",
               "/admin/rollout?model=" + url_encode(a.model) + "&version=" + url_encode(a.version));
}

}  // namespace edge::daemon::cluster
