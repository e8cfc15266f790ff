// The built `edgeserve` binary's command lines, as a user meets them: usage errors (one line
// naming the flag, exit 2, before any model loads), `help COMMAND`, output that cannot be written,
// and the cluster commands against a listener that is not an edgeserve admin listener (one line,
// exit 1). Running sites are in edgeserve_binary_test.cc.

#include <doctest/doctest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/loopback_socket.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_certs.h"

using namespace edge;

namespace {

const std::string kBinary = EDGE_BINARY_DIR "/daemon/edgeserve";
const std::string kModel = EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe";

// A loopback listener that answers every connection with `answer` once the request's head has
// arrived, then closes it: a stand-in for whatever else may listen where --admin points.
class CannedServer {
public:
    explicit CannedServer(std::string answer) : answer_(std::move(answer)) {
        fd_ = testing::bind_loopback(SOCK_STREAM, port_);
        thread_ = std::thread([this] { serve(); });
    }
    ~CannedServer() {
        ::shutdown(fd_, SHUT_RDWR);  // Wakes the blocked accept().
        thread_.join();
        ::close(fd_);
    }
    std::string admin() const { return "127.0.0.1:" + std::to_string(port_); }
    // Connections accepted so far.
    int connections() const { return connections_.load(); }

private:
    void serve() {
        for (;;) {
            const int c = ::accept(fd_, nullptr, nullptr);
            if (c < 0) {
                return;
            }
            ++connections_;
            std::string request;
            char buf[4096];
            while (request.find("\r\n\r\n") == std::string::npos) {
                pollfd p{c, POLLIN, 0};
                const ssize_t n = poll(&p, 1, 5000) == 1 ? ::recv(c, buf, sizeof(buf), 0) : -1;
                if (n <= 0) {
                    break;
                }
                request.append(buf, static_cast<size_t>(n));
            }
            (void)::send(c, answer_.data(), answer_.size(), MSG_NOSIGNAL);
            ::close(c);
        }
    }

    std::string answer_;
    uint16_t port_ = 0;
    int fd_ = -1;
    std::atomic<int> connections_{0};
    std::thread thread_;
};

std::string http_answer(const std::string& status, const std::string& type,
                        const std::string& body) {
    return "HTTP/1.1 " + status + "\r\nContent-Type: " + type +
           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
           body;
}

}  // namespace

TEST_CASE("subcommands: a usage error is one line naming the flag, exit 2, nothing run") {
    testing::TempDir dir;
    const std::string out = dir.file("out");
    struct Case {
        std::vector<std::string> args;  // After the binary; the first is the subcommand.
        std::string needle;
    };
    const std::vector<Case> cases = {
        {{"make-model", "--preset", "huge", "--out", out}, "--preset 'huge'"},
        {{"make-model", "--arch", "llama", "--preset", "tiny", "--out", out}, "--arch 'llama'"},
        {{"make-model", "--out", out}, "missing --preset"},
        {{"make-model", "--preset", "tiny"}, "missing --out"},
        {{"make-model", "--preset"}, "missing the value of --preset"},
        {{"make-model", "--preset", "tiny", "--out", out, "extra"}, "unexpected argument 'extra'"},
        {{"quantize", "--model", kModel, "--policy", "int8", "--out", out}, "--policy"},
        {{"quantize", "--model", kModel, "--policy", "all-int8", "--out", out, "junk"},
         "unknown argument 'junk'"},
        {{"quantize", "--model", kModel, "--policy", "all-int8", "--out", out, "--threads"},
         "missing the value of --threads"},
        {{"quantize", "--model", kModel, "--policy", "all-int8", "--out", out, "--shard-size",
          "1.5GB"},
         "--shard-size '1.5GB'"},
        {{"quantize", "--model", kModel, "--out", out}, "missing --policy"},
        {{"quant-eval", "--model", kModel, "--policies", "all-int8,bogus"}, "--policies"},
        {{"quant-eval", "--model", kModel, "--policies", "all-int8", "--tokens", "1"}, "--tokens"},
        {{"quant-eval", "--model", kModel, "--policies", "all-int8", "junk"},
         "unknown argument 'junk'"},
        {{"generate", "--model", kModel, "--prompt", "x", "--max-tokens", "-1"}, "--max-tokens"},
        {{"generate", "--model", kModel, "--prompt", "x", "--temperature", "nan"}, "--temperature"},
        {{"generate", "--model", kModel, "--prompt", "x", "junk"}, "unexpected argument 'junk'"},
        // A flag given twice: which one was meant? Not the last one, silently.
        {{"make-model", "--preset", "tiny", "--preset", "bench", "--out", out},
         "--preset given twice"},
        {{"make-model", "--preset", "tiny", "--out", out, "--force", "--force"},
         "--force given twice"},
        {{"quantize", "--model", kModel, "--policy", "all-int8", "--out", out, "--out", out,
          "--force"},
         "--out given twice"},
        {{"quant-eval", "--model", kModel, "--model", kModel, "--policies", "all-int8"},
         "--model given twice"},
        {{"quant-eval", "--model", kModel, "--policies", "all-int8", "--policies", "all-fp8"},
         "--policies given twice"},
        {{"generate", "--model", kModel, "--model", kModel, "--prompt", "x"},
         "--model given twice"},
        {{"run", "--config", out, "--config", out}, "--config given twice"},
        {{"check-config", "--no-files", "--no-files", out}, "--no-files given twice"},
    };
    for (const Case& c : cases) {
        std::vector<std::string> argv = {kBinary};
        argv.insert(argv.end(), c.args.begin(), c.args.end());
        const auto r = testing::run(argv);
        const std::string& command = c.args.front();
        const std::string first_line = r.err.substr(0, r.err.find('\n'));
        CHECK_MESSAGE(r.exit_code == 2, command << " " << c.needle << ": " << r.err);
        CHECK_MESSAGE(first_line.find("edgeserve " + command + ": ") == 0, r.err);
        CHECK_MESSAGE(first_line.find(c.needle) != std::string::npos, c.needle << ": " << r.err);
        CHECK_MESSAGE(r.err.find("usage: edgeserve " + command) != std::string::npos, r.err);
        CHECK(r.out.empty());
        // Refused before any work: no model loaded, no output directory made.
        CHECK_MESSAGE(r.err.find("model_ready") == std::string::npos, r.err);
        CHECK_FALSE(std::filesystem::exists(out));
    }
}

TEST_CASE("engine subcommands: --help and `help COMMAND` print the command's usage on stdout") {
    for (const char* cmd : {"generate", "make-model", "quantize", "quant-eval", "members"}) {
        for (const std::vector<std::string>& args :
             {std::vector<std::string>{cmd, "--help"}, std::vector<std::string>{"help", cmd}}) {
            std::vector<std::string> argv = {kBinary};
            argv.insert(argv.end(), args.begin(), args.end());
            const auto r = testing::run(argv);
            CHECK_MESSAGE(r.exit_code == 0, args[0] << " " << args[1] << ": " << r.err);
            CHECK_MESSAGE(r.out.find(std::string("usage: edgeserve ") + cmd) == 0,
                          args[0] << " " << args[1] << ": " << r.out);
        }
    }
    const auto unknown = testing::run({kBinary, "help", "frobnicate"});
    CHECK(unknown.exit_code == 2);
    CHECK(unknown.err.find("edgeserve: unknown command 'frobnicate'") == 0);
}

TEST_CASE("output lost to a full disk is a failure, named on stderr, not a silent 0") {
    REQUIRE(std::filesystem::exists("/dev/full"));
    for (const std::string args : {"--version", "help generate", "quantize --help"}) {
        const auto r =
            testing::run({"/bin/sh", "-c", "exec " + kBinary + " " + args + " >/dev/full"});
        CHECK_MESSAGE(r.exit_code == 1, args << ": " << r.err);
        CHECK_MESSAGE(
            r.err == "edgeserve: cannot write to standard output: No space left on device\n",
            args << ": " << r.err);
    }
}

TEST_CASE("quantize --threads 0 is one thread per core, as for generate and quant-eval") {
    testing::TempDir dir;
    const auto r = testing::run({kBinary, "quantize", "--model", kModel, "--policy", "all-int8",
                                 "--out", dir.file("q"), "--threads", "0"},
                                60'000);
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(std::filesystem::exists(dir.file("q") + "/config.json"));
}

TEST_CASE("edgeserve --help names every flag of every command's own --help") {
    const auto top = testing::run({kBinary, "--help"});
    REQUIRE(top.exit_code == 0);
    const std::regex flag("--[a-z][a-z-]*");
    for (const std::string cmd : {"run", "check-config", "generate", "make-model", "quantize",
                                  "quant-eval", "members", "pools", "route", "rollout"}) {
        const auto own = testing::run({kBinary, cmd, "--help"});
        REQUIRE_MESSAGE(own.exit_code == 0, cmd << ": " << own.err);
        std::set<std::string> flags;
        for (std::sregex_iterator it(own.out.begin(), own.out.end(), flag), end; it != end;
             ++it) {
            flags.insert(it->str());
        }
        for (const std::string& f : flags) {
            CHECK_MESSAGE(top.out.find(f) != std::string::npos,
                          "edgeserve --help does not name " << cmd << " " << f);
        }
    }
}

TEST_CASE("cluster subcommands: a flag given twice, or an empty --token-file, sends nothing") {
    CannedServer server(http_answer("200 OK", "application/json", "{\"ltime\":1}\n"));
    struct Case {
        std::vector<std::string> args;
        std::string error;  // The first line on stderr.
    };
    const std::vector<Case> cases = {
        {{"rollout", "--model", "prod-model", "--version", "abc", "--model", "test-model"},
         "edgeserve rollout: --model given twice"},
        {{"rollout", "--model", "m", "--version", "a", "--version", "b"},
         "edgeserve rollout: --version given twice"},
        {{"route", "--model", "m", "--json", "--json"}, "edgeserve route: --json given twice"},
        {{"members", "--admin", server.admin(), "--admin", server.admin()},
         "edgeserve members: --admin given twice"},
        // Not a fall back to EDGESERVE_ADMIN_TOKEN_FILE, or to no token, as if it were not given.
        {{"members", "--token-file", ""}, "edgeserve members: --token-file: empty"},
        {{"pools", "--token-file", "a", "--token-file", "b"},
         "edgeserve pools: --token-file given twice"},
    };
    for (const Case& c : cases) {
        std::vector<std::string> argv = {kBinary};
        argv.insert(argv.end(), c.args.begin(), c.args.end());
        if (c.args[1] != "--admin") {
            argv.insert(argv.end(), {"--admin", server.admin()});
        }
        const auto r = testing::run(argv);
        CHECK_MESSAGE(r.exit_code == 2, c.error << ": " << r.err);
        CHECK_MESSAGE(r.err.find(c.error) == 0, c.error << ": " << r.err);
        CHECK_MESSAGE(r.err.find("\nusage: edgeserve " + c.args[0]) != std::string::npos, r.err);
        CHECK(r.out.empty());
    }
    CHECK(server.connections() == 0);
    // The same rollout with each flag once is sent: the server above does answer.
    const auto once = testing::run({kBinary, "rollout", "--model", "prod-model", "--version", "abc",
                                    "--admin", server.admin()});
    CHECK_MESSAGE(once.exit_code == 0, once.err);
    CHECK(server.connections() == 1);
}

TEST_CASE("cluster subcommands: a malformed --admin is a usage error naming it") {
    for (const char* admin : {"127.0.0.1", "127.0.0.1:99999", ":9443", "host:port"}) {
        const auto r = testing::run({kBinary, "members", "--admin", admin});
        CHECK_MESSAGE(r.exit_code == 2, admin << ": " << r.err);
        CHECK_MESSAGE(r.err.find("edgeserve members: --admin: ") == 0, admin << ": " << r.err);
    }
    const auto route = testing::run({kBinary, "route", "--model", "m", "--admin", "nohost"});
    CHECK(route.exit_code == 2);
    CHECK_MESSAGE(route.err.find("edgeserve route: --admin: ") == 0, route.err);
}

TEST_CASE("cluster subcommands: what another server answers is one line on stderr, exit 1") {
    const std::string page =
        "<!DOCTYPE HTML>\n<html lang=\"en\">\n<head><title>Error response</title></head>\n"
        "<body><h1>Error response</h1><p>Error code: 404</p></body>\n</html>\n";
    struct Case {
        std::string answer;
        std::vector<std::string> args;
        std::string expect;  // In the one line on stderr.
    };
    const std::vector<Case> cases = {
        // Another web server: not mistaken for a site without a `gossip` section.
        {http_answer("404 Not Found", "text/html", page),
         {"members"},
         "(GET /admin/members, HTTP 404): not an edgeserve admin answer (a page: <!DOCTYPE"},
        {http_answer("501 Not Implemented", "text/html", page),
         {"rollout", "--model", "m", "--version", "v"},
         "(POST /admin/rollout, HTTP 501): not an edgeserve admin answer"},
        {http_answer("502 Bad Gateway", "text/plain", ""),
         {"pools"},
         "(GET /admin/pools, HTTP 502): not an edgeserve admin answer (an empty body)"},
        // The cluster's errors are JSON: their message, not the JSON.
        {http_answer("409 Conflict", "application/json",
                     "{\"error\":\"rollout not taken: this site holds v1\"}\n"),
         {"rollout", "--model", "m", "--version", "v"},
         "(POST /admin/rollout, HTTP 409): rollout not taken: this site holds v1"},
        // The admin listener's own text answers, as they are.
        {http_answer("503 Service Unavailable", "text/plain",
                     "unavailable: the change was not confirmed\n"),
         {"route", "--model", "m"},
         "(GET /admin/route, HTTP 503): unavailable: the change was not confirmed"},
        // Not HTTP at all (another protocol, or TLS).
        {"SSH-2.0-OpenSSH_9.0\r\n", {"members"}, "(no HTTP answer: is 127.0.0.1:"},
    };
    for (const Case& c : cases) {
        CannedServer server(c.answer);
        std::vector<std::string> argv = {kBinary};
        argv.insert(argv.end(), c.args.begin(), c.args.end());
        argv.insert(argv.end(), {"--admin", server.admin()});
        const auto r = testing::run(argv);
        CHECK_MESSAGE(r.exit_code == 1, c.expect << ": " << r.err);
        CHECK(r.out.empty());
        CHECK_MESSAGE(std::count(r.err.begin(), r.err.end(), '\n') == 1, r.err);
        CHECK_MESSAGE(r.err.find("edgeserve: ") == 0, r.err);
        CHECK_MESSAGE(r.err.find(c.expect) != std::string::npos, c.expect << ": " << r.err);
        CHECK_MESSAGE(r.err.find("`gossip` section") == std::string::npos, r.err);
    }
}
