// Daemon::reload, what SIGHUP applies from a re-read config: all of it, or, when any part of it
// does not load, none of it, and the metrics say which; certificate files unchanged since they
// loaded are not rebuilt.

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/metrics.h"
#include "daemon/preflight.h"
#include "daemon/tenants.h"
#include "engine/backend.h"
#include "tests/testing/config_yaml.h"
#include "tests/testing/scripted_daemon.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;

namespace {

std::string tenant_yaml(const std::string& key) {
    return "tenants:\n  - name: acme\n    api_key_sha256: [" + daemon::TenantTable::sha256_hex(key) +
           "]\nmodels:\n  - {name: test-model, path: /m}\n";
}

// The value of the unlabelled series `name` in d's /metrics text; -1 when absent.
double metric(testing::ScriptedDaemon& d, const std::string& name) {
    const std::string text = d.daemon->metrics().serialize();
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 2));
}

// GET /v1/models with `key`: 200 for a key the daemon takes, 401 for one it does not.
int models_status(testing::ScriptedDaemon& d, const std::string& key) {
    return d.call("GET", "/v1/models", "", "Authorization: Bearer " + key + "\r\n").status;
}

}  // namespace

TEST_CASE("reload: a config whose certificate does not load changes nothing, tenants included") {
    testing::ScriptedDaemon d({"test-model"});
    d.start(tenant_yaml("sk-old"));
    REQUIRE(models_status(d, "sk-old") == 200);
    // The start's config counts as loaded, as Prometheus's own series do.
    const std::string successful = "edgeserve_config_last_reload_successful";
    const std::string success_time = "edgeserve_config_last_reload_success_timestamp_seconds";
    CHECK(metric(d, successful) == 1);
    const double started = metric(d, success_time);
    CHECK(started > 1.7e9);

    // A new key and a certificate path that does not exist (a renewal not yet in place).
    auto fresh = daemon::parse_config(
        testing::config_yaml(d.dir.file("missing.crt"), d.cert.key_path, tenant_yaml("sk-new")),
        d.dir.file("c.yaml"));
    REQUIRE(fresh.ok());
    const Status s = d.daemon->reload(*fresh);
    CHECK(s.code() != StatusCode::kOk);
    CHECK_MESSAGE(s.message().find(d.dir.file("c.yaml") + ": listeners.public.certificates[0]") !=
                      std::string::npos,
                  s.message());
    CHECK_MESSAGE(s.message().find("missing.crt") != std::string::npos, s.message());
    CHECK(models_status(d, "sk-old") == 200);  // The old tenants stay...
    CHECK(models_status(d, "sk-new") == 401);  // ...and the new ones are not half applied.
    // What an alert on a refused reload watches (the log is not scraped), and the certificate
    // alert's series: a refused certificate is a failed certificate reload.
    CHECK(metric(d, successful) == 0);
    CHECK(metric(d, success_time) == started);
    CHECK_MESSAGE(
        d.daemon->metrics().serialize().find(
            R"(edgeserve_certificate_reloads_total{listener="public",result="error"} 1)") !=
            std::string::npos,
        d.daemon->metrics().serialize());

    // The same config with a certificate that loads applies whole.
    auto renewed = testing::make_certificate(d.dir.path(), "renewed", {"localhost"});
    fresh = daemon::parse_config(
        testing::config_yaml(renewed.cert_path, renewed.key_path, tenant_yaml("sk-new")),
        d.dir.file("c.yaml"));
    REQUIRE(fresh.ok());
    REQUIRE(d.daemon->reload(*fresh).ok());
    CHECK(models_status(d, "sk-old") == 401);
    CHECK(models_status(d, "sk-new") == 200);
    CHECK(metric(d, successful) == 1);
    // Strictly later: the refused reload above left it at `started`, this one moved it.
    CHECK(metric(d, success_time) > started);
}

TEST_CASE("reload: a config that would turn authentication off keeps the old certificates too") {
    testing::ScriptedDaemon d({"test-model"});
    d.start(tenant_yaml("sk-old"));
    auto renewed = testing::make_certificate(d.dir.path(), "renewed", {"renewed.test"});
    auto fresh = daemon::parse_config(
        testing::config_yaml(renewed.cert_path, renewed.key_path,
                             "models:\n  - {name: test-model, path: /m}\n"),
        d.dir.file("c.yaml"));
    REQUIRE(fresh.ok());
    const Status s = d.daemon->reload(*fresh);
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK_MESSAGE(s.message().find(d.dir.file("c.yaml")) == 0, s.message());
    auto c = testing::TlsClient::connect(d.daemon->public_port());
    REQUIRE(c.ok());
    CHECK((*c)->peer_common_name() == "localhost");  // Not renewed.test: nothing applied.
    CHECK(models_status(d, "sk-old") == 200);
    // The certificates loaded: no certificate reload failed.
    const std::string no_errors =
        R"(edgeserve_certificate_reloads_total{listener="public",result="error"} 0)";
    CHECK_MESSAGE(d.daemon->metrics().serialize().find(no_errors) != std::string::npos,
                  d.daemon->metrics().serialize());
}

TEST_CASE("reload: the first SIGHUP after start rebuilds no certificate files it finds unchanged") {
    testing::ScriptedDaemon d({"test-model"});
    d.start();
    const std::string reloaded =
        R"(edgeserve_certificate_reloads_total{listener="public",result="ok"} 1)";
    // The files the start loaded, untouched since: nothing to rebuild, no reload counted (the
    // error series the start declared stays at 0).
    REQUIRE(d.daemon->reload_certificates().ok());
    CHECK_MESSAGE(d.daemon->metrics().serialize().find(R"(result="ok"})") == std::string::npos,
                  d.daemon->metrics().serialize());
    const std::string no_errors =
        R"(edgeserve_certificate_reloads_total{listener="public",result="error"} 0)";
    CHECK_MESSAGE(d.daemon->metrics().serialize().find(no_errors) != std::string::npos,
                  d.daemon->metrics().serialize());
    // Written again (the same bytes, a new change time): loaded.
    const std::string pem = testing::read_file(d.cert.cert_path);
    std::ofstream(d.cert.cert_path, std::ios::trunc) << pem;
    REQUIRE(d.daemon->reload_certificates().ok());
    CHECK(d.daemon->metrics().serialize().find(reloaded) != std::string::npos);
}

TEST_CASE("reload: new limits apply to the connections accepted after it, open ones keep theirs") {
    const std::string models = "models:\n  - {name: test-model, path: /m}\n";
    testing::ScriptedDaemon d({"test-model"});
    d.start(models + "limits:\n  max_body_bytes: 65536\n");
    auto reload = [&](const std::string& limits) {
        auto fresh = daemon::parse_config(
            testing::config_yaml(d.cert.cert_path, d.cert.key_path, models + limits),
            d.dir.file("c.yaml"));
        REQUIRE(fresh.ok());
        REQUIRE(d.daemon->reload(*fresh).ok());
    };
    // The status of a POST with a body of `bytes` (413 when over limits.max_body_bytes).
    auto post = [](testing::TlsClient& c, size_t bytes) {
        REQUIRE(c.send("POST /v1/models HTTP/1.1\r\nHost: localhost\r\nContent-Length: " +
                       std::to_string(bytes) + "\r\n\r\n" + std::string(bytes, 'x'))
                    .ok());
        Result<testing::HttpReply> r = c.read_response();
        REQUIRE_MESSAGE(r.ok(), r.status().to_string());
        return r->status;
    };
    auto before = testing::TlsClient::connect(d.daemon->public_port());
    REQUIRE(before.ok());

    // `before` is open: with max_connections 1 a new connection is turned away at accept.
    reload("limits:\n  max_body_bytes: 65536\n  max_connections: 1\n");
    CHECK_FALSE(testing::TlsClient::connect(d.daemon->public_port()).ok());

    // Raised again, with a lower body limit: a new connection gets in, under the new limit.
    reload("limits:\n  max_body_bytes: 4096\n  max_connections: 100\n");
    auto after = testing::TlsClient::connect(d.daemon->public_port());
    REQUIRE(after.ok());
    CHECK(post(**after, 10'000) == 413);
    // The connection open before the reloads keeps the limit it was accepted with.
    CHECK(post(**before, 10'000) != 413);
}

TEST_CASE("reload: a restart-only section the next start would refuse fails the reload") {
    testing::ScriptedDaemon d({"test-model"});
    d.start(tenant_yaml("sk-old"));
    auto running = daemon::parse_config(d.config_text, d.dir.file("c.yaml"));
    REQUIRE(running.ok());
    // The running config with a new tenant key, its listeners' ports and `extra` sections.
    auto edited = [&](uint16_t public_port, uint16_t admin_port, const std::string& models,
                      const std::string& extra) {
        std::string text = testing::config_yaml(d.cert.cert_path, d.cert.key_path,
                                                tenant_yaml("sk-new") + extra);
        const std::string port = "    port: 0\n";
        const size_t pub = text.find(port);
        text.replace(pub, port.size(), "    port: " + std::to_string(public_port) + "\n");
        const size_t admin = text.find(port, text.find("  admin:\n"));
        text.replace(admin, port.size(), "    port: " + std::to_string(admin_port) + "\n");
        const std::string model = "path: /m}";
        text.replace(text.find(model), model.size(), "path: " + models + "}");
        auto fresh = daemon::parse_config(text, d.dir.file("c.yaml"));
        REQUIRE_MESSAGE(fresh.ok(), fresh.status().to_string());
        return *fresh;
    };
    // Each is a config the reload would apply but `run` (and check-config) refuses.
    struct Broken {
        daemon::Config config;
        std::string part;
        std::string key;  // In the error.
    };
    std::vector<Broken> broken = {
        {edited(0, 0, d.dir.file("missing-model"), ""), "models", "models[0]"},
        {edited(18443, 18443, "/m", ""), "listeners", "listeners.admin.port"},
        {edited(0, 0, "/m", "engine:\n  sharding:\n    communicator: no_such_communicator\n"),
         "engine", "engine.sharding.communicator"},
    };
    // `run` resolves the backend first thing: `cuda` where no GPU is visible fails it.
    const std::vector<std::string> backends = engine::available_backends();
    if (std::find(backends.begin(), backends.end(), "cuda") == backends.end()) {
        broken.push_back({edited(0, 0, "/m", "engine:\n  backend: cuda\n"), "engine",
                          "engine.backend"});
    }
    for (const Broken& b : broken) {
        std::string part;
        const Status s = daemon::preflight_restart(*running, b.config, false, &part);
        CHECK(s.code() != StatusCode::kOk);
        CHECK(part == b.part);
        CHECK_MESSAGE(s.message().find(d.dir.file("c.yaml") + ": " + b.key) == 0, s.message());
        CHECK_MESSAGE(s.message().find("the restart, which would fail") != std::string::npos,
                      s.message());
    }
    // Sections unchanged since the start are not looked at: its model path /m, which the
    // scripted generator never read, does not exist.
    CHECK(daemon::preflight_restart(*running, *running).ok());

    // A restart-only change the next start takes passes, and the rest of the config applies
    // (the run loop then warns that `listeners` waits for the restart).
    const daemon::Config valid = edited(0, 18444, "/m", "");
    CHECK(daemon::changed_restart_sections(*running, valid) ==
          std::vector<std::string>{"listeners"});
    REQUIRE(daemon::preflight_restart(*running, valid).ok());
    REQUIRE(d.daemon->reload(valid).ok());
    CHECK(models_status(d, "sk-old") == 401);
    CHECK(models_status(d, "sk-new") == 200);
}

TEST_CASE("reload: a config without `gossip` on an encrypted site still applies the rest") {
    testing::ScriptedDaemon d({"test-model"});
    const std::string gossip = "gossip:\n  bind_address: 127.0.0.1\n  port: 0\n  preset: local\n"
                               "  snapshot_file: ''\n  keys: [" +
                               std::string(64, 'a') + "]\n";
    d.start(tenant_yaml("sk-old") + gossip);
    REQUIRE(d.daemon->cluster() != nullptr);
    // `gossip` is restart-only: the cluster keeps running, with its keys, until the restart; the
    // tenant key revoked in the same edit applies now.
    auto fresh = daemon::parse_config(
        testing::config_yaml(d.cert.cert_path, d.cert.key_path, tenant_yaml("sk-new")),
        d.dir.file("c.yaml"));
    REQUIRE(fresh.ok());
    const Status s = d.daemon->reload(*fresh);
    CHECK_MESSAGE(s.ok(), s.to_string());
    CHECK(models_status(d, "sk-old") == 401);
    CHECK(models_status(d, "sk-new") == 200);
    CHECK(metric(d, "edgeserve_config_last_reload_successful") == 1);
}

TEST_CASE("reload: a site alone warns of tenant models it serves only after a restart") {
    testing::ScriptedDaemon d({"test-model"});
    auto yaml = [](const std::string& key, const std::string& models) {
        std::string list;
        for (const char* m : {"test-model", "m2"}) {
            if (models.find(m) != std::string::npos) {
                list += std::string(list.empty() ? "" : ", ") + "{name: " + m + ", path: /m}";
            }
        }
        return "tenants:\n  - name: acme\n    api_key_sha256: [" +
               daemon::TenantTable::sha256_hex(key) + "]\n    models: [" + models +
               "]\nmodels: [" + list + "]\n";
    };
    d.start(yaml("sk-old", "test-model"));
    REQUIRE(models_status(d, "sk-old") == 200);
    std::mutex mu;
    std::vector<std::string> lines;
    log::set_sink([&](std::string_view line) {
        std::lock_guard lock(mu);
        lines.emplace_back(line);
    });
    // A model added, the tenant's list with it, and the key rotated in the same edit: the model
    // waits for a restart, the key does not (refusing the reload would keep a revoked key).
    auto fresh = daemon::parse_config(
        testing::config_yaml(d.cert.cert_path, d.cert.key_path, yaml("sk-new", "test-model, m2")),
        d.dir.file("c.yaml"));
    REQUIRE(fresh.ok());
    const Status s = d.daemon->reload(*fresh);
    log::set_sink(nullptr);
    CHECK_MESSAGE(s.ok(), s.to_string());
    CHECK(models_status(d, "sk-new") == 200);
    CHECK(models_status(d, "sk-old") == 401);
    CHECK(metric(d, "edgeserve_config_last_reload_successful") == 1);
    std::string warned;
    for (const std::string& l : lines) {
        if (l.find("tenant_model_not_served_until_restart") != std::string::npos) {
            warned = l;
        }
    }
    CHECK_MESSAGE(warned.find("tenants[0].models[1]: model 'm2' is not served here") !=
                      std::string::npos,
                  warned);
    CHECK_MESSAGE(warned.find("serves test-model") != std::string::npos, warned);
}

TEST_CASE("reload: the unserved tenant models are named together, and only when it applies") {
    testing::ScriptedDaemon d({"test-model"});
    d.start(tenant_yaml("sk-old"));
    // Two tenants, each naming a model added to `models` in the same edit.
    const std::string tenants =
        "tenants:\n  - name: t1\n    api_key_sha256: [" + daemon::TenantTable::sha256_hex("sk-1") +
        "]\n    models: [test-model, b]\n  - name: t2\n    api_key_sha256: [" +
        daemon::TenantTable::sha256_hex("sk-2") +
        "]\n    models: [c]\nmodels:\n  - {name: test-model, path: /m}\n"
        "  - {name: b, path: /m}\n  - {name: c, path: /m}\n";
    // That config, with listeners.admin.token_file `token_file` ("": none).
    auto config = [&](const std::string& token_file) {
        std::string text = testing::config_yaml(d.cert.cert_path, d.cert.key_path, tenants);
        if (!token_file.empty()) {
            const std::string admin = "  admin:\n";
            text.insert(text.find(admin) + admin.size(), "    token_file: " + token_file + "\n");
        }
        auto fresh = daemon::parse_config(text, d.dir.file("c.yaml"));
        REQUIRE_MESSAGE(fresh.ok(), fresh.status().to_string());
        return *fresh;
    };
    std::mutex mu;
    std::vector<std::string> lines;
    log::set_sink([&](std::string_view line) {
        std::lock_guard lock(mu);
        lines.emplace_back(line);
    });
    // The lines logged with `event`.
    auto logged = [&](const std::string& event) {
        std::lock_guard lock(mu);
        std::vector<std::string> found;
        for (const std::string& l : lines) {
            if (l.find(event) != std::string::npos) {
                found.push_back(l);
            }
        }
        return found;
    };

    // Applied (an admin token turned on with it): one warning naming both models.
    const std::string token = d.dir.write("admin.token", "0123456789abcdef0123\n");
    Status s = d.daemon->reload(config(token));
    CHECK_MESSAGE(s.ok(), s.to_string());
    std::vector<std::string> warned = logged("tenant_model_not_served_until_restart");
    REQUIRE(warned.size() == 1);
    CHECK_MESSAGE(warned[0].find("tenants[0].models[1]: model 'b', tenants[1].models[0]: "
                                 "model 'c' are not served here") != std::string::npos,
                  warned[0]);

    // The same tenants with the admin token dropped: refused whole, so nothing to warn about.
    {
        std::lock_guard lock(mu);
        lines.clear();
    }
    s = d.daemon->reload(config(""));
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK(logged("\"event\":\"config_reload_failed\",\"part\":\"admin_token\"").size() == 1);
    warned = logged("tenant_model_not_served_until_restart");
    log::set_sink(nullptr);
    CHECK_MESSAGE(warned.empty(), (warned.empty() ? "" : warned.front()));
}
