// The built `edgeserve` binary: subcommands, check-config, a real run probed with curl and
// openssl s_client, systemd notify (READY/WATCHDOG/RELOADING/STOPPING), SIGHUP, SIGTERM drain.
// The units themselves are checked in tests/package/systemd_units_test.cc.

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "engine/backend.h"
#include "tests/testing/config_yaml.h"
#include "tests/testing/loopback_socket.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;

namespace {

const std::string kBinary = EDGE_BINARY_DIR "/daemon/edgeserve";

// A unix datagram socket standing in for systemd's notify socket.
class NotifySocket {
public:
    explicit NotifySocket(const std::string& path) : path_(path) {
        fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        REQUIRE(path.size() < sizeof(addr.sun_path));
        std::memcpy(addr.sun_path, path.c_str(), path.size());
        REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
        timeval tv{10, 0};
        setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }
    ~NotifySocket() { close(fd_); }
    // Next datagram ("" on timeout).
    std::string receive() {
        char buf[1024];
        ssize_t n = recv(fd_, buf, sizeof(buf), 0);
        return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    }
    // Waits at most `ms` for the next datagram ("" on timeout).
    std::string receive_within(int ms) {
        pollfd p{fd_, POLLIN, 0};
        return poll(&p, 1, ms) == 1 ? receive() : std::string();
    }
    // Receives until a datagram contains `needle`; false on timeout.
    bool expect(const std::string& needle) {
        for (int i = 0; i < 50; ++i) {
            std::string d = receive();
            if (d.empty()) {
                return false;
            }
            if (d.find(needle) != std::string::npos) {
                return true;
            }
        }
        return false;
    }

private:
    std::string path_;
    int fd_ = -1;
};

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

uint16_t port_from_log(const std::string& log, const std::string& key) {
    std::smatch m;
    std::regex re("\"" + key + "\":([0-9]+)");
    REQUIRE_MESSAGE(std::regex_search(log, m, re), log);
    return static_cast<uint16_t>(std::stoi(m[1]));
}

}  // namespace

TEST_CASE("edgeserve --version, --help, unknown and missing subcommands") {
    auto version = testing::run({kBinary, "--version"});
    CHECK(version.exit_code == 0);
    CHECK(version.out.find("edgeserve ") == 0);
    auto help = testing::run({kBinary, "--help"});
    CHECK(help.exit_code == 0);
    CHECK(help.out.find("check-config") != std::string::npos);
    auto unknown = testing::run({kBinary, "frobnicate"});
    CHECK(unknown.exit_code == 2);
    CHECK(unknown.err.find("unknown command 'frobnicate'") != std::string::npos);
    CHECK(testing::run({kBinary}).exit_code == 2);
    CHECK(testing::run({kBinary, "run"}).exit_code == 2);
}

TEST_CASE("edgeserve check-config accepts a good file and names file:line:column of a bad one") {
    testing::TempDir dir;
    testing::make_certificate(dir.path(), "c", {"localhost"});
    std::string good = dir.write("good.yaml", testing::config_yaml("c.crt", "c.key"));
    auto ok = testing::run({kBinary, "check-config", good});
    CHECK_MESSAGE(ok.exit_code == 0, ok.err);
    CHECK(ok.out.find("ok") != std::string::npos);
    std::string bad = dir.write("bad.yaml", testing::config_yaml("c.pem", "k.pem",
                                                                 "limits:\n  max_body: 5\n"));
    auto fail = testing::run({kBinary, "check-config", bad});
    CHECK(fail.exit_code == 1);
    CHECK(fail.err.find(bad + ":18:3: limits.max_body: unknown key") != std::string::npos);
}

TEST_CASE("the example configs in deploy/config pass check-config") {
    testing::TempDir dir;
    for (const auto& entry :
         std::filesystem::directory_iterator(EDGE_SOURCE_DIR "/deploy/config")) {
        if (entry.path().extension() != ".yaml") {
            continue;
        }
        std::string path = entry.path().string();
        if (entry.path().filename() == "single-pop.yaml") {
            // Its tenant's key hash is a placeholder check-config refuses (a real hash there would
            // be of a key every reader knows): checked with the hash of no known key in its place.
            auto shipped = testing::run({kBinary, "check-config", "--no-files", path});
            CHECK(shipped.exit_code == 1);
            CHECK_MESSAGE(shipped.err.find("tenants[0].api_key_sha256[0]: tenant 'acme': expected "
                                           "the key's SHA-256") != std::string::npos,
                          shipped.err);
            const std::string yaml = testing::example_with_key_hash(testing::read_file(path));
            REQUIRE_FALSE(yaml.empty());
            path = dir.write("single-pop.yaml", yaml);
        }
        // The certificates and models they name exist only on a configured host.
        auto r = testing::run({kBinary, "check-config", "--no-files", path});
        CHECK_MESSAGE(r.exit_code == 0, path << ": " << r.err);
    }
}

TEST_CASE("edgeserve run with models but no engine fails with a clear message") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    std::string config = dir.write(
        "c.yaml", testing::config_yaml(cert.cert_path, cert.key_path,
                                       "models:\n  - {name: m, path: " + dir.file("none") + "}\n"));
    auto r = testing::run({kBinary, "run", "--config", config});
    CHECK(r.exit_code == 1);
    // The model directory is checked before any engine is asked to load it.
    CHECK_MESSAGE(r.err.find("edgeserve: " + config + ": models[0] (\"m\", " + dir.file("none") +
                             "): ") != std::string::npos,
                  r.err);
    CHECK(r.err.find("config.json") != std::string::npos);
}

TEST_CASE("edgeserve run finds a port in use before it loads the models, check-config does not") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    // Another process's listener on the admin port.
    uint16_t taken_port = 0;
    const int taken = testing::bind_loopback(SOCK_STREAM, taken_port);
    const std::string port = std::to_string(taken_port);
    std::string yaml = testing::config_yaml(
        cert.cert_path, cert.key_path,
        "models:\n  - {name: m, path: " + std::string(EDGE_SOURCE_DIR) +
            "/tests/fixtures/micro-qwen3-moe}\n");
    const size_t admin = yaml.find("admin:");
    REQUIRE(admin != std::string::npos);
    yaml.replace(yaml.find("port: 0", admin), 7, "port: " + port);
    const std::string config = dir.write("c.yaml", yaml);
    auto r = testing::run({kBinary, "run", "--config", config});
    // check-config runs beside a live daemon, whose ports are taken: not its concern.
    auto checked = testing::run({kBinary, "check-config", config});
    ::close(taken);
    CHECK_MESSAGE(checked.exit_code == 0, checked.err);
    CHECK(r.exit_code == 1);
    CHECK_MESSAGE(r.err.find("edgeserve: " + config + ": listeners.admin.port: cannot listen on " +
                             "127.0.0.1:" + port + ": Address already in use") !=
                      std::string::npos,
                  r.err);
    CHECK_MESSAGE(r.out.find("model_ready") == std::string::npos, r.out);
    CHECK_MESSAGE(r.err.find("model_ready") == std::string::npos, r.err);
}

TEST_CASE("check-config --socket-activated leaves the public port to the inherited socket") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    testing::TestCa ca = testing::make_ca(dir.path(), "ca", "test CA");
    auto site = testing::make_signed_certificate(ca, dir.path(), "site", {"site"});
    // The public port the unit's socket makes unused, equal to another listener's (ExecStartPre
    // checks what `run` with the inherited socket accepts).
    std::string yaml = testing::config_yaml(cert.cert_path, cert.key_path,
                                            "peer:\n  address: 127.0.0.1\n  port: 19651\n  ca: " +
                                                ca.cert_path + "\n  cert: " + site.cert_path +
                                                "\n  key: " + site.key_path + "\n");
    yaml.replace(yaml.find("port: 0"), 7, "port: 19651");
    const std::string config = dir.write("c.yaml", yaml);
    auto plain = testing::run({kBinary, "check-config", config});
    CHECK(plain.exit_code == 1);
    CHECK_MESSAGE(plain.err == config + ": peer.port: port 19651 is also listeners.public.port\n",
                  plain.err);
    auto activated = testing::run({kBinary, "check-config", "--socket-activated", config});
    CHECK_MESSAGE(activated.exit_code == 0, activated.err);
    // The other listeners are still checked against each other.
    yaml.replace(yaml.find("port: 0"), 7, "port: 19651");  // The admin listener's.
    dir.write("c.yaml", yaml);
    activated = testing::run({kBinary, "check-config", "--socket-activated", config});
    CHECK(activated.exit_code == 1);
    CHECK_MESSAGE(
        activated.err == config + ": peer.port: port 19651 is also listeners.admin.port\n",
        activated.err);
    auto help = testing::run({kBinary, "check-config", "--help"});
    CHECK(help.out.find("--socket-activated") != std::string::npos);
}

TEST_CASE("edgeserve run finds gossip's UDP port in use before it loads the models") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    std::string config, port;
    testing::CommandResult r;
    // Another process's UDP socket on the gossip port (its TCP side free: when another test's
    // connection happens to hold that TCP port meanwhile, the daemon names TCP, and the test
    // takes another port).
    for (int attempt = 0; attempt < 5; ++attempt) {
        uint16_t taken_port = 0;
        const int taken = testing::bind_loopback(SOCK_DGRAM, taken_port);
        port = std::to_string(taken_port);
        config = dir.write(
            "c.yaml",
            testing::config_yaml(cert.cert_path, cert.key_path,
                                 "models:\n  - {name: m, path: " + std::string(EDGE_SOURCE_DIR) +
                                     "/tests/fixtures/micro-qwen3-moe}\n"
                                     "gossip:\n  bind_address: 127.0.0.1\n  port: " +
                                     port + "\n"));
        r = testing::run({kBinary, "run", "--config", config});
        ::close(taken);
        if (r.err.find("cannot listen on 127.0.0.1:" + port) == std::string::npos) {
            break;
        }
    }
    CHECK(r.exit_code == 1);
    CHECK_MESSAGE(r.err.find("edgeserve: " + config + ": gossip.port: cannot bind UDP 127.0.0.1:" +
                             port + ": Address already in use") != std::string::npos,
                  r.err);
    CHECK_MESSAGE(r.err.find("model_ready") == std::string::npos, r.err);
}

TEST_CASE("check-config loads what run loads: certificates, ports, model files, keyring") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    auto other = testing::make_certificate(dir.path(), "o", {"other"});
    auto check = [&](const std::string& yaml) {
        std::string path = dir.write("c.yaml", yaml);
        auto r = testing::run({kBinary, "check-config", path});
        CHECK(r.exit_code == (r.err.empty() ? 0 : 1));
        return r.err;
    };
    const std::string c = dir.file("c.yaml");
    CHECK(check(testing::config_yaml(cert.cert_path, cert.key_path)).empty());
    std::string e = check(testing::config_yaml(dir.file("nonexist.crt"), cert.key_path));
    CHECK_MESSAGE(e.find(c + ": listeners.public.certificates[0]: cannot load certificate chain '" +
                         dir.file("nonexist.crt") + "'") == 0,
                  e);
    e = check(testing::config_yaml(cert.cert_path, other.key_path));
    CHECK_MESSAGE(e.find(c + ": listeners.public.certificates[0]: ") == 0, e);
    CHECK(e.find(other.key_path) != std::string::npos);
    // The certificate file is a YAML file, not PEM.
    e = check(testing::config_yaml(c, cert.key_path));
    CHECK_MESSAGE(e.find(c + ": listeners.public.certificates[0]: cannot load certificate") == 0,
                  e);

    std::string same_port = testing::config_yaml(cert.cert_path, cert.key_path);
    same_port.replace(same_port.find("port: 0"), 7, "port: 19650");
    same_port.replace(same_port.find("port: 0"), 7, "port: 19650");
    e = check(same_port);
    CHECK_MESSAGE(e == c + ": listeners.admin.port: port 19650 is also listeners.public.port\n", e);
    // Every way of writing "everywhere" collides with a loopback listener on the same port;
    // loopback in another family does not.
    for (const std::string everywhere : {"\"::\"", "\"::0\"", "\"0:0:0:0:0:0:0:0\"", "0.0.0.0"}) {
        std::string wildcard = same_port;
        wildcard.replace(wildcard.find("address: 127.0.0.1"), 18, "address: " + everywhere);
        e = check(wildcard);
        CHECK_MESSAGE(e == c + ": listeners.admin.port: port 19650 is also listeners.public.port\n",
                      e);
    }
    std::string families = same_port;
    families.replace(families.find("address: 127.0.0.1"), 18, "address: \"::1\"");
    CHECK(check(families).empty());

    e = check(testing::config_yaml(cert.cert_path, cert.key_path,
                                   "peer:\n  ca: /none/ca.pem\n  cert: " + cert.cert_path +
                                       "\n  key: " + cert.key_path + "\n"));
    CHECK_MESSAGE(e.find(c + ": peer: ") == 0, e);
    CHECK(e.find("/none/ca.pem") != std::string::npos);

    e = check(testing::config_yaml(cert.cert_path, cert.key_path,
                                   "models:\n  - {name: m, path: " + dir.path() + "}\n"));
    CHECK_MESSAGE(e.find(c + ": models[0] (\"m\", " + dir.path() + "): ") == 0, e);
    CHECK(e.find("config.json") != std::string::npos);
    // A model whose files run would refuse: a truncated safetensors file, a config field the
    // architecture does not support. Found from the headers, without reading a weight.
    const std::string model = dir.path() + "/model";
    std::filesystem::copy(std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-qwen3-moe", model);
    const std::string models = "models:\n  - {name: m, path: " + model + "}\n";
    CHECK(check(testing::config_yaml(cert.cert_path, cert.key_path, models)).empty());
    std::filesystem::resize_file(model + "/model.safetensors",
                                 std::filesystem::file_size(model + "/model.safetensors") - 100);
    e = check(testing::config_yaml(cert.cert_path, cert.key_path, models));
    CHECK_MESSAGE(e.find("model.safetensors") != std::string::npos, e);
    CHECK_MESSAGE(e.find("truncated?") != std::string::npos, e);
    std::filesystem::copy_file(
        std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-qwen3-moe/model.safetensors",
        model + "/model.safetensors", std::filesystem::copy_options::overwrite_existing);
    std::string json = read_file(model + "/config.json");
    json.replace(json.find("\"silu\""), 6, "\"gelu\"");
    std::ofstream(model + "/config.json", std::ios::trunc) << json;
    e = check(testing::config_yaml(cert.cert_path, cert.key_path, models));
    CHECK_MESSAGE(e.find("hidden_act") != std::string::npos, e);
    // A tokenizer larger than the model's vocabulary, as run refuses it.
    json = read_file(std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-qwen3-moe/config.json");
    const size_t at = json.find("\"vocab_size\"");
    REQUIRE(at != std::string::npos);
    json.replace(at, json.find_first_of(",}", at) - at, "\"vocab_size\": 510");
    std::ofstream(model + "/config.json", std::ios::trunc) << json;
    e = check(testing::config_yaml(cert.cert_path, cert.key_path, models));
    CHECK_MESSAGE(e.find("tokenizer has 512 tokens but " + model +
                         "/config.json says vocab_size 510") != std::string::npos,
                  e);
    std::filesystem::copy_file(
        std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-qwen3-moe/config.json",
        model + "/config.json", std::filesystem::copy_options::overwrite_existing);
    // A chat format whose control tokens the vocabulary lacks, a max_context beyond the model's
    // positions: run refuses both at load, so check-config does too.
    e = check(testing::config_yaml(cert.cert_path, cert.key_path,
                                   "models:\n  - {name: m, path: " + model +
                                       ", chat_template: glm4_5}\n"));
    CHECK_MESSAGE(e.find("[gMASK]") != std::string::npos, e);
    e = check(testing::config_yaml(cert.cert_path, cert.key_path,
                                   "models:\n  - {name: m, path: " + model +
                                       ", max_context: 100000}\n"));
    CHECK_MESSAGE(e.find("max_context 100000 is larger than the model's "
                         "max_position_embeddings 2048 (" + model + "/config.json)") !=
                      std::string::npos,
                  e);
    // With YaRN the load serves original_max_position_embeddings x factor (2048 x 4 here), more
    // than config.json's max_position_embeddings: check-config takes max_context up to that.
    json = read_file(std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-qwen3-moe/config.json");
    const std::string plain_rope = "\"rope_scaling\": null";
    REQUIRE(json.find(plain_rope) != std::string::npos);
    json.replace(json.find(plain_rope), plain_rope.size(),
                 R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})");
    std::ofstream(model + "/config.json", std::ios::trunc) << json;
    auto with_max_context = [&](int n) {
        return check(testing::config_yaml(cert.cert_path, cert.key_path,
                                          "models:\n  - {name: m, path: " + model +
                                              ", max_context: " + std::to_string(n) + "}\n"));
    };
    e = with_max_context(8192);
    CHECK_MESSAGE(e.empty(), e);
    e = with_max_context(8193);
    CHECK_MESSAGE(e.find("max_context 8193 is larger than the model's 8192 positions "
                         "(max_position_embeddings 2048 stretched by rope_scaling") !=
                      std::string::npos,
                  e);
    std::filesystem::copy_file(
        std::string(EDGE_SOURCE_DIR) + "/tests/fixtures/micro-qwen3-moe/config.json",
        model + "/config.json", std::filesystem::copy_options::overwrite_existing);
    // A template in no known format loads (completions still serve): ok, with a warning.
    std::ofstream(model + "/chat_template.jinja") << "{% for m in messages %}[INST]{% endfor %}";
    {
        const std::string path = dir.write("c.yaml", testing::config_yaml(
                                                         cert.cert_path, cert.key_path, models));
        auto r = testing::run({kBinary, "check-config", path});
        CHECK(r.exit_code == 0);
        CHECK_MESSAGE(r.out.find("warning: " + path + ": models[0] (\"m\"): the chat template "
                                 "(chat_template.jinja) is in no known format") !=
                          std::string::npos,
                      r.out);
    }
    std::filesystem::remove(model + "/chat_template.jinja");

    e = check(testing::config_yaml(cert.cert_path, cert.key_path,
                                   "engine:\n  sharding:\n    communicator: carrier-pigeon\n"));
    CHECK_MESSAGE(e.find(c + ": engine.sharding.communicator: 'carrier-pigeon' is not compiled "
                             "in (available: in_process") == 0,
                  e);

    // Sharding the model's 8 experts cannot take: run refused it only after loading.
    const std::pair<std::string, std::string> shardings[] = {
        {"ranks: 32", "sharding: ranks 32 exceeds the model's 8 routed experts"},
        {"ranks: 2\n    static_plan: \"not a plan\"", "sharding: static plan 'not a plan': rank 0"},
        {"ranks: 2\n    slots_per_rank: 9",
         "sharding: expert placement: slots_per_rank 9 exceeds the 8 experts"},
        {"ranks: 2\n    slots_per_rank: 3",
         "sharding: expert placement: 2 ranks x 3 slots cannot hold 8 experts"},
    };
    for (const auto& [sharding, error] : shardings) {
        e = check(testing::config_yaml(cert.cert_path, cert.key_path,
                                       models + "engine:\n  sharding:\n    " + sharding + "\n"));
        CHECK_MESSAGE(e.find("models[0] (\"m\", " + model + "): " + error) != std::string::npos, e);
    }
    CHECK(check(testing::config_yaml(cert.cert_path, cert.key_path,
                                     models + "engine:\n  sharding:\n    ranks: 2\n"))
              .empty());

    e = check(testing::config_yaml(cert.cert_path, cert.key_path,
                                   "gossip:\n  port: 0\n  keyring_file: /none/keyring\n"));
    CHECK_MESSAGE(e.find(c + ": gossip.keyring_file: cannot open '/none/keyring'") == 0, e);
    // A site's own certificate as the cluster CA: every peer handshake would fail at run time.
    testing::TestCa ca = testing::make_ca(dir.path(), "clusterca", "cluster CA");
    auto site = testing::make_signed_certificate(ca, dir.path(), "site", {"site.test"});
    const std::string peer = "peer:\n  address: 127.0.0.1\n  port: 0\n  cert: " +
                             site.cert_path + "\n  key: " + site.key_path + "\n  ca: ";
    CHECK(check(testing::config_yaml(cert.cert_path, cert.key_path, peer + ca.cert_path + "\n"))
              .empty());
    e = check(testing::config_yaml(cert.cert_path, cert.key_path, peer + site.cert_path + "\n"));
    CHECK_MESSAGE(e.find("holds no CA certificate") != std::string::npos, e);
    // A probe timeout as long as the interval or longer, named by its keys.
    for (const char* timeout : {"5000", "300"}) {
        e = check(testing::config_yaml(cert.cert_path, cert.key_path,
                                       "gossip:\n  port: 0\n  probe_interval_ms: 300\n"
                                       "  probe_timeout_ms: " +
                                           std::string(timeout) + "\n"));
        CHECK_MESSAGE(
            e.find("gossip.probe_timeout_ms (" + std::string(timeout) +
                   ") must be less than gossip.probe_interval_ms (300") != std::string::npos,
            e);
    }
    // An emptied keyring would turn encryption off without a word.
    const std::string empty_ring = dir.write("empty.keyring", "# rotated out\n\n");
    e = check(testing::config_yaml(cert.cert_path, cert.key_path,
                                   "gossip:\n  port: 0\n  keyring_file: " + empty_ring + "\n"));
    CHECK_MESSAGE(e.find(empty_ring + ": no keys") != std::string::npos, e);

    // engine.backend cuda where no GPU is visible: run refuses it before anything else, so
    // check-config does too (not with --no-files, for a config written for another host).
    const std::vector<std::string> backends = engine::available_backends();
    if (std::find(backends.begin(), backends.end(), "cuda") == backends.end()) {
        const std::string cuda = testing::config_yaml(cert.cert_path, cert.key_path,
                                                      "engine:\n  backend: cuda\n");
        e = check(cuda);
        CHECK_MESSAGE(e.find(c + ": engine.backend: engine.backend is \"cuda\" but ") == 0, e);
        CHECK(testing::run({kBinary, "check-config", "--no-files", dir.write("c.yaml", cuda)})
                  .exit_code == 0);
    }

    // --no-files checks the YAML only.
    std::string missing = dir.write(
        "m.yaml", testing::config_yaml(dir.file("nonexist.crt"), dir.file("nonexist.key")));
    CHECK(testing::run({kBinary, "check-config", "--no-files", missing}).exit_code == 0);
    CHECK(testing::run({kBinary, "check-config", missing}).exit_code == 1);
}

TEST_CASE("check-config and run refuse a private key every user may read, naming mode and fix") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    REQUIRE(::chmod(cert.key_path.c_str(), 0644) == 0);
    const std::string config =
        dir.write("c.yaml", testing::config_yaml(cert.cert_path, cert.key_path));
    const std::string expected = config + ": listeners.public.certificates[0]: private key '" +
                                 cert.key_path +
                                 "' is readable by every user on this machine (mode 0644)";
    auto checked = testing::run({kBinary, "check-config", config});
    CHECK(checked.exit_code == 1);
    CHECK_MESSAGE(checked.err.find(expected) != std::string::npos, checked.err);
    CHECK_MESSAGE(checked.err.find("chmod 0640 '" + cert.key_path + "'") != std::string::npos,
                  checked.err);
    auto ran = testing::run({kBinary, "run", "--config", config});
    CHECK(ran.exit_code == 1);
    CHECK_MESSAGE(ran.err.find(expected) != std::string::npos, ran.err);

    // The peer section's key too; and 0640 (group edgeserve, the packaged setup) is fine.
    REQUIRE(::chmod(cert.key_path.c_str(), 0640) == 0);
    CHECK(testing::run({kBinary, "check-config", config}).exit_code == 0);
    testing::TestCa ca = testing::make_ca(dir.path(), "ca", "test CA");
    auto site = testing::make_signed_certificate(ca, dir.path(), "site", {"site"});
    REQUIRE(::chmod(site.key_path.c_str(), 0604) == 0);
    const std::string peer = dir.write(
        "p.yaml", testing::config_yaml(
                      cert.cert_path, cert.key_path,
                      "peer:\n  address: 127.0.0.1\n  port: 0\n  ca: " + ca.cert_path +
                          "\n  cert: " + site.cert_path + "\n  key: " + site.key_path + "\n"));
    checked = testing::run({kBinary, "check-config", peer});
    CHECK(checked.exit_code == 1);
    CHECK_MESSAGE(checked.err.find(peer + ": peer: private key '" + site.key_path +
                                   "' is readable by every user on this machine (mode 0604)") !=
                      std::string::npos,
                  checked.err);
}

TEST_CASE("edgeserve run refuses a bad certificate before it loads any model") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    auto other = testing::make_certificate(dir.path(), "o", {"other"});
    // The model directory exists (the fixture): with the old order the engine loaded it first.
    std::string config =
        dir.write("c.yaml", testing::config_yaml(cert.cert_path, other.key_path,
                                                 "models:\n  - {name: m, path: " EDGE_SOURCE_DIR
                                                 "/deploy/demo-model}\n"));
    auto r = testing::run({kBinary, "run", "--config", config});
    CHECK(r.exit_code == 1);
    CHECK_MESSAGE(r.err.find("edgeserve: " + config + ": listeners.public.certificates[0]: ") !=
                      std::string::npos,
                  r.err);
    CHECK(r.err.find("engine_failed") == std::string::npos);
}

TEST_CASE("subcommand --help prints usage to stdout, usage errors say what was wrong") {
    for (const char* cmd : {"run", "check-config", "members", "pools", "route", "rollout"}) {
        for (const char* help : {"--help", "-h"}) {
            auto r = testing::run({kBinary, cmd, help});
            CHECK_MESSAGE(r.exit_code == 0, cmd << " " << help << ": " << r.err);
            CHECK_MESSAGE(r.out.find(std::string("usage: edgeserve ") + cmd) == 0, cmd);
        }
    }
    auto missing = testing::run({kBinary, "run", "--config"});
    CHECK(missing.exit_code == 2);
    CHECK(missing.err.find("edgeserve run: missing the value of --config") == 0);
    auto extra = testing::run({kBinary, "run", "--config", "f.yaml", "--extra"});
    CHECK(extra.exit_code == 2);
    CHECK(extra.err.find("edgeserve run: unexpected argument '--extra'") == 0);
    auto none = testing::run({kBinary, "check-config"});
    CHECK(none.exit_code == 2);
    CHECK(none.err.find("edgeserve check-config: missing the config FILE") == 0);
    auto members = testing::run({kBinary, "members", "--admin"});
    CHECK(members.exit_code == 2);
    CHECK(members.err.find("edgeserve members: missing the value of --admin") == 0);
    auto route = testing::run({kBinary, "route"});
    CHECK(route.exit_code == 2);
    CHECK(route.err.find("edgeserve route: missing --model") == 0);
    auto unreadable = testing::run({kBinary, "run", "--config", "/nonexistent/e.yaml"});
    CHECK(unreadable.exit_code == 1);
    CHECK(unreadable.err.find("edgeserve: cannot open config file '/nonexistent/e.yaml'") !=
          std::string::npos);
}

TEST_CASE("edgeserve run: systemd notify, curl, openssl s_client, SIGHUP, SIGTERM drain") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    std::string config = dir.write("c.yaml", testing::config_yaml(cert.cert_path, cert.key_path));
    NotifySocket notify(dir.file("notify.sock"));
    std::string log_path = dir.file("stderr.log");
    testing::Child child({kBinary, "run", "--config", config},
                         {"NOTIFY_SOCKET=" + dir.file("notify.sock"), "WATCHDOG_USEC=400000"},
                         log_path);
    REQUIRE(notify.expect("READY=1"));
    CHECK(notify.expect("WATCHDOG=1"));
    std::string log = read_file(log_path);
    uint16_t port = port_from_log(log, "public_port");
    uint16_t admin = port_from_log(log, "admin_port");
    CHECK(log.find("auth_disabled") != std::string::npos);
    std::string url = "https://localhost:" + std::to_string(port);

    if (testing::have_program("curl")) {
        auto models = testing::run({"curl", "-sS", "--cacert", cert.cert_path,
                                    "--resolve", "localhost:" + std::to_string(port) + ":127.0.0.1",
                                    url + "/v1/models"});
        CHECK(models.exit_code == 0);
        CHECK(models.out == R"({"object":"list","data":[]})");
        auto completion = testing::run(
            {"curl", "-sS", "--cacert", cert.cert_path, "--resolve",
             "localhost:" + std::to_string(port) + ":127.0.0.1", "-w", "%{http_code}", "-H",
             "Content-Type: application/json", "-d",
             R"({"model":"fortunes","messages":[{"role":"user","content":"hi"}]})",
             url + "/v1/chat/completions"});
        CHECK(completion.out.find("model_not_found") != std::string::npos);
        CHECK(completion.out.substr(completion.out.size() - 3) == "404");
    } else {
        MESSAGE("curl not installed; skipping the curl probes");
    }
    if (testing::have_program("openssl")) {
        for (std::string version : {"-tls1_3", "-tls1_2"}) {
            auto s = testing::run({"openssl", "s_client", "-connect",
                                   "127.0.0.1:" + std::to_string(port), "-servername", "localhost",
                                   version, "-alpn", "http/1.1", "-brief"},
                                  20000, "");
            CHECK(s.exit_code == 0);
            std::string all = s.out + s.err;
            CHECK(all.find(version == "-tls1_3" ? "TLSv1.3" : "TLSv1.2") != std::string::npos);
            CHECK(all.find("CN = localhost") != std::string::npos);
        }
    } else {
        MESSAGE("openssl not installed; skipping the s_client probes");
    }
    CHECK(testing::plain_http_get(admin, "/readyz")->status == 200);

    child.signal(SIGHUP);
    CHECK(notify.expect("RELOADING=1"));
    CHECK(notify.expect("READY=1"));

    // A request in flight at SIGTERM (its body still arriving) is served before the exit. The
    // interim 100 Continue proves the daemon has read the head, so the connection is past its
    // handshake (a drain closes connections still handshaking) before the signal is sent.
    auto in_flight = testing::TlsClient::connect(port);
    REQUIRE(in_flight.ok());
    std::string body = R"({"model":"fortunes","messages":[{"role":"user","content":"hi"}]})";
    REQUIRE((*in_flight)
                ->send("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                       "Content-Type: application/json\r\nExpect: 100-continue\r\n"
                       "Content-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n")
                .ok());
    auto interim = (*in_flight)->read_until("\r\n\r\n");
    REQUIRE(interim.ok());
    CHECK(interim->find("100 Continue") != std::string::npos);
    REQUIRE((*in_flight)->send(body.substr(0, 10)).ok());
    child.signal(SIGTERM);
    CHECK(notify.expect("STOPPING=1"));
    bool refused = false;
    for (int i = 0; i < 400 && !refused; ++i) {
        refused = !testing::tcp_connect(port).ok();
        if (!refused) {
            usleep(5000);  // Waits on the daemon closing its acceptor.
        }
    }
    CHECK(refused);
    REQUIRE((*in_flight)->send(body.substr(10)).ok());
    auto reply = (*in_flight)->read_response();
    REQUIRE(reply.ok());
    CHECK(reply->status == 404);
    CHECK(reply->headers["connection"] == "close");
    CHECK(child.wait(15000) == 0);
    CHECK_FALSE(testing::accepts_connections(port));
    std::string final_log = read_file(log_path);
    // The SIGHUP re-read the config; its certificate files were the ones the start loaded.
    CHECK(final_log.find("certificates_unchanged") != std::string::npos);
    CHECK(final_log.find("tenants_reloaded") != std::string::npos);
    CHECK(final_log.find("\"event\":\"stopped\"") != std::string::npos);
}

TEST_CASE(
    "SIGHUP serves a changed certificate list, and a config that does not load changes nothing") {
    testing::TempDir dir;
    auto first = testing::make_certificate(dir.path(), "first", {"localhost"});
    auto second = testing::make_certificate(dir.path(), "second", {"second.test"});
    auto third = testing::make_certificate(dir.path(), "third", {"third.test"});
    std::string config = dir.write("c.yaml", testing::config_yaml(first.cert_path, first.key_path));
    NotifySocket notify(dir.file("notify.sock"));
    std::string log_path = dir.file("stderr.log");
    testing::Child child({kBinary, "run", "--config", config},
                         {"NOTIFY_SOCKET=" + dir.file("notify.sock")}, log_path);
    REQUIRE(notify.expect("READY=1"));
    const std::string started = read_file(log_path);
    const uint16_t port = port_from_log(started, "public_port");
    const uint16_t admin = port_from_log(started, "admin_port");
    auto served = [&](const std::string& name) {
        testing::TlsClientOptions options;
        options.server_name = name;
        auto c = testing::TlsClient::connect(port, options);
        return c.ok() ? (*c)->peer_common_name() : "connect failed: " + c.status().message();
    };
    CHECK(served("localhost") == "localhost");

    // Another default chain plus an SNI chain, and a log level, which needs a restart.
    std::string yaml = testing::config_yaml(second.cert_path, second.key_path,
                                            "log:\n  level: debug\n");
    yaml.replace(yaml.find("[localhost]"), 11, "[second.test]");
    yaml.replace(yaml.find("  admin:"), 0,
                 "      - server_names: [third.test]\n        cert: " + third.cert_path +
                     "\n        key: " + third.key_path + "\n");
    dir.write("c.yaml", yaml);
    child.signal(SIGHUP);
    REQUIRE(notify.expect("RELOADING=1"));
    REQUIRE(notify.expect("READY=1"));
    CHECK(served("localhost") == "second.test");  // The new default chain.
    CHECK(served("third.test") == "third.test");
    std::string log = read_file(log_path);
    CHECK(log.find("\"event\":\"certificates_reloaded\",\"generation\":2,\"chains\":2") !=
          std::string::npos);
    CHECK(log.find("\"event\":\"changed_sections_need_restart\",\"sections\":\"log\"") !=
          std::string::npos);
    auto metrics = testing::plain_http_get(admin, "/metrics");
    REQUIRE(metrics.ok());
    CHECK(metrics->body.find("certificate=\"second.test\"") != std::string::npos);
    CHECK(metrics->body.find("certificate=\"third.test\"") != std::string::npos);
    CHECK(metrics->body.find("certificate=\"localhost\"") == std::string::npos);
    CHECK(metrics->body.find("\nedgeserve_config_last_reload_successful 1\n") != std::string::npos);

    // An unterminated quote: nothing is reloaded, not even the certificates.
    std::string broken = testing::config_yaml(first.cert_path, first.key_path);
    broken.replace(broken.find("id: test-site"), 13, "id: \"test-site");
    dir.write("c.yaml", broken);
    child.signal(SIGHUP);
    REQUIRE(notify.expect("RELOADING=1"));
    REQUIRE(notify.expect("READY=1"));
    CHECK(served("localhost") == "second.test");
    log = read_file(log_path);
    CHECK(log.find("\"event\":\"config_reload_failed\"") != std::string::npos);
    CHECK(log.find("unterminated quoted string") != std::string::npos);
    CHECK(log.find("\"generation\":3") == std::string::npos);
    // What an alert watches: the log is not scraped.
    metrics = testing::plain_http_get(admin, "/metrics");
    REQUIRE(metrics.ok());
    CHECK(metrics->body.find("\nedgeserve_config_last_reload_successful 0\n") != std::string::npos);

    // A site without `gossip` has no cluster to show.
    auto members =
        testing::run({kBinary, "members", "--admin", "127.0.0.1:" + std::to_string(admin)});
    CHECK(members.exit_code == 1);
    CHECK_MESSAGE(members.err.find("has no `gossip` section") != std::string::npos, members.err);
    auto rollout = testing::run({kBinary, "rollout", "--model", "m", "--version", "v", "--admin",
                                 "127.0.0.1:" + std::to_string(admin)});
    CHECK(rollout.exit_code == 1);
    CHECK(rollout.err.find("has no `gossip` section") != std::string::npos);

    child.signal(SIGTERM);
    CHECK(child.wait(15000) == 0);
}

TEST_CASE("SIGHUP with a certificate that does not load counts an error and names the part") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    testing::TestCa ca = testing::make_ca(dir.path(), "ca", "test CA");
    auto site = testing::make_signed_certificate(ca, dir.path(), "site", {"site"});
    auto yaml = [&](const std::string& public_cert, const std::string& peer_cert) {
        return testing::config_yaml(public_cert, cert.key_path,
                                    "peer:\n  address: 127.0.0.1\n  port: 0\n  ca: " +
                                        ca.cert_path + "\n  cert: " + peer_cert +
                                        "\n  key: " + site.key_path + "\n");
    };
    std::string config = dir.write("c.yaml", yaml(cert.cert_path, site.cert_path));
    NotifySocket notify(dir.file("notify.sock"));
    std::string log_path = dir.file("stderr.log");
    testing::Child child({kBinary, "run", "--config", config},
                         {"NOTIFY_SOCKET=" + dir.file("notify.sock")}, log_path);
    REQUIRE(notify.expect("READY=1"));
    const uint16_t admin = port_from_log(read_file(log_path), "admin_port");
    auto reload_with = [&](const std::string& text) {
        dir.write("c.yaml", text);
        child.signal(SIGHUP);
        REQUIRE(notify.expect("RELOADING=1"));
        REQUIRE(notify.expect("READY=1"));
        auto metrics = testing::plain_http_get(admin, "/metrics");
        REQUIRE(metrics.ok());
        return metrics->body;
    };
    auto errors = [](const std::string& listener) {
        return "edgeserve_certificate_reloads_total{listener=\"" + listener +
               "\",result=\"error\"} 1\n";
    };

    // A renewal whose certificate file is not in place yet: refused whole, and counted where
    // the certificate alert looks, as the file watch's failures are.
    std::string metrics = reload_with(yaml(dir.file("missing.crt"), site.cert_path));
    CHECK_MESSAGE(metrics.find(errors("public")) != std::string::npos, metrics);
    CHECK(metrics.find("\nedgeserve_config_last_reload_successful 0\n") != std::string::npos);
    std::string log = read_file(log_path);
    CHECK_MESSAGE(log.find("\"event\":\"config_reload_failed\",\"part\":\"certificates\"") !=
                      std::string::npos,
                  log);
    CHECK(log.find("missing.crt") != std::string::npos);

    // The cluster certificate: both of its sides count the error.
    metrics = reload_with(yaml(cert.cert_path, dir.file("missing-site.crt")));
    CHECK_MESSAGE(metrics.find(errors("peer")) != std::string::npos, metrics);
    CHECK(metrics.find(errors("forwarding_client")) != std::string::npos);
    CHECK(metrics.find(errors("public")) != std::string::npos);  // Still the first one.
    log = read_file(log_path);
    CHECK_MESSAGE(log.find("\"event\":\"config_reload_failed\",\"part\":\"peer_certificates\"") !=
                      std::string::npos,
                  log);

    // Fixed: applies, and the certificates, unchanged, are not reloaded.
    metrics = reload_with(yaml(cert.cert_path, site.cert_path));
    CHECK(metrics.find("\nedgeserve_config_last_reload_successful 1\n") != std::string::npos);
    CHECK(metrics.find("result=\"ok\"") == std::string::npos);

    child.signal(SIGTERM);
    CHECK(child.wait(15000) == 0);
}

TEST_CASE("SIGHUP refuses a restart-only change the next start would refuse, and serves on") {
    testing::TempDir dir;
    auto first = testing::make_certificate(dir.path(), "first", {"localhost"});
    auto second = testing::make_certificate(dir.path(), "second", {"second.test"});
    // `cert` as the default chain, the public and admin listeners on the ports given.
    auto yaml = [](const testing::TestCertificate& cert, const std::string& name,
                   uint16_t public_port, uint16_t admin_port) {
        std::string text = testing::config_yaml(cert.cert_path, cert.key_path);
        text.replace(text.find("[localhost]"), 11, "[" + name + "]");
        text.replace(text.find("port: 0", text.find("admin:")), 7,
                     "port: " + std::to_string(admin_port));
        text.replace(text.find("port: 0"), 7, "port: " + std::to_string(public_port));
        return text;
    };
    std::string config = dir.write("c.yaml", yaml(first, "localhost", 0, 0));
    NotifySocket notify(dir.file("notify.sock"));
    std::string log_path = dir.file("stderr.log");
    testing::Child child({kBinary, "run", "--config", config},
                         {"NOTIFY_SOCKET=" + dir.file("notify.sock")}, log_path);
    REQUIRE(notify.expect("READY=1"));
    const std::string started = read_file(log_path);
    const uint16_t port = port_from_log(started, "public_port");
    const uint16_t admin = port_from_log(started, "admin_port");
    auto reload_with = [&](const std::string& text) {
        dir.write("c.yaml", text);
        child.signal(SIGHUP);
        REQUIRE(notify.expect("RELOADING=1"));
        REQUIRE(notify.expect("READY=1"));
        auto metrics = testing::plain_http_get(admin, "/metrics");
        REQUIRE(metrics.ok());
        return metrics->body;
    };
    auto served = [&] {
        auto c = testing::TlsClient::connect(port);
        return c.ok() ? (*c)->peer_common_name() : "connect failed: " + c.status().message();
    };
    auto models_status = [&] {
        auto c = testing::TlsClient::connect(port);
        REQUIRE(c.ok());
        REQUIRE((*c)->send(testing::http_request("GET", "/v1/models")).ok());
        auto reply = (*c)->read_response();
        REQUIRE(reply.ok());
        return reply->status;
    };
    const std::string refused = "\"event\":\"config_reload_failed\",\"part\":\"listeners\"";

    // The running port pinned for both listeners, with a new certificate (which a reload would
    // apply): the listeners wait for a restart, which would refuse them (check-config in
    // ExecStartPre), so the whole reload is refused now, the certificate too.
    std::string metrics = reload_with(yaml(second, "second.test", port, port));
    CHECK_MESSAGE(
        metrics.find("\nedgeserve_config_last_reload_successful 0\n") != std::string::npos,
        metrics);
    std::string log = read_file(log_path);
    CHECK_MESSAGE(log.find(refused) != std::string::npos, log);
    CHECK(log.find("listeners.admin.port: port " + std::to_string(port) +
                   " is also listeners.public.port") != std::string::npos);
    CHECK(log.find("which would fail on this config") != std::string::npos);
    CHECK(log.find("changed_sections_need_restart") == std::string::npos);
    // The daemon serves on as it was: the old port, the old certificate.
    CHECK(models_status() == 200);
    CHECK(served() == "localhost");

    // The admin port back to any free one: a valid restart-only change, and the certificate
    // with it applies.
    metrics = reload_with(yaml(second, "second.test", port, 0));
    CHECK_MESSAGE(
        metrics.find("\nedgeserve_config_last_reload_successful 1\n") != std::string::npos,
        metrics);
    log = read_file(log_path);
    CHECK(log.find(refused, log.find(refused) + 1) == std::string::npos);  // Refused once.
    CHECK(log.find("\"event\":\"changed_sections_need_restart\",\"sections\":\"listeners\"") !=
          std::string::npos);
    CHECK(served() == "second.test");
    CHECK(models_status() == 200);

    child.signal(SIGTERM);
    CHECK(child.wait(15000) == 0);
}

TEST_CASE("edgeserve run: the admin token guards /admin/, the CLI sends it, SIGHUP rotates it") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    const std::string old_token = "0123456789abcdef0123456789abcdef";
    const std::string token_file = dir.write("admin.token", old_token + "\n");
    std::string yaml = testing::config_yaml(cert.cert_path, cert.key_path);
    yaml.replace(yaml.find("  admin:\n") + 9, 0, "    token_file: " + token_file + "\n");
    const std::string config = dir.write("c.yaml", yaml);
    auto check = testing::run({kBinary, "check-config", config});
    CHECK_MESSAGE(check.exit_code == 0, check.err);
    NotifySocket notify(dir.file("notify.sock"));
    const std::string log_path = dir.file("stderr.log");
    testing::Child child({kBinary, "run", "--config", config},
                         {"NOTIFY_SOCKET=" + dir.file("notify.sock")}, log_path);
    REQUIRE(notify.expect("READY=1"));
    const std::string admin =
        "127.0.0.1:" + std::to_string(port_from_log(read_file(log_path), "admin_port"));
    // Without the token: refused, and the CLI says how to pass it.
    auto bare = testing::run({kBinary, "members", "--admin", admin});
    CHECK(bare.exit_code == 1);
    CHECK_MESSAGE(bare.err.find("wants its admin token") != std::string::npos, bare.err);
    // With it (flag or environment), the request is served: this site has no cluster to show.
    auto with_flag =
        testing::run({kBinary, "members", "--admin", admin, "--token-file", token_file});
    CHECK_MESSAGE(with_flag.err.find("has no `gossip` section") != std::string::npos,
                  with_flag.err);
    auto with_env = testing::run({"env", "EDGESERVE_ADMIN_TOKEN_FILE=" + token_file, kBinary,
                                  "rollout", "--model", "m", "--version", "v", "--admin", admin});
    CHECK_MESSAGE(with_env.err.find("has no `gossip` section") != std::string::npos, with_env.err);
    auto metrics =
        testing::plain_http_get(port_from_log(read_file(log_path), "admin_port"), "/metrics");
    REQUIRE(metrics.ok());
    CHECK(metrics->status == 200);  // Prometheus needs no token.

    // Rotation: a new token in the file and SIGHUP; the old one is refused from then on.
    const std::string new_token_file = dir.write("admin.token.new", "fedcba9876543210fedcba98\n");
    dir.write("admin.token", "fedcba9876543210fedcba98\n");
    child.signal(SIGHUP);
    REQUIRE(notify.expect("RELOADING=1"));
    REQUIRE(notify.expect("READY=1"));
    const std::string old_file = dir.write("old.token", old_token + "\n");
    auto stale = testing::run({kBinary, "pools", "--admin", admin, "--token-file", old_file});
    CHECK(stale.exit_code == 1);
    CHECK_MESSAGE(stale.err.find("wrong admin token") != std::string::npos, stale.err);
    auto fresh = testing::run({kBinary, "pools", "--admin", admin, "--token-file", new_token_file});
    CHECK_MESSAGE(fresh.err.find("has no `gossip` section") != std::string::npos, fresh.err);
    // A token file that no longer loads keeps the token that works.
    dir.write("admin.token", "short\n");
    child.signal(SIGHUP);
    REQUIRE(notify.expect("RELOADING=1"));
    REQUIRE(notify.expect("READY=1"));
    auto kept = testing::run({kBinary, "pools", "--admin", admin, "--token-file", new_token_file});
    CHECK_MESSAGE(kept.err.find("has no `gossip` section") != std::string::npos, kept.err);
    const std::string log = read_file(log_path);
    // Checked before anything applies: the whole reload is refused, naming the key.
    CHECK(log.find("\"event\":\"config_reload_failed\"") != std::string::npos);
    CHECK(log.find("listeners.admin.token_file") != std::string::npos);
    CHECK(log.find("fedcba9876543210") == std::string::npos);  // No token in the journal.
    CHECK(log.find(old_token) == std::string::npos);
    // A config without the key would open /admin/ (rollouts included): refused, the token stays.
    dir.write("c.yaml", testing::config_yaml(cert.cert_path, cert.key_path));
    child.signal(SIGHUP);
    REQUIRE(notify.expect("RELOADING=1"));
    REQUIRE(notify.expect("READY=1"));
    auto open = testing::run({kBinary, "pools", "--admin", admin});
    CHECK(open.exit_code == 1);
    CHECK_MESSAGE(open.err.find("wants its admin token") != std::string::npos, open.err);
    CHECK(read_file(log_path).find("which would open /admin/ without a token") !=
          std::string::npos);
    child.signal(SIGTERM);
    CHECK(child.wait(15000) == 0);
}

TEST_CASE("edgeserve run: a burst of SIGHUPs does not hold back the watchdog pings") {
    testing::TempDir dir;
    auto cert = testing::make_certificate(dir.path(), "s", {"localhost"});
    std::string config = dir.write("c.yaml", testing::config_yaml(cert.cert_path, cert.key_path));
    NotifySocket notify(dir.file("notify.sock"));
    // WatchdogSec 1 s: pings are due every half of it.
    testing::Child child({kBinary, "run", "--config", config},
                         {"NOTIFY_SOCKET=" + dir.file("notify.sock"), "WATCHDOG_USEC=1000000"},
                         dir.file("stderr.log"));
    REQUIRE(notify.expect("READY=1"));
    REQUIRE(notify.expect("WATCHDOG=1"));
    // A reload every 150 ms for 3 s: each one used to restart the wait the pings came from.
    using Clock = std::chrono::steady_clock;
    auto last_ping = Clock::now();
    std::chrono::milliseconds longest{0};
    const auto end = Clock::now() + std::chrono::seconds(3);
    auto next_hup = Clock::now();
    while (Clock::now() < end) {
        if (Clock::now() >= next_hup) {
            child.signal(SIGHUP);
            next_hup += std::chrono::milliseconds(150);
        }
        const std::string d = notify.receive_within(20);
        if (d.find("WATCHDOG=1") != std::string::npos) {
            longest = std::max(longest, std::chrono::duration_cast<std::chrono::milliseconds>(
                                            Clock::now() - last_ping));
            last_ping = Clock::now();
        }
    }
    longest = std::max(
        longest, std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_ping));
    CHECK(longest < std::chrono::milliseconds(1000));  // systemd's limit, with room for load.
    child.signal(SIGTERM);
    CHECK(child.wait(15000) == 0);
}

TEST_CASE("edgeserve members gives up on an admin listener that never answers") {
    // Accepts (the kernel does, from the backlog) and never reads or writes.
    uint16_t silent_port = 0;
    const int silent = testing::bind_loopback(SOCK_STREAM, silent_port);
    const std::string admin = "127.0.0.1:" + std::to_string(silent_port);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = testing::run({kBinary, "members", "--admin", admin}, 30'000);
    const auto took = std::chrono::steady_clock::now() - t0;
    ::close(silent);
    CHECK(r.exit_code == 1);
    CHECK(took < std::chrono::seconds(15));  // Its deadline is 5 s; it used to wait forever.
    CHECK_MESSAGE(r.err.find("admin request to " + admin + "/admin/members") != std::string::npos,
                  r.err);
    CHECK_MESSAGE(r.err.find("timeout") != std::string::npos, r.err);
}

TEST_CASE("a certificate renewed on disk is served without a signal, a broken one is not") {
    testing::TempDir dir;
    auto first = testing::make_certificate(dir.path(), "first", {"localhost"});
    auto renewed = testing::make_certificate(dir.path(), "renewed", {"renewed.test", "localhost"});
    namespace fs = std::filesystem;
    const std::string live_cert = dir.file("live.crt");
    const std::string live_key = dir.file("live.key");
    fs::copy_file(first.cert_path, live_cert);
    fs::copy_file(first.key_path, live_key);
    // A renewal tool writes a new file, private as a key must be, and renames it over the old one.
    auto replace = [&](const std::string& live, const std::string& contents) {
        const std::string tmp = dir.write("incoming.tmp", contents);
        fs::permissions(tmp, fs::perms::owner_read | fs::perms::owner_write);
        REQUIRE(::rename(tmp.c_str(), live.c_str()) == 0);
    };
    std::string yaml = testing::config_yaml(live_cert, live_key);
    yaml.replace(yaml.find("    certificates:"), 0, "    certificate_watch_ms: 100\n");
    std::string config = dir.write("c.yaml", yaml);
    NotifySocket notify(dir.file("notify.sock"));
    std::string log_path = dir.file("stderr.log");
    testing::Child child({kBinary, "run", "--config", config},
                         {"NOTIFY_SOCKET=" + dir.file("notify.sock")}, log_path);
    REQUIRE(notify.expect("READY=1"));
    const uint16_t port = port_from_log(read_file(log_path), "public_port");
    auto served = [&] {
        auto c = testing::TlsClient::connect(port);
        return c.ok() ? (*c)->peer_common_name() : "connect failed: " + c.status().message();
    };
    // Up to 5 s for `pred` to hold (the watcher polls every 100 ms and waits for one quiet poll).
    auto eventually = [](auto pred) {
        for (int i = 0; i < 100 && !pred(); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return pred();
    };
    CHECK(served() == "localhost");

    replace(live_key, read_file(renewed.key_path));
    replace(live_cert, read_file(renewed.cert_path));
    CHECK(eventually([&] { return served() == "renewed.test"; }));
    std::string log = read_file(log_path);
    CHECK(log.find("\"event\":\"certificate_files_changed\"") != std::string::npos);
    CHECK(log.find("\"event\":\"certificates_reloaded\"") != std::string::npos);
    CHECK(log.find("\"event\":\"certificates_reload_failed\"") == std::string::npos);

    // A key that is not PEM: the renewed certificate stays, the failure is logged once.
    replace(live_key, "not a key\n");
    CHECK(eventually([&] {
        return read_file(log_path).find("\"event\":\"certificates_reload_failed\"") !=
               std::string::npos;
    }));
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    CHECK(served() == "renewed.test");
    log = read_file(log_path);
    const size_t failed = log.find("\"event\":\"certificates_reload_failed\"");
    CHECK(log.find("\"event\":\"certificates_reload_failed\"", failed + 1) == std::string::npos);
    // Both reloads are counted, the failed one as an error (what an alert watches).
    auto metrics = testing::plain_http_get(port_from_log(log, "admin_port"), "/metrics");
    REQUIRE(metrics.ok());
    CHECK(metrics->body.find(
              R"(edgeserve_certificate_reloads_total{listener="public",result="ok"} 1)") !=
          std::string::npos);
    CHECK(metrics->body.find(
              R"(edgeserve_certificate_reloads_total{listener="public",result="error"} 1)") !=
          std::string::npos);

    child.signal(SIGTERM);
    CHECK(child.wait(15000) == 0);
}
