#include "daemon/config.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>

#include "daemon/cluster/cluster.h"
#include "tests/testing/config_yaml.h"
#include "tests/testing/test_certs.h"

using namespace edge;
using namespace edge::daemon;

namespace {

std::string error_of(const std::string& yaml) {
    Result<Config> c = parse_config(yaml, "/etc/edgeserve/test.yaml");
    REQUIRE_FALSE(c.ok());
    return c.status().message();
}

TEST_CASE("engine.sharding section") {
    Result<Config> c = parse_config(testing::config_yaml("/c", "/k",
                                                         "engine:\n"
                                                         "  sharding:\n"
                                                         "    ranks: 4\n"
                                                         "    slots_per_rank: 18\n"
                                                         "    rebalance_interval_steps: 256\n"
                                                         "    load_window_steps: 2048\n"
                                                         "    static_plan: \"0-31;32-63\"\n"),
                                    "/etc/edgeserve/test.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->engine.sharding.ranks == 4);
    CHECK(c->engine.sharding.slots_per_rank == 18);
    CHECK(c->engine.sharding.rebalance_interval_steps == 256);
    CHECK(c->engine.sharding.load_window_steps == 2048);
    CHECK(c->engine.sharding.static_plan == "0-31;32-63");
    CHECK(c->engine.sharding.communicator == "in_process");
    CHECK(error_of(testing::config_yaml("/c", "/k", "engine:\n  sharding:\n    ranks: 0\n"))
              .find("engine.sharding.ranks: must be in 1..256") != std::string::npos);
    CHECK(error_of(testing::config_yaml("/c", "/k", "engine:\n  sharding:\n    rank: 2\n"))
              .find("engine.sharding.rank") != std::string::npos);
}

TEST_CASE("engine.backend: cpu by default, cpu or cuda or auto accepted, anything else named") {
    Result<Config> d = parse_config(testing::config_yaml("/c", "/k"), "/etc/edgeserve/test.yaml");
    REQUIRE_MESSAGE(d.ok(), d.status().to_string());
    CHECK(d->engine.backend == "cpu");
    for (const char* b : {"cpu", "cuda", "auto"}) {
        Result<Config> c = parse_config(
            testing::config_yaml("/c", "/k", std::string("engine:\n  backend: ") + b + "\n"),
            "/etc/edgeserve/test.yaml");
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        CHECK(c->engine.backend == b);
    }
    const std::string bad =
        error_of(testing::config_yaml("/c", "/k", "engine:\n  backend: tpu\n"));
    CHECK_MESSAGE(bad.find("engine.backend: expected cpu, cuda or auto") != std::string::npos,
                  bad);
    CHECK(bad.find("test.yaml:18:") != std::string::npos);  // file:line of the value.
}

}  // namespace

TEST_CASE("a full config loads with every section") {
    std::string yaml = testing::config_yaml("c.pem", "k.pem",
                                            "models:\n"
                                            "  - name: fortunes\n"
                                            "    path: models/fortunes\n"
                                            "    quantization: int8\n"
                                            "    max_context: 4096\n"
                                            "engine:\n"
                                            "  threads: 2\n"
                                            "  activation_precision: bf16\n"
                                            "  cpu_kernels: avx2\n"
                                            "  max_decode_sequences: 40\n"
                                            "  max_queue: 8\n"
                                            "  max_queue_per_tenant: 3\n"
                                            "  max_queue_wait_ms: 1500\n"
                                            "  prefix_cache: false\n"
                                            "tenants:\n"
                                            "  - name: acme\n"
                                            "    api_key_sha256: [" +
                                                std::string(64, 'A') +
                                                "]\n"
                                                "    models: [fortunes]\n"
                                                "limits:\n"
                                                "  header_timeout_ms: 200\n"
                                                "  max_body_bytes: 65536\n"
                                                "  max_stream_buffer_bytes: 131072\n"
                                                "  drain_deadline_ms: 5000\n"
                                                "proxy_protocol:\n"
                                                "  trusted: [10.0.0.0/8, '::1']\n"
                                                "log:\n"
                                                "  level: debug\n"
                                                "  access_log: true\n");
    Result<Config> c = parse_config(yaml, "/etc/edgeserve/test.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->listener.certificates[0].cert_path == "/etc/edgeserve/c.pem");
    CHECK(c->listener.port == 0);
    CHECK(c->site.id == "test-site");
    CHECK(c->site.latitude == doctest::Approx(50.1));
    REQUIRE(c->models.size() == 1);
    CHECK(c->models[0].path == "/etc/edgeserve/models/fortunes");
    CHECK(c->models[0].quantization == "int8");
    CHECK(c->engine.models.size() == 1);
    CHECK(c->engine.threads == 2);
    CHECK(c->engine.activation_precision == engine::ActivationPrecision::kBf16);
    CHECK(c->engine.cpu_kernels == "avx2");
    CHECK(c->engine.max_decode_sequences == 40);
    CHECK(c->engine.max_queue == 8);
    CHECK(c->engine.max_queue_per_tenant == 3);
    CHECK(c->engine.max_queue_wait_ms == 1500);
    CHECK_FALSE(c->engine.prefix_cache);
    REQUIRE(c->tenants.has_value());
    CHECK((*c->tenants)[0].api_key_sha256[0] == std::string(64, 'a'));
    CHECK(c->limits.header_timeout == std::chrono::milliseconds(200));
    CHECK(c->limits.drain_deadline == std::chrono::milliseconds(5000));
    CHECK(c->limits.max_stream_buffer_bytes == 131072);
    CHECK(c->proxy_protocol.trusted.size() == 2);
    CHECK(c->log.access_log);
}

TEST_CASE("the shipped example configs load") {
    // What docs/config.md and README.md point a newcomer to must not have rotted.
    for (const char* name : {"single-pop.yaml", "edgeserve.yaml"}) {
        const std::string path = std::string(EDGE_SOURCE_DIR "/deploy/config/") + name;
        auto c = parse_config(testing::read_file(path), path);
        if (std::string(name) == "single-pop.yaml") {
            // Its tenant's key hash is a placeholder the loader refuses (a real hash there would
            // be of a key everyone who reads the example knows); with a hash of a key no one
            // knows in its place it loads.
            REQUIRE_FALSE(c.ok());
            CHECK_MESSAGE(c.status().message().find(
                              "tenants[0].api_key_sha256[0]: tenant 'acme': expected the key's "
                              "SHA-256 as 64 hex digits") != std::string::npos,
                          c.status().message());
            const std::string yaml = testing::example_with_key_hash(testing::read_file(path));
            REQUIRE_FALSE(yaml.empty());
            c = parse_config(yaml, path);
        }
        CHECK_MESSAGE(c.ok(), c.status().to_string());
    }
}

TEST_CASE("no tenants section means authentication off and defaults apply") {
    Result<Config> c = parse_config(testing::config_yaml("/c", "/k"), "x.yaml");
    REQUIRE(c.ok());
    CHECK_FALSE(c->tenants.has_value());
    CHECK(c->models.empty());
    CHECK(c->admin.address == "127.0.0.1");
    CHECK(c->limits.max_connections == 10000);
    CHECK(c->engine.activation_precision == engine::ActivationPrecision::kExact);
    CHECK(c->engine.max_decode_sequences == 0);
    CHECK(c->listener.certificate_watch == std::chrono::milliseconds(5000));
}

TEST_CASE("listeners.public.certificate_watch_ms: 0 turns the watch off, under 100 is refused") {
    auto with = [](const std::string& value) {
        std::string yaml = testing::config_yaml("/c", "/k");
        yaml.replace(yaml.find("    certificates:"), 0,
                     "    certificate_watch_ms: " + value + "\n");
        return parse_config(yaml, "/etc/edgeserve/test.yaml");
    };
    Result<Config> off = with("0");
    REQUIRE(off.ok());
    CHECK(off->listener.certificate_watch.count() == 0);
    Result<Config> fast = with("250");
    REQUIRE(fast.ok());
    CHECK(fast->listener.certificate_watch == std::chrono::milliseconds(250));
    Result<Config> bad = with("-1");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().message().find("test.yaml:5:") != std::string::npos);
    CHECK(bad.status().message().find("listeners.public.certificate_watch_ms") !=
          std::string::npos);
    // Below the floor the one-poll settle window means nothing and the idle daemon spins.
    for (const char* tiny : {"1", "99"}) {
        Result<Config> refused = with(tiny);
        REQUIRE_FALSE(refused.ok());
        const std::string& message = refused.status().message();
        CHECK(message.find("test.yaml:5:") != std::string::npos);
        CHECK(message.find("listeners.public.certificate_watch_ms") != std::string::npos);
        CHECK(message.find("at least 100 ms") != std::string::npos);
    }
    Result<Config> floor = with("100");
    REQUIRE(floor.ok());
    CHECK(floor->listener.certificate_watch == std::chrono::milliseconds(100));
    // A changed interval waits for a restart, like the other listener settings.
    CHECK(changed_restart_sections(*off, *fast) == std::vector<std::string>{"listeners"});
}

TEST_CASE("listeners.admin.host_names: DNS names or a lone \"*\"; bad entries named with the key") {
    auto with = [](const std::string& value) {
        std::string yaml = testing::config_yaml("/c", "/k");
        yaml.replace(yaml.find("    port: 0\nsite:"), 0, "    host_names: " + value + "\n");
        return parse_config(yaml, "/etc/edgeserve/test.yaml");
    };
    Result<Config> none = parse_config(testing::config_yaml("/c", "/k"), "x.yaml");
    REQUIRE(none.ok());
    CHECK(none->admin.host_names.empty());
    // Kept as written (compared without case); an IP literal is taken anyway and let through.
    Result<Config> names =
        with("[Admin.Fra1.example, prometheus_target, 10.0.0.5, '[::1]', '::1']");
    REQUIRE_MESSAGE(names.ok(), names.status().message());
    CHECK(names->admin.host_names == std::vector<std::string>{"Admin.Fra1.example",
                                                              "prometheus_target", "10.0.0.5",
                                                              "[::1]", "::1"});
    Result<Config> any = with("['*']");
    REQUIRE(any.ok());
    CHECK(any->admin.host_names == std::vector<std::string>{"*"});
    CHECK(with("[]").ok());
    const std::vector<std::pair<std::string, std::string>> refused = {
        {"admin.example", "expected a list of strings"},
        {"[a.example, '']", "listeners.admin.host_names[1]: must not be empty"},
        {"['admin.example:9443']",
         "listeners.admin.host_names[0]: 'admin.example:9443' has a port: list the name alone"},
        {"['[::1]:9443']", "listeners.admin.host_names[0]: '[::1]:9443' has a port"},
        {"['admin .example']",
         "listeners.admin.host_names[0]: 'admin .example' is not a DNS name"},
        {"[' admin.example']", "' admin.example' is not a DNS name"},
        {"['*.example.org']",
         "listeners.admin.host_names[0]: '*.example.org' is not a DNS name (letters, digits, '-', "
         "'_' and '.'; a lone \"*\" accepts any Host)"},
        {"['http://admin.example']", "'http://admin.example' is not a DNS name"},
        {"[admin.example, '*']",
         "listeners.admin.host_names[1]: \"*\" accepts any Host and turns the check off: list it "
         "alone"},
    };
    for (const auto& [value, message] : refused) {
        Result<Config> bad = with(value);
        REQUIRE_FALSE_MESSAGE(bad.ok(), value);
        CHECK_MESSAGE(bad.status().message().find(message) != std::string::npos,
                      value << ": " << bad.status().message());
        CHECK(bad.status().message().find("test.yaml:11:") != std::string::npos);
    }
    // Restart-only, as the listener's address and port are.
    CHECK(changed_restart_sections(*none, *names) == std::vector<std::string>{"listeners"});
}

TEST_CASE("nested aliases (a billion laughs) are checked in linear time, then refused by key") {
    // 10^12 paths through 12 levels of ten aliases each: each node must be visited once.
    std::string yaml = "a0: &a0 [\"x\", 'y', z]\n";
    for (int level = 1; level <= 12; ++level) {
        yaml += "a" + std::to_string(level) + ": &a" + std::to_string(level) + " [";
        for (int i = 0; i < 10; ++i) {
            yaml += (i > 0 ? ", *a" : "*a") + std::to_string(level - 1);
        }
        yaml += "]\n";
    }
    Result<Config> c = parse_config(yaml, "/etc/edgeserve/bomb.yaml");
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().message().find("a0") != std::string::npos);  // The unknown key, named.
}

TEST_CASE("unknown keys are rejected with file:line:column and the key path") {
    std::string e = error_of(testing::config_yaml("/c", "/k", "limits:\n  header_timeout: 5\n"));
    CHECK(e == "/etc/edgeserve/test.yaml:18:3: limits.header_timeout: unknown key");
    CHECK(error_of(testing::config_yaml("/c", "/k", "gossip:\n  prot: 1\n")) ==
          "/etc/edgeserve/test.yaml:18:3: gossip.prot: unknown key");
}

TEST_CASE("type and range errors name the place") {
    CHECK(error_of(testing::config_yaml("/c", "/k", "limits:\n  max_connections: lots\n")) ==
          "/etc/edgeserve/test.yaml:18:20: limits.max_connections: expected an integer");
    CHECK(error_of(testing::config_yaml("/c", "/k", "engine:\n  threads: -1\n"))
              .find("engine.threads: must be in 0..4096") != std::string::npos);
    CHECK(error_of(testing::config_yaml("/c", "/k", "engine:\n  activation_precision: fp8\n"))
              .find("engine.activation_precision: expected exact or bf16") != std::string::npos);
    CHECK(error_of(testing::config_yaml("/c", "/k", "engine:\n  cpu_kernels: sse4\n"))
              .find("engine.cpu_kernels: expected auto, amx_bf16, avx512_bf16") !=
          std::string::npos);
    CHECK(error_of(testing::config_yaml("/c", "/k", "engine:\n  max_decode_sequences: -1\n"))
              .find("engine.max_decode_sequences: must be in 0..65536") != std::string::npos);
    // A step budget the decodes can fill leaves no room for prefill.
    CHECK(error_of(testing::config_yaml("/c", "/k", "engine:\n  max_batch_tokens: 64\n"))
              .find("engine: max_batch_tokens (64) must exceed the sequences that decode in one "
                    "step (64: ") != std::string::npos);
    CHECK(error_of(testing::config_yaml(
                       "/c", "/k",
                       "engine:\n  max_batch_tokens: 64\n  max_decode_sequences: 64\n"))
              .find("max_batch_tokens (64) must exceed") != std::string::npos);
    CHECK(parse_config(testing::config_yaml(
                           "/c", "/k",
                           "engine:\n  max_batch_tokens: 64\n  max_decode_sequences: 40\n"),
                       "/x.yaml")
              .ok());
    std::string yaml = testing::config_yaml("/c", "/k");
    yaml.replace(yaml.find("latitude: 50.1"), 14, "latitude: 95");
    CHECK(error_of(yaml).find("site.latitude: must be in -90..90") != std::string::npos);
    // A site in a cluster gives its position; one alone need not.
    std::string unplaced = testing::config_yaml("/c", "/k");
    unplaced.erase(unplaced.find("  longitude: 8.7\n"), 17);
    CHECK(parse_config(unplaced, "/x.yaml").ok());
    CHECK(error_of(unplaced + "gossip:\n  port: 0\n") ==
          "/etc/edgeserve/test.yaml:13:3: site: missing 'longitude': a site in a cluster "
          "(`gossip`) gives its "
          "position");
    CHECK(error_of(testing::config_yaml("/c", "/k",
                                        "tenants:\n  - name: a\n    api_key_sha256: [abc]\n"))
              .find("tenants[0].api_key_sha256[0]: tenant 'a': expected the key's SHA-256 as "
                    "64 hex digits") != std::string::npos);
    CHECK(error_of(testing::config_yaml("/c", "/k",
                                        "tenants:\n  - name: a\n    api_key_sha256: [" +
                                            std::string(64, '0') + "]\n    models: [nope]\n"))
              .find("model 'nope' is not in `models`") != std::string::npos);
    // In a cluster, a model another site serves (a front door serves none).
    CHECK(parse_config(testing::config_yaml("/c", "/k",
                                            "gossip:\n  port: 0\ntenants:\n  - name: a\n"
                                            "    api_key_sha256: [" +
                                                std::string(64, '0') +
                                                "]\n    models: [elsewhere]\n"),
                       "/x.yaml")
              .ok());
    CHECK(error_of(testing::config_yaml("/c", "/k", "proxy_protocol:\n  trusted: [10.0.0.0/40]\n"))
              .find("proxy_protocol.trusted: bad prefix length") != std::string::npos);
    CHECK(error_of(testing::config_yaml("/c", "/k", "proxy_protocol:\n  trusted: [10.1.2.3/8]\n"))
              .find("proxy_protocol.trusted: '10.1.2.3/8' has address bits past its /8 prefix: "
                    "write the range as 10.0.0.0/8, or one address as 10.1.2.3/32") !=
          std::string::npos);
    CHECK(error_of(testing::config_yaml("/c", "/k", "models:\n  - name: a\n"))
              .find("models[0].path: required key missing") != std::string::npos);
    // Model names are gossiped; every site refuses a state holding one past 255 bytes.
    auto model_named = [](const std::string& name) {
        return testing::config_yaml("/c", "/k", "models:\n  - name: " + name + "\n    path: /m\n");
    };
    CHECK(error_of(model_named(std::string(256, 'm')))
              .find("models[0].name: must be 1 to 255 bytes") != std::string::npos);
    CHECK(error_of(model_named("\"\"")).find("models[0].name: must be 1 to 255 bytes") !=
          std::string::npos);
    CHECK(parse_config(model_named(std::string(255, 'm')), "x.yaml").ok());
}

TEST_CASE("YAML syntax errors and missing sections") {
    CHECK(error_of("listeners: [unclosed\n").find("/etc/edgeserve/test.yaml:2:1:") == 0);
    CHECK(error_of("site: {id: x}\n").find("listeners: required key missing") !=
          std::string::npos);
    CHECK(error_of("").find("empty configuration") != std::string::npos);
    CHECK(error_of("- a\n- b\n").find("expected a mapping") != std::string::npos);
}

TEST_CASE("relative paths resolve against the config's directory, made absolute") {
    // A config named without a directory: its paths are relative to where the daemon started,
    // and stay pointing there (in values and in errors) whatever happens later.
    Result<Config> c = parse_config(testing::config_yaml("c.pem", "k.pem"), "edgeserve.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    const std::string cwd = std::filesystem::current_path().string();
    CHECK(c->listener.certificates[0].cert_path == cwd + "/c.pem");
    Result<Config> d = parse_config(testing::config_yaml("../c.pem", "k.pem"), "conf/e.yaml");
    REQUIRE(d.ok());
    CHECK(d->listener.certificates[0].cert_path ==
          (std::filesystem::current_path() / "c.pem").lexically_normal().string());
}

TEST_CASE("load_config reports an unreadable file") {
    Result<Config> c = load_config("/nonexistent/edgeserve.yaml");
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kNotFound);
    testing::TempDir dir;
    std::string path = dir.write("e.yaml", testing::config_yaml("c", "k", "bogus: 1\n"));
    Result<Config> bad = load_config(path);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().message() == path + ":17:1: bogus: unknown key");
}

TEST_CASE("load_config refuses the testing-only peer delay unless EDGESERVE_TESTING=1") {
    testing::TempDir dir;
    std::string path = dir.write(
        "t.yaml", testing::config_yaml("c", "k", "gossip:\n  testing_peer_delay_ms: {sin: 5}\n"));
    const char* saved = std::getenv("EDGESERVE_TESTING");
    const std::string before = saved ? saved : "";
    unsetenv("EDGESERVE_TESTING");
    Result<Config> refused = load_config(path);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().message().find(path + ": gossip.testing_peer_delay_ms is for tests "
                                                 "only") == 0);
    CHECK(refused.status().message().find("EDGESERVE_TESTING=1") != std::string::npos);
    setenv("EDGESERVE_TESTING", "yes", 1);
    CHECK_FALSE(load_config(path).ok());
    setenv("EDGESERVE_TESTING", "1", 1);
    Result<Config> allowed = load_config(path);
    REQUIRE_MESSAGE(allowed.ok(), allowed.status().to_string());
    CHECK(allowed->gossip.testing_peer_delay.at("sin") == std::chrono::milliseconds(5));
    if (saved) {
        setenv("EDGESERVE_TESTING", before.c_str(), 1);
    } else {
        unsetenv("EDGESERVE_TESTING");
    }
    // Without the key the environment does not matter.
    std::string plain = dir.write("p.yaml", testing::config_yaml("c", "k"));
    CHECK(load_config(plain).ok());
}

TEST_CASE("tenant limits: parsed with defaults, bad values named by file:line:column") {
    const std::string hash = std::string(64, '0');
    Result<Config> c = parse_config(
        testing::config_yaml("/c", "/k",
                             "tenants:\n  - name: a\n    api_key_sha256: [" + hash + ", " +
                                 std::string(64, '1') +
                                 "]\n    weight: 3\n    priority: 7\n"
                                 "    requests_per_second: 5\n    burst: 10\n"
                                 "    input_tokens_per_minute: 6000\n"
                                 "    output_tokens_per_minute: 1200\n"
                                 "    max_concurrent: 2\n    max_context_tokens: 512\n"
                                 "    max_output_tokens: 128\n"
                                 "  - name: b\n    api_key_sha256: [" +
                                 std::string(64, '2') + "]\n"),
        "x.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    const TenantConfig& a = (*c->tenants)[0];
    CHECK(a.api_key_sha256.size() == 2);
    CHECK(a.weight == 3);
    CHECK(a.priority == 7);
    CHECK(a.requests_per_second == 5);
    CHECK(a.burst == 10);
    CHECK(a.input_tokens_per_minute == 6000);
    CHECK(a.output_tokens_per_minute == 1200);
    CHECK(a.max_concurrent == 2);
    CHECK(a.max_context_tokens == 512);
    CHECK(a.max_output_tokens == 128);
    const TenantConfig& b = (*c->tenants)[1];
    CHECK(b.weight == 1);
    CHECK(b.requests_per_second == 0);
    CHECK(b.max_concurrent == 0);

    auto tenant = [&](const std::string& lines) {
        return error_of(testing::config_yaml(
            "/c", "/k", "tenants:\n  - name: a\n    api_key_sha256: [" + hash + "]\n" + lines));
    };
    CHECK(tenant("    weight: 0\n") ==
          "/etc/edgeserve/test.yaml:20:13: tenants[0].weight: must be in 1..10000");
    CHECK(tenant("    max_concurrent: -1\n") ==
          "/etc/edgeserve/test.yaml:20:21: tenants[0].max_concurrent: must be in 0..1000000");
    CHECK(tenant("    requests_per_second: fast\n") ==
          "/etc/edgeserve/test.yaml:20:26: tenants[0].requests_per_second: expected a number");
    CHECK(tenant("    requests_per_second: 0.01\n") ==
          "/etc/edgeserve/test.yaml:20:26: tenants[0].requests_per_second: below one request per "
          "minute; 0 means unlimited");
    CHECK(tenant("    burst: 5\n") ==
          "/etc/edgeserve/test.yaml:20:12: tenants[0].burst: needs requests_per_second (burst "
          "alone limits nothing)");
    CHECK(tenant("    max_context_tokens: 10\n    max_output_tokens: 20\n") ==
          "/etc/edgeserve/test.yaml:21:24: tenants[0].max_output_tokens: larger than "
          "max_context_tokens");
    CHECK(tenant("    rate: 5\n") == "/etc/edgeserve/test.yaml:20:5: tenants[0].rate: unknown key");
}

TEST_CASE("routing section: milliseconds become seconds, defaults stay, bad keys are errors") {
    Result<Config> c = parse_config(testing::config_yaml("/c", "/k",
                                                         "routing:\n"
                                                         "  path_inflation: 2\n"
                                                         "  margin_ms: 7.5\n"
                                                         "  margin_fraction: 0.2\n"
                                                         "  local_hysteresis_ms: 20\n"
                                                         "  suspect_penalty_ms: 1000\n"
                                                         "  ejected_penalty_ms: 60000\n"
                                                         "  degraded_penalty_ms: 50\n"
                                                         "  coord_error_max: 0.3\n"),
                                    "/etc/edgeserve/test.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->routing.cost.path_inflation == doctest::Approx(2.0));
    CHECK(c->routing.selection.margin_s == doctest::Approx(0.0075));
    CHECK(c->routing.selection.margin_fraction == doctest::Approx(0.2));
    CHECK(c->routing.selection.local_hysteresis_s == doctest::Approx(0.020));
    CHECK(c->routing.cost.suspect_penalty_s == doctest::Approx(1.0));
    CHECK(c->routing.cost.ejected_penalty_s == doctest::Approx(60.0));
    CHECK(c->routing.cost.degraded_penalty_s == doctest::Approx(0.05));
    CHECK(c->routing.cost.coord_error_max == doctest::Approx(0.3));
    CHECK(c->routing.cost.prompt_tokens == doctest::Approx(512.0));

    Result<Config> d = parse_config(testing::config_yaml("/c", "/k", ""), "/x.yaml");
    REQUIRE(d.ok());
    CHECK(d->routing.cost.path_inflation == doctest::Approx(1.5));
    CHECK(d->routing.selection.local_hysteresis_s == doctest::Approx(0.010));

    CHECK(error_of(testing::config_yaml("/c", "/k", "routing:\n  margin: 5\n")) ==
          "/etc/edgeserve/test.yaml:18:3: routing.margin: unknown key");
    CHECK(error_of(testing::config_yaml("/c", "/k", "routing:\n  path_inflation: 0.5\n")) ==
          "/etc/edgeserve/test.yaml:18:19: routing.path_inflation: must be in 1..10");
    CHECK(error_of(testing::config_yaml("/c", "/k", "routing:\n  margin_ms: soon\n")) ==
          "/etc/edgeserve/test.yaml:18:14: routing.margin_ms: expected a number");
    // Values that would call every pool, an idle one too, saturated.
    CHECK(error_of(testing::config_yaml("/c", "/k", "routing:\n  saturation_queue_per_slot: 0\n"))
              .find("routing.saturation_queue_per_slot: must be in 0.01..") != std::string::npos);
    CHECK(error_of(testing::config_yaml("/c", "/k", "routing:\n  kv_saturated: 0\n"))
              .find("routing: kv_saturated (0) must be above kv_soft_limit (0.8)") !=
          std::string::npos);
    CHECK(error_of(testing::config_yaml("/c", "/k",
                                        "routing:\n  kv_soft_limit: 0.9\n  kv_saturated: 0.9\n"))
              .find("must be above kv_soft_limit") != std::string::npos);
}

TEST_CASE("gossip section: keys, presets and overrides load, absent means no gossip") {
    Result<Config> none = parse_config(testing::config_yaml("/c", "/k", ""), "/x.yaml");
    REQUIRE(none.ok());
    CHECK_FALSE(none->gossip.enabled);
    CHECK(none->routing.version_fallback);

    Result<Config> c = parse_config(
        testing::config_yaml("/c", "/k",
                             "  peer_address: 10.0.0.1:7443\n"
                             "  admin_address: '[fd00::1]:9443'\n"
                             "gossip:\n"
                             "  bind_address: 127.0.0.1\n"
                             "  port: 0\n"
                             "  advertise_address: 10.0.0.1:7946\n"
                             "  join: [10.0.0.2:7946, '[fd00::2]:7946']\n"
                             "  preset: local\n"
                             "  label: prod\n"
                             "  keys: [" + std::string(64, 'a') + "]\n"
                             "  probe_interval_ms: 300\n"
                             "  gossip_interval_ms: 50\n"
                             "  suspicion_mult: 2\n"
                             "  publish_interval_ms: 100\n"
                             "  leave_drain_ms: 0\n"
                             "  health_check_interval_ms: 0\n"
                             "  testing_peer_delay_ms: {sin1: 40, gru1: 0}\n"
                             "routing:\n"
                             "  version_fallback: false\n"
                             "  target_versions: {kimi: abc123}\n"
                             "  outlier:\n"
                             "    consecutive_failures: 2\n"
                             "    base_ejection_ms: 5000\n"
                             "    max_ejection_percent: 50\n"),
        "/etc/edgeserve/test.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->site.peer_address == "10.0.0.1:7443");
    CHECK(c->site.admin_address == "[fd00::1]:9443");
    const GossipConfig& g = c->gossip;
    CHECK(g.enabled);
    CHECK(g.bind_address == "127.0.0.1");
    CHECK(g.port == 0);
    CHECK(g.advertise_address == "10.0.0.1:7946");
    CHECK(g.join == std::vector<std::string>{"10.0.0.2:7946", "[fd00::2]:7946"});
    CHECK(g.preset == "local");
    CHECK(g.label == "prod");
    CHECK(g.keys.size() == 1);
    CHECK(g.probe_interval == std::chrono::milliseconds(300));
    CHECK(g.gossip_interval == std::chrono::milliseconds(50));
    CHECK(g.probe_timeout == std::chrono::milliseconds(0));
    CHECK(g.suspicion_mult == 2);
    CHECK(g.publish_interval == std::chrono::milliseconds(100));
    CHECK(g.leave_drain == std::chrono::milliseconds(0));
    CHECK(g.health_check_interval == std::chrono::milliseconds(0));
    CHECK(g.testing_peer_delay.at("sin1") == std::chrono::milliseconds(40));
    CHECK(g.testing_peer_delay.at("gru1") == std::chrono::milliseconds(0));
    CHECK_FALSE(c->routing.version_fallback);
    CHECK(c->routing.target_versions.at("kimi") == "abc123");
    CHECK(c->routing.outlier.consecutive_failures == 2);
    CHECK(c->routing.outlier.base_ejection_time == std::chrono::seconds(5));
    CHECK(c->routing.outlier.max_ejection_percent == 50);
    CHECK(c->routing.outlier.interval == std::chrono::seconds(10));  // Default kept.

    Result<Config> bare = parse_config(testing::config_yaml("/c", "/k", "gossip:\n"), "/x.yaml");
    REQUIRE_MESSAGE(bare.ok(), bare.status().to_string());
    CHECK(bare->gossip.enabled);
    CHECK(bare->gossip.port == 7946);
    CHECK(bare->gossip.preset == "lan");
    CHECK(bare->gossip.health_check_interval == std::chrono::milliseconds(2000));
}

TEST_CASE("gossip.snapshot_file: parsed, STATE_DIRECTORY's default, empty for none, bad values") {
    const char* saved = std::getenv("STATE_DIRECTORY");
    const std::string before = saved ? saved : "";
    auto gossip = [](const std::string& body) {
        return parse_config(testing::config_yaml("/c", "/k", "gossip:\n" + body),
                            "/etc/edgeserve/test.yaml");
    };
    unsetenv("STATE_DIRECTORY");
    Result<Config> none = gossip("  port: 0\n");
    REQUIRE_MESSAGE(none.ok(), none.status().to_string());
    CHECK(none->gossip.snapshot_file.empty());
    // A relative path is the config directory's, as every path in it.
    Result<Config> rel = gossip("  snapshot_file: state/gossip.snap\n");
    REQUIRE_MESSAGE(rel.ok(), rel.status().to_string());
    CHECK(rel->gossip.snapshot_file == "/etc/edgeserve/state/gossip.snap");

    // systemd's StateDirectory=edgeserve: the default is in it (the first of its paths), also for
    // a bare `gossip:`; the key overrides it, and "" turns the snapshot off.
    setenv("STATE_DIRECTORY", "/var/lib/edgeserve:/var/lib/other", 1);
    Result<Config> dflt = gossip("  port: 0\n");
    REQUIRE(dflt.ok());
    CHECK(dflt->gossip.snapshot_file == "/var/lib/edgeserve/gossip.snapshot");
    Result<Config> bare = parse_config(testing::config_yaml("/c", "/k", "gossip:\n"), "/x.yaml");
    REQUIRE(bare.ok());
    CHECK(bare->gossip.snapshot_file == "/var/lib/edgeserve/gossip.snapshot");
    Result<Config> set = gossip("  snapshot_file: /srv/edge/snap\n");
    REQUIRE(set.ok());
    CHECK(set->gossip.snapshot_file == "/srv/edge/snap");
    Result<Config> off = gossip("  snapshot_file: ''\n");
    REQUIRE(off.ok());
    CHECK(off->gossip.snapshot_file.empty());
    // No gossip section: no cluster, nothing to keep.
    Result<Config> no_gossip = parse_config(testing::config_yaml("/c", "/k", ""), "/x.yaml");
    REQUIRE(no_gossip.ok());
    CHECK(no_gossip->gossip.snapshot_file.empty());
    setenv("STATE_DIRECTORY", "relative/dir", 1);  // Not what systemd sets: ignored.
    CHECK(gossip("  port: 0\n")->gossip.snapshot_file.empty());
    if (saved) {
        setenv("STATE_DIRECTORY", before.c_str(), 1);
    } else {
        unsetenv("STATE_DIRECTORY");
    }

    CHECK(error_of(testing::config_yaml("/c", "/k", "gossip:\n  snapshot_file: /var/lib/e/\n")) ==
          "/etc/edgeserve/test.yaml:18:18: gossip.snapshot_file: names a directory; expected a "
          "file path (\"\" for none)");
    CHECK(error_of(testing::config_yaml("/c", "/k", "gossip:\n  snapshot_file: [a, b]\n")) ==
          "/etc/edgeserve/test.yaml:18:18: gossip.snapshot_file: expected a string");
    CHECK(error_of(testing::config_yaml("/c", "/k", "gossip:\n  snapshot_file: \"a\\tb\"\n"))
              .find("gossip.snapshot_file: contains a control character") != std::string::npos);
}

TEST_CASE("gossip section: bad values name file, line, column and key") {
    auto gossip = [](const std::string& body) {
        return error_of(testing::config_yaml("/c", "/k", "gossip:\n" + body));
    };
    CHECK(gossip("  preset: moon\n") ==
          "/etc/edgeserve/test.yaml:18:11: gossip.preset: expected lan, wan or local");
    CHECK(gossip("  join: [nohost]\n") ==
          "/etc/edgeserve/test.yaml:18:10: gossip.join[0]: expected host:port");
    CHECK(gossip("  join: ['10.0.0.1:99999']\n") ==
          "/etc/edgeserve/test.yaml:18:10: gossip.join[0]: expected a port in 1..65535 after "
          "the colon");
    CHECK(gossip("  advertise_address: edge1.example.org:7946\n").find(
              "18:22: gossip.advertise_address: expected an IP literal and a port") !=
          std::string::npos);
    // An IPv6 address advertises; a host name is a valid seed (resolved at each attempt).
    CHECK(parse_config(testing::config_yaml("/c", "/k",
                                            "gossip:\n  advertise_address: '[::1]:7946'\n"
                                            "  join: ['seed.example.org:7946']\n"),
                       "/x.yaml")
              .ok());
    CHECK(gossip("  keys: [abcd]\n") ==
          "/etc/edgeserve/test.yaml:18:10: gossip.keys[0]: expected 64 hex digits (an AES-256 "
          "key)");
    CHECK(gossip("  port: 70000\n") ==
          "/etc/edgeserve/test.yaml:18:9: gossip.port: must be in 0..65535");
    CHECK(gossip("  seeds: []\n") == "/etc/edgeserve/test.yaml:18:3: gossip.seeds: unknown key");
    CHECK(gossip("  bind_address: example.org\n") ==
          "/etc/edgeserve/test.yaml:18:17: gossip.bind_address: expected an IP literal (not a "
          "host name)");
    CHECK(gossip("  bind_address: \"::::\"\n").find("18:17: gossip.bind_address: expected an IP") !=
          std::string::npos);
    CHECK(gossip("  testing_peer_delay_ms: {sin1: 20000}\n") ==
          "/etc/edgeserve/test.yaml:18:33: gossip.testing_peer_delay_ms.sin1: must be in "
          "0..10000");
    CHECK(error_of(testing::config_yaml("/c", "/k", "  peer_address: 7443\n")) ==
          "/etc/edgeserve/test.yaml:17:17: site.peer_address: expected host:port");
    // The host is a DNS name or an IP: a '*' there (which the admin listener would take for
    // its "any Host"), a URL or a bracketed name cannot be connected to or sent as a Host.
    for (const std::string bad : {"'*:9443'", "'http://a:9443'", "'a b:9443'", "'[admin]:9443'"}) {
        CAPTURE(bad);
        const std::string e = error_of(testing::config_yaml("/c", "/k", "  admin_address: " + bad +
                                                                          "\n"));
        CHECK(e.find("site.admin_address: ") != std::string::npos);
    }
    CHECK(error_of(testing::config_yaml("/c", "/k", "  admin_address: '*:9443'\n"))
              .find("the host before the port must be a DNS name or an IP address") !=
          std::string::npos);
    CHECK(error_of(testing::config_yaml("/c", "/k",
                                        "routing:\n  outlier:\n    max_ejection_percent: 200\n")) ==
          "/etc/edgeserve/test.yaml:19:27: routing.outlier.max_ejection_percent: must be in "
          "0..100");
}

TEST_CASE("peer section: paths resolved, defaults, required keys and ranges") {
    Result<Config> none = parse_config(testing::config_yaml("/c", "/k", ""), "/x.yaml");
    REQUIRE(none.ok());
    CHECK_FALSE(none->peer.has_value());

    Result<Config> c = parse_config(testing::config_yaml("/c", "/k",
                                                         "peer:\n"
                                                         "  address: 127.0.0.1\n"
                                                         "  port: 0\n"
                                                         "  ca: certs/ca.crt\n"
                                                         "  cert: /abs/site.crt\n"
                                                         "  key: certs/site.key\n"
                                                         "  connect_timeout_ms: 500\n"
                                                         "  deferred_answer_timeout_ms: 0\n"
                                                         "  retry_budget: 0.5\n"
                                                         "  max_idle_connections: 4\n"),
                                    "/etc/edgeserve/test.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    REQUIRE(c->peer.has_value());
    CHECK(c->peer->address == "127.0.0.1");
    CHECK(c->peer->port == 0);
    CHECK(c->peer->ca_path == "/etc/edgeserve/certs/ca.crt");
    CHECK(c->peer->cert_path == "/abs/site.crt");
    CHECK(c->peer->key_path == "/etc/edgeserve/certs/site.key");
    CHECK(c->peer->connect_timeout == std::chrono::milliseconds(500));
    CHECK(c->peer->response_timeout == std::chrono::milliseconds(30'000));
    CHECK(c->peer->deferred_answer_timeout == std::chrono::milliseconds(0));  // 0: none.
    CHECK(PeerConfig{}.deferred_answer_timeout == std::chrono::milliseconds(600'000));
    CHECK(c->peer->retry_budget == doctest::Approx(0.5));
    CHECK(c->peer->min_retry_concurrency == 3);
    CHECK(c->peer->max_idle_connections == 4);

    CHECK(error_of(testing::config_yaml("/c", "/k", "peer:\n  ca: a\n  cert: b\n")) ==
          "/etc/edgeserve/test.yaml:18:3: peer.key: required key missing");
    CHECK(error_of(testing::config_yaml("/c", "/k",
                                        "peer:\n  ca: a\n  cert: b\n  key: c\n"
                                        "  retry_budget: 2\n")) ==
          "/etc/edgeserve/test.yaml:21:17: peer.retry_budget: must be in 0..1");
    CHECK(error_of(testing::config_yaml("/c", "/k", "peer:\n  ca: a\n  cert: b\n  key: c\n"
                                                    "  tls: yes\n")) ==
          "/etc/edgeserve/test.yaml:21:3: peer.tls: unknown key");
}

TEST_CASE("an unterminated quoted string is an error at its opening quote") {
    // yaml-cpp alone accepts these: the string runs to the end of the file and swallows the
    // sections after it (here `tenants`, which would turn authentication off).
    const std::string tenants =
        "tenants:\n  - name: demo\n    api_key_sha256: [" + std::string(64, '0') + "]\n";
    for (const char* open : {"\"fra1", "'fra1"}) {
        std::string yaml = testing::config_yaml("/c", "/k", tenants);
        yaml.replace(yaml.find("id: test-site"), 13, std::string("id: ") + open);
        const std::string e = error_of(yaml);
        CHECK_MESSAGE(e.find("/etc/edgeserve/test.yaml:13:7: unterminated quoted string") == 0, e);
    }
    // Closed strings with escaped quotes, multi-line strings, keys and a BOM all load.
    std::string good = testing::config_yaml(
        "/c", "/k",
        "tenants:\n  - name: 'a-b'\n    \"api_key_sha256\": [\"" + std::string(64, '0') +
            "\"]\nlog:\n  level: \"in\\\n  fo\"\nrouting:\n  target_versions: {'m''x': "
            "\"d\\\"\"}\n");
    Result<Config> c = parse_config("\xEF\xBB\xBF" + good, "/etc/edgeserve/test.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->log.level == "info");
    CHECK(c->routing.target_versions.at("m'x") == "d\"");
    CHECK((*c->tenants)[0].name == "a-b");
    // A later quoted value that never closes, after a BOM.
    const std::string late =
        error_of("\xEF\xBB\xBF" + testing::config_yaml("/c", "/k") + "log:\n  level: \"info\n");
    CHECK_MESSAGE(late.find("/etc/edgeserve/test.yaml:18:10: unterminated quoted string") == 0,
                  late);
}

TEST_CASE("tenant key hashes: a bad one names its tenant and index, a shared one both tenants") {
    const std::string a = std::string(64, 'a');
    auto tenants = [](const std::string& list) {
        return error_of(testing::config_yaml("/c", "/k", "tenants:\n" + list));
    };
    // The same hash under two tenants: refused naming both (it said "key hash listed twice",
    // leaving the operator to search every tenant for the other), a name after its hashes too.
    CHECK(tenants("  - name: acme\n    api_key_sha256: [" + std::string(64, '1') + ", " + a +
                  "]\n  - api_key_sha256: [" + a + "]\n    name: globex\n") ==
          "/etc/edgeserve/test.yaml:20:22: tenants[1].api_key_sha256[0]: tenant 'globex' and "
          "tenant 'acme' (tenants[0].api_key_sha256[1]) list the same key hash; a key must "
          "identify one tenant");
    // Upper case is the same hash.
    CHECK(tenants("  - name: acme\n    api_key_sha256: [" + a + ", " + std::string(64, 'A') +
                  "]\n")
              .ends_with("tenants[0].api_key_sha256[1]: tenant 'acme': key hash listed twice "
                         "(also tenants[0].api_key_sha256[0])"));
    // What is wrong, never the value (it may be the key itself, pasted where its hash belongs).
    auto bad = [&](const std::string& hash) {
        return tenants("  - name: acme\n    api_key_sha256: [" + a + ", \"" + hash + "\"]\n");
    };
    const std::string expected =
        "/etc/edgeserve/test.yaml:19:88: tenants[0].api_key_sha256[1]: tenant 'acme': expected "
        "the key's SHA-256 as 64 hex digits (printf '%s' \"$KEY\" | sha256sum): ";
    CHECK(bad(std::string(64, 'b') + " ") == expected + "character 65 is a space");
    CHECK(bad("\\t" + std::string(64, 'b')) == expected + "character 1 is a tab");
    CHECK(bad(std::string(63, 'b')) == expected + "got 63");
    const std::string pasted = bad("sk-live-0123456789");
    CHECK(pasted == expected + "character 1 is not a hex digit");
    CHECK(pasted.find("sk-live") == std::string::npos);
}

TEST_CASE("site.id, site.region and tenant names are short identifiers") {
    auto site = [](const std::string& from, const std::string& to) {
        std::string yaml = testing::config_yaml("/c", "/k");
        yaml.replace(yaml.find(from), from.size(), to);
        return yaml;
    };
    for (const char* bad : {"\"fra 1\"", "\"\"", "\"fra1\\n\"", "\"a/b\""}) {
        const std::string e = error_of(site("id: test-site", std::string("id: ") + bad));
        CHECK_MESSAGE(e.find("/etc/edgeserve/test.yaml:13:7: site.id: ") == 0, e);
    }
    CHECK(error_of(site("id: test-site", "id: " + std::string(65, 'a')))
              .find("site.id: must be 1 to 64 characters") != std::string::npos);
    CHECK(parse_config(site("id: test-site", "id: " + std::string(64, 'a')), "x.yaml").ok());
    CHECK(error_of(site("region: local", "region: eu central"))
              .find("/etc/edgeserve/test.yaml:14:11: site.region: may hold only letters, digits, "
                    "'.', '_' and "
                    "'-'") == 0);
    CHECK(parse_config(site("region: local", "region: eu-central_2.b"), "x.yaml").ok());
    const std::string tenant = error_of(testing::config_yaml(
        "/c", "/k",
        "tenants:\n  - name: team a\n    api_key_sha256: [" + std::string(64, '0') + "]\n"));
    CHECK_MESSAGE(
        tenant.find("/etc/edgeserve/test.yaml:18:11: tenants[0].name: may hold only") == 0, tenant);
    const std::string reserved = error_of(testing::config_yaml(
        "/c", "/k",
        "tenants:\n  - name: anonymous\n    api_key_sha256: [" + std::string(64, '0') + "]\n"));
    CHECK_MESSAGE(reserved.find("/etc/edgeserve/test.yaml:18:11: tenants[0].name: 'anonymous' is "
                                "reserved") == 0,
                  reserved);
}

TEST_CASE("keys whose documented default is \"\" load written out as \"\" as that default") {
    // What a templating tool that writes every default produces (docs/config.md's `""`).
    auto load = [](const std::string& site, const std::string& gossip) {
        std::string yaml = testing::config_yaml("/c", "/k", site + "gossip:\n  port: 0\n" + gossip);
        yaml.replace(yaml.find("  region: local\n"), 16, "");
        Result<Config> c = parse_config(yaml, "/etc/edgeserve/test.yaml");
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        return *c;
    };
    const Config absent = load("", "");
    for (const char* empty : {"\"\"", "''"}) {
        const std::string e = empty;
        INFO(e);
        const Config written =
            load("  region: " + e + "\n  peer_address: " + e + "\n  admin_address: " + e + "\n",
                 "  label: " + e + "\n  keyring_file: " + e + "\n");
        CHECK(written.site.region == absent.site.region);
        CHECK(written.site.region.empty());
        CHECK(written.site.peer_address == absent.site.peer_address);
        CHECK(written.site.peer_address.empty());
        CHECK(written.site.admin_address == absent.site.admin_address);
        CHECK(written.site.admin_address.empty());
        CHECK(written.gossip.label == absent.gossip.label);
        CHECK(written.gossip.keyring_file == absent.gossip.keyring_file);
        CHECK(written.gossip.keyring_file.empty());
        CHECK(changed_restart_sections(absent, written).empty());
    }
    // Only "" is the default: a key left without a value, or a required one, is still an error.
    CHECK(error_of(testing::config_yaml("/c", "/k", "  peer_address:\n")) ==
          "/etc/edgeserve/test.yaml:17:3: site.peer_address: expected a string");
    std::string no_id = testing::config_yaml("/c", "/k");
    no_id.replace(no_id.find("id: test-site"), 13, "id: \"\"");
    CHECK(error_of(no_id) == "/etc/edgeserve/test.yaml:13:7: site.id: must be 1 to 64 characters");
}

TEST_CASE("an empty value is reported at its key, not at the next token") {
    std::string yaml = testing::config_yaml("/c", "/k");
    yaml.replace(yaml.find("region: local"), 13, "region:\n\n\n");
    CHECK(error_of(yaml) == "/etc/edgeserve/test.yaml:14:3: site.region: expected a string");
    std::string key = testing::config_yaml("/c", "/k");
    key.replace(key.find("key: /k"), 7, "key:");
    CHECK(error_of(key) ==
          "/etc/edgeserve/test.yaml:8:9: listeners.public.certificates[0].key: expected a string");
    // A section left empty, last in the file.
    CHECK(error_of(testing::config_yaml("/c", "/k", "limits:\n")) ==
          "/etc/edgeserve/test.yaml:17:1: limits: expected a mapping");
}

TEST_CASE("empty key lists, duplicate map keys and a second document are errors") {
    const std::string hash = std::string(64, '0');
    const std::string no_keys = error_of(
        testing::config_yaml("/c", "/k", "tenants:\n  - name: a\n    api_key_sha256: []\n"));
    CHECK_MESSAGE(
        no_keys.find(
            "/etc/edgeserve/test.yaml:19:21: tenants[0].api_key_sha256: must list at least "
            "one key hash") == 0,
        no_keys);
    const std::string no_models = error_of(testing::config_yaml(
        "/c", "/k", "tenants:\n  - name: a\n    api_key_sha256: [" + hash + "]\n    models: []\n"));
    CHECK_MESSAGE(no_models.find(
                      "/etc/edgeserve/test.yaml:20:13: tenants[0].models: empty list; omit the key "
                      "to allow every model") == 0,
                  no_models);
    CHECK(error_of(testing::config_yaml("/c", "/k",
                                        "routing:\n  target_versions:\n    m: a\n    m: b\n")) ==
          "/etc/edgeserve/test.yaml:20:5: routing.target_versions.m: duplicate key");
    CHECK(error_of(testing::config_yaml("/c", "/k",
                                        "gossip:\n  testing_peer_delay_ms: {sin: 5, sin: 6}\n")) ==
          "/etc/edgeserve/test.yaml:18:35: gossip.testing_peer_delay_ms.sin: duplicate key");
    const std::string second =
        error_of(testing::config_yaml("/c", "/k", "---\nlimits:\n  max_connections: 5\n"));
    CHECK_MESSAGE(second.find("/etc/edgeserve/test.yaml:17:1: a second YAML document") == 0,
                  second);
    // A leading `---` is still one document, with a comment after it too.
    CHECK(parse_config("---\n" + testing::config_yaml("/c", "/k"), "x.yaml").ok());
    CHECK(parse_config("--- # edgeserve\n" + testing::config_yaml("/c", "/k"), "x.yaml").ok());
    // A document's content may start on its marker line: the next marker starts a second one.
    CHECK(error_of("--- {site: {id: a}}\n--- {site: {id: b}}\n") ==
          "/etc/edgeserve/test.yaml:2:1: a second YAML document (`---` after the first); the "
          "configuration is one document");
}

TEST_CASE("a byte order mark before comments and a leading `---` is still one document") {
    // The mark was read as content, so the `---` that starts the document was a second one.
    const std::string bom = "\xEF\xBB\xBF";
    Result<Config> c =
        parse_config(bom + "# edgeserve\n---\n" + testing::config_yaml("/c", "/k"), "x.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->site.id == "test-site");
    CHECK(parse_config(bom + "---\n" + testing::config_yaml("/c", "/k"), "x.yaml").ok());
    // A second document after it is still refused, at its line.
    const std::string second = error_of(bom + "# edgeserve\n---\n" +
                                        testing::config_yaml("/c", "/k") + "---\nlimits: {}\n");
    CHECK_MESSAGE(second.starts_with("/etc/edgeserve/test.yaml:19:1: a second YAML document"),
                  second);
}

TEST_CASE("bytes that are not UTF-8 are an error at their line and column") {
    // yaml-cpp passes them through: a Latin-1 model name would be listed in /v1/models as JSON
    // no client decodes, and never match the UTF-8 name clients send.
    const std::string latin1 = error_of(
        testing::config_yaml("/c", "/k", "models:\n  - name: caf\xE9\n    path: /m\n"));
    CHECK_MESSAGE(latin1 ==
                      "/etc/edgeserve/test.yaml:18:14: byte 0xE9 is not UTF-8; the "
                      "configuration is UTF-8 text",
                  latin1);
    // In a comment too, and a sequence cut short by the end of the file.
    CHECK(error_of(testing::config_yaml("/c", "/k", "# \xFF\n"))
              .starts_with("/etc/edgeserve/test.yaml:17:3: byte 0xFF is not UTF-8"));
    CHECK(error_of(testing::config_yaml("/c", "/k", "# caf\xC3"))
              .starts_with("/etc/edgeserve/test.yaml:17:6: byte 0xC3 is not UTF-8"));
    Result<Config> utf8 = parse_config(
        testing::config_yaml("/c", "/k",
                             "# \xE2\x9C\x93\nmodels:\n  - name: caf\xC3\xA9\n    path: /m\n"),
        "x.yaml");
    REQUIRE_MESSAGE(utf8.ok(), utf8.status().to_string());
    CHECK(utf8->models.at(0).name == "caf\xC3\xA9");
}

TEST_CASE("a tab in the indentation is named in the parse error") {
    // yaml-cpp's own messages ("end of map not found", "illegal map value") say nothing of tabs.
    const std::string nested =
        error_of(testing::config_yaml("/c", "/k", "models:\n  - name: m\n\t  path: /m\n"));
    CHECK_MESSAGE(nested.find("(line 19 is indented with a tab; YAML indents with spaces only)") !=
                      std::string::npos,
                  nested);
    CHECK(nested.starts_with("/etc/edgeserve/test.yaml:"));
    const std::string top =
        error_of(testing::config_yaml("/c", "/k", "limits:\n\tmax_connections: 5\n"));
    CHECK_MESSAGE(top.find("(line 18 is indented with a tab") != std::string::npos, top);
    // A tab after the indentation is a separator, not indentation, and nothing is added to an
    // error with no tab near it.
    CHECK(
        parse_config(testing::config_yaml("/c", "/k", "limits:\n  max_connections:\t5\n"), "x.yaml")
            .ok());
    const std::string plain =
        error_of(testing::config_yaml("/c", "/k", "limits:\n  max_connections: [5\n"));
    CHECK(plain.find("tab") == std::string::npos);
}

TEST_CASE("content after a `...` end marker is an error, not silently dropped") {
    // yaml-cpp reads the first document and drops the rest: the tenants after the marker would
    // vanish and the daemon would start with authentication off.
    const std::string hash = std::string(64, '0');
    const std::string tenants = "tenants:\n  - name: a\n    api_key_sha256: [" + hash + "]\n";
    const std::string after =
        error_of(testing::config_yaml("/c", "/k", "...\n# a comment\n\n" + tenants));
    CHECK_MESSAGE(after ==
                      "/etc/edgeserve/test.yaml:20:1: content after the end of the document (`...` "
                      "on line 17); the configuration is one document",
                  after);
    // A second document after the marker is refused too (at its marker).
    CHECK(error_of(testing::config_yaml("/c", "/k", "...\n---\n" + tenants))
              .starts_with("/etc/edgeserve/test.yaml:18:1: a second YAML document"));
    // A final `...` with only comments and blank lines after it ends the one document.
    Result<Config> ended =
        parse_config(testing::config_yaml("/c", "/k", tenants + "...\n# end\n\n"), "x.yaml");
    REQUIRE_MESSAGE(ended.ok(), ended.status().to_string());
    CHECK(ended->tenants.has_value());
    // `...` inside a value is not a marker.
    CHECK(parse_config(testing::config_yaml("/c", "/k", "site:\n  region: ...x\n"), "x.yaml")
              .status()
              .message()
              .find("content after the end") == std::string::npos);
}

TEST_CASE("integers are decimal: no octal, hex or quoted numbers, and booleans are not quoted") {
    auto limits = [](const std::string& line) {
        return error_of(testing::config_yaml("/c", "/k", "limits:\n  " + line + "\n"));
    };
    // yaml-cpp alone read 030000 as octal (12288 ms) and 0x10 as 16.
    CHECK(limits("drain_deadline_ms: 030000") ==
          "/etc/edgeserve/test.yaml:18:22: limits.drain_deadline_ms: expected a decimal integer "
          "without leading zeros (YAML 1.1 reads a leading 0 as octal)");
    CHECK(limits("max_connections: 0x10") ==
          "/etc/edgeserve/test.yaml:18:20: limits.max_connections: expected an integer");
    CHECK(limits("max_connections: \"100\"") ==
          "/etc/edgeserve/test.yaml:18:20: limits.max_connections: expected an integer");
    CHECK(limits("max_connections: 1e3") ==
          "/etc/edgeserve/test.yaml:18:20: limits.max_connections: expected an integer");
    CHECK(limits("max_connections: +-5") ==
          "/etc/edgeserve/test.yaml:18:20: limits.max_connections: expected an integer");
    CHECK(limits("max_connections: 99999999999999999999999") ==
          "/etc/edgeserve/test.yaml:18:20: limits.max_connections: must be in 1..4194304");
    // Decimal with a sign, and a lone 0, still read.
    Result<Config> plus = parse_config(
        testing::config_yaml("/c", "/k", "limits:\n  max_connections: +250\n"), "x.yaml");
    REQUIRE_MESSAGE(plus.ok(), plus.status().to_string());
    CHECK(plus->limits.max_connections == 250);
    Result<Config> zero = parse_config(
        testing::config_yaml("/c", "/k", "engine:\n  max_decode_sequences: 0\n"), "x.yaml");
    REQUIRE_MESSAGE(zero.ok(), zero.status().to_string());
    CHECK(zero->engine.max_decode_sequences == 0);
    CHECK(parse_config(testing::config_yaml("/c", "/k", "engine:\n  max_decode_sequences: -0\n"),
                       "x.yaml")
              .ok());
    CHECK(error_of(testing::config_yaml("/c", "/k", "engine:\n  prefix_cache: \"true\"\n")) ==
          "/etc/edgeserve/test.yaml:18:17: engine.prefix_cache: expected true or false");
}

TEST_CASE("real numbers refuse a digit-only leading zero as integers do") {
    // yaml-cpp read `010` as 10 where a real number belongs, and as an error where an integer
    // does; YAML 1.1 tools read it as 8.
    CHECK(error_of(testing::config_yaml("/c", "/k", "routing:\n  margin_fraction: 010\n")) ==
          "/etc/edgeserve/test.yaml:18:20: routing.margin_fraction: expected a decimal integer "
          "without leading zeros (YAML 1.1 reads a leading 0 as octal)");
    const std::string tenant =
        "tenants:\n  - name: a\n    api_key_sha256: [" + std::string(64, '0') + "]\n";
    CHECK(error_of(testing::config_yaml("/c", "/k", tenant + "    requests_per_second: +010\n")) ==
          "/etc/edgeserve/test.yaml:20:26: tenants[0].requests_per_second: expected a decimal "
          "integer without leading zeros (YAML 1.1 reads a leading 0 as octal)");
    CHECK(error_of(testing::config_yaml("/c", "/k", "routing:\n  coord_error_max: -00\n"))
              .find("without leading zeros") != std::string::npos);
    // A lone 0, and a leading 0 with a fraction or an exponent, are no octal: they still read.
    Result<Config> c = parse_config(
        testing::config_yaml("/c", "/k",
                             "routing:\n  margin_fraction: 0\n  kv_soft_limit: 00.5\n"
                             "  prompt_tokens: 010e1\n" +
                                 tenant + "    requests_per_second: 10\n"),
        "x.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    CHECK(c->routing.selection.margin_fraction == 0);
    CHECK(c->routing.cost.kv_soft_limit == doctest::Approx(0.5));
    CHECK(c->routing.cost.prompt_tokens == doctest::Approx(100));
    CHECK((*c->tenants)[0].requests_per_second == 10);
}

TEST_CASE("gossip.join_retry_interval_ms and gossip.max_inbound_streams reach the membership") {
    Result<Config> d = parse_config(testing::config_yaml("/c", "/k", "gossip:\n"), "x.yaml");
    REQUIRE_MESSAGE(d.ok(), d.status().to_string());
    Result<routing::membership::MembershipConfig> defaults = cluster::membership_config(*d);
    REQUIRE(defaults.ok());
    CHECK(defaults->join_retry_interval == std::chrono::seconds(1));
    CHECK(defaults->max_inbound_streams == 64);
    Result<Config> c = parse_config(
        testing::config_yaml("/c", "/k",
                             "gossip:\n  join_retry_interval_ms: 250\n  max_inbound_streams: 8\n"),
        "x.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    Result<routing::membership::MembershipConfig> m = cluster::membership_config(*c);
    REQUIRE(m.ok());
    CHECK(m->join_retry_interval == std::chrono::milliseconds(250));
    CHECK(m->max_inbound_streams == 8);
    CHECK(
        error_of(testing::config_yaml("/c", "/k", "gossip:\n  join_retry_interval_ms: 30001\n")) ==
        "/etc/edgeserve/test.yaml:18:27: gossip.join_retry_interval_ms: must be in 0..30000");
    CHECK(error_of(testing::config_yaml("/c", "/k", "gossip:\n  max_inbound_streams: -1\n")) ==
          "/etc/edgeserve/test.yaml:18:24: gossip.max_inbound_streams: must be in 0..65536");
}

TEST_CASE("routing's saturation line reaches the membership, which gossips crossing it") {
    Result<Config> c = parse_config(
        testing::config_yaml("/c", "/k",
                             "gossip:\n"
                             "routing:\n  kv_saturated: 0.9\n  saturation_queue_per_slot: 2\n"),
        "x.yaml");
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    Result<routing::membership::MembershipConfig> m = cluster::membership_config(*c);
    REQUIRE(m.ok());
    CHECK(m->saturation.kv_saturated == doctest::Approx(0.9));
    CHECK(m->saturation.queue_per_slot == doctest::Approx(2));
}

TEST_CASE("gossip.max_members and gossip.max_fetches_in_flight reach the membership") {
    auto membership = [](const std::string& gossip) {
        Result<Config> c = parse_config(testing::config_yaml("/c", "/k", gossip), "x.yaml");
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        return cluster::membership_config(*c);
    };
    Result<routing::membership::MembershipConfig> defaults = membership("gossip:\n");
    REQUIRE(defaults.ok());
    CHECK(defaults->max_members == 65536);
    CHECK(defaults->max_fetches_in_flight == 32);
    Result<routing::membership::MembershipConfig> m =
        membership("gossip:\n  max_members: 300\n  max_fetches_in_flight: 2\n");
    REQUIRE(m.ok());
    CHECK(m->max_members == 300);
    CHECK(m->max_fetches_in_flight == 2);
    Result<routing::membership::MembershipConfig> one = membership("gossip:\n  max_members: 1\n");
    REQUIRE_FALSE(one.ok());
    CHECK(one.status().message() ==
          "x.yaml: gossip: membership config: max_members must be at least 2 and "
          "max_fetches_in_flight at least 1");
    CHECK(error_of(testing::config_yaml("/c", "/k", "gossip:\n  max_fetches_in_flight: 5000\n")) ==
          "/etc/edgeserve/test.yaml:18:26: gossip.max_fetches_in_flight: must be in 0..4096");
    CHECK(error_of(testing::config_yaml("/c", "/k", "gossip:\n  max_members: 20000000\n")) ==
          "/etc/edgeserve/test.yaml:18:16: gossip.max_members: must be in 0..16777216");
}

TEST_CASE("changed_restart_sections names what a reload does not apply") {
    auto load = [](const std::string& extra, const std::string& cert = "/c") {
        Result<Config> c = parse_config(testing::config_yaml(cert, "/k", extra), "x.yaml");
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        return *c;
    };
    const std::string hash = std::string(64, '0');
    const Config running = load("limits:\n  max_body_bytes: 65536\n");
    // Comments, layout, tenants and certificate paths: nothing to restart for.
    CHECK(changed_restart_sections(
              running, load("# a comment\nlimits: {max_body_bytes: 65536}\ntenants:\n  - name: a\n"
                            "    api_key_sha256: [" +
                                hash + "]\n",
                            "/other.crt"))
              .empty());
    // The limits are reloaded (new connections get them): only the log level waits here.
    CHECK(changed_restart_sections(running, load("limits:\n  max_body_bytes: 4096\nlog:\n"
                                                 "  level: warn\n")) ==
          std::vector<std::string>{"log"});
    CHECK(changed_restart_sections(running, load("")).empty());
    CHECK(changed_restart_sections(running, load("limits:\n  max_connections: 5\n"
                                                 "  drain_deadline_ms: 1000\n"))
              .empty());
    // Gossip keys are reloaded; the rest of the gossip section is not.
    const std::string k1(64, '1'), k2(64, '2');
    const Config keyed = load("gossip:\n  keys: [" + k1 + "]\n  probe_interval_ms: 500\n");
    CHECK(changed_restart_sections(keyed, load("gossip:\n  keys: [" + k2 + ", " + k1 +
                                               "]\n  keyring_file: /k.txt\n"
                                               "  probe_interval_ms: 500\n"))
              .empty());
    CHECK(changed_restart_sections(keyed, load("gossip:\n  keys: [" + k1 + "]\n"
                                               "  probe_interval_ms: 400\n")) ==
          std::vector<std::string>{"gossip"});
    std::string port = testing::config_yaml("/c", "/k", "limits:\n  max_body_bytes: 65536\n");
    port.replace(port.find("port: 0"), 7, "port: 8443");
    Result<Config> moved = parse_config(port, "x.yaml");
    REQUIRE(moved.ok());
    CHECK(changed_restart_sections(running, *moved) == std::vector<std::string>{"listeners"});
    // The routing weights are reloaded; the outlier detector's settings are not.
    CHECK(changed_restart_sections(running, load("limits:\n  max_body_bytes: 65536\n"
                                                 "routing:\n  margin_ms: 6\n"))
              .empty());
    CHECK(changed_restart_sections(running, load("limits:\n  max_body_bytes: 65536\n"
                                                 "routing:\n  outlier:\n"
                                                 "    consecutive_failures: 7\n")) ==
          std::vector<std::string>{"routing"});
}

TEST_CASE("changed_restart_sections ignores reordered keys and defaults written out") {
    auto load = [](const std::string& extra) {
        Result<Config> c = parse_config(testing::config_yaml("/c", "/k", extra), "x.yaml");
        REQUIRE_MESSAGE(c.ok(), c.status().to_string());
        return *c;
    };
    // The auditor's engine section (F4), as a SIGHUP saw it change without a change.
    const Config running = load(
        "engine: {max_batch_sequences: 4, max_queue_per_tenant: 8, max_queue: 20, "
        "kv_cache_bytes: 4194304, cpu_kernels: auto}\nlimits:\n  max_body_bytes: 65536\n");
    // Keys swapped, within a section and between sections.
    CHECK(changed_restart_sections(
              running, load("limits:\n  max_body_bytes: 65536\n"
                            "engine: {max_queue_per_tenant: 8, max_batch_sequences: 4, "
                            "max_queue: 20, kv_cache_bytes: 4194304, cpu_kernels: auto}\n"))
              .empty());
    // A default written out (kv_block_tokens 16), one left out (cpu_kernels auto), a section of
    // defaults only (log).
    CHECK(changed_restart_sections(
              running, load("engine: {max_batch_sequences: 4, max_queue_per_tenant: 8, "
                            "max_queue: 20, kv_cache_bytes: 4194304, kv_block_tokens: 16}\n"
                            "limits:\n  max_body_bytes: 65536\nlog:\n  level: info\n"))
              .empty());
    // A real change is still named, by its section only.
    CHECK(changed_restart_sections(
              running, load("engine: {max_batch_sequences: 4, max_queue_per_tenant: 8, "
                            "max_queue: 20, kv_cache_bytes: 4194304, kv_block_tokens: 32}\n"
                            "limits:\n  max_body_bytes: 65536\n")) ==
          std::vector<std::string>{"engine"});
    CHECK(changed_restart_sections(running,
                                   load("engine: {max_batch_sequences: 4, max_queue_per_tenant: 8, "
                                        "max_queue: 20, kv_cache_bytes: 4194304}\nlimits:\n"
                                        "  max_body_bytes: 65536\nrouting:\n  outlier:\n"
                                        "    consecutive_failures: 7\n")) ==
          std::vector<std::string>{"routing"});
}
