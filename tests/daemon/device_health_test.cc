// Device health through the real daemon (real HTTPS, admin and gossip listeners on 127.0.0.1:0):
// a sticky device fault, injected with the test-only health probe or reported to the engine's
// process-wide device health, turns /readyz into 503 with the reason, makes gossip advertise the
// site's pools as draining (another daemon sees it), lets an in-flight request receive its error
// during the bounded drain, and ends the daemon with kExitDeviceFault; the run loop itself
// (run_main, in process) exits with that status on a fault. The binary refuses
// engine.backend: cuda on a machine without a GPU. A stall the watchdog finds (Daemon::stuck)
// turns /readyz into 503 and gossip to draining too, until progress resumes. Waits poll real
// state with a deadline; nothing sleeps for a fixed time.

#include <doctest/doctest.h>

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "daemon/cluster/cluster.h"
#include "daemon/commands.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "engine/backend.h"
#include "tests/testing/config_yaml.h"
#include "tests/testing/daemon_yaml.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_daemon.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

using namespace edge;
using namespace std::chrono_literals;
namespace membership = edge::routing::membership;

namespace {

using testing::wait_for;

// A site of a two-daemon gossip cluster, without active health checks.
std::string gossip_site_yaml(const testing::TestCertificate& cert, const std::string& id,
                             const std::string& join) {
    testing::DaemonYaml y;
    y.site_id = id;
    y.cert_path = cert.cert_path;
    y.key_path = cert.key_path;
    y.gossip.emplace();
    y.gossip->health_check_interval_ms = 0;
    y.gossip->health_check_timeout_ms = 0;
    if (!join.empty()) {
        y.gossip->join = {join};
    }
    return testing::daemon_yaml(y);
}

// A daemon serving "test-model" from a scripted generator.
struct Site {
    std::string name;  // The site id its gossip advertises (create_sites).
    testing::ScriptedGenerator generator{{"test-model"}};
    std::unique_ptr<daemon::Daemon> daemon;

    void create(const std::string& yaml, const std::string& path) {
        daemon = testing::make_daemon(yaml, path, generator, SystemClock::instance());
    }

    // Waits up to `timeout` for `other`'s gossip view to show this site's pool as `state`.
    bool seen_as(daemon::Daemon& other, membership::PoolState state,
                 std::chrono::milliseconds timeout) {
        return wait_for(
            [&] {
                auto snap = other.cluster()->snapshot();
                const auto* m = snap->find(name);
                return m != nullptr && m->site && !m->site->pools.empty() &&
                       m->site->pools[0].state == state;
            },
            timeout);
    }
};

// fra started, and sin created with fra as its gossip seed (started by the test).
void create_sites(testing::TempDir& dir, const testing::TestCertificate& cert, Site& fra,
                  Site& sin) {
    fra.name = "fra";
    sin.name = "sin";
    fra.create(gossip_site_yaml(cert, "fra", ""), dir.file("fra.yaml"));
    fra.daemon->start();
    const uint16_t seed = fra.daemon->cluster()->gossip_port();
    sin.create(gossip_site_yaml(cert, "sin", "127.0.0.1:" + std::to_string(seed)),
               dir.file("sin.yaml"));
}

// A fault the probe reports once `failed` is set (what a lost GPU looks like to the daemon).
struct InjectedFault {
    std::atomic<bool> failed{false};
    Status fault = unavailable_error("CUDA device lost: cudaErrorIllegalAddress (injected)");
    std::function<Status()> probe() {
        return [this] { return failed.load() ? fault : ok_status(); };
    }
};

}  // namespace

TEST_CASE("a device fault: readyz 503 with the reason, gossip draining, in-flight error, exit 3") {
    testing::TempDir dir;
    const auto cert = testing::make_certificate(dir.path(), "srv", {"localhost"});
    Site fra, sin;
    create_sites(dir, cert, fra, sin);
    InjectedFault injected;
    sin.daemon->set_health_probe(injected.probe());
    sin.daemon->start();
    REQUIRE(sin.seen_as(*fra.daemon, membership::PoolState::kServing, 10s));
    const uint16_t admin = sin.daemon->admin_port();
    auto ready = testing::plain_http_get(admin, "/readyz");
    REQUIRE(ready.ok());
    CHECK(ready->status == 200);
    CHECK(sin.daemon->check_health().ok());

    // A stream in flight when the device dies.
    auto client = testing::TlsClient::connect(sin.daemon->public_port());
    REQUIRE(client.ok());
    REQUIRE((*client)
                ->send(testing::http_request("POST", "/v1/chat/completions",
                                             R"({"model":"test-model","stream":true,)"
                                             R"("messages":[{"role":"user","content":"hi"}]})"))
                .ok());
    REQUIRE(sin.generator.wait_for_request(0));
    sin.generator.emit(0, "before");
    REQUIRE((*client)->read_until("before").ok());

    injected.failed = true;
    // /readyz asks the probe itself: 503 at once, with the reason.
    auto not_ready = testing::plain_http_get(admin, "/readyz");
    REQUIRE(not_ready.ok());
    CHECK(not_ready->status == 503);
    CHECK_MESSAGE(not_ready->body.find("not ready: engine device failed: CUDA device lost") !=
                      std::string::npos,
                  not_ready->body);
    // Sticky, and what the run loop sees.
    const Status fault = sin.daemon->check_health();
    CHECK(fault.code() == StatusCode::kUnavailable);
    CHECK(fault.message().find("cudaErrorIllegalAddress") != std::string::npos);
    injected.failed = false;
    CHECK(sin.daemon->check_health() == fault);
    CHECK(sin.daemon->health() == fault);
    // The other site learns through gossip that sin's pool drains.
    CHECK(sin.seen_as(*fra.daemon, membership::PoolState::kDraining, 5s));

    // The run loop's fault path: a bounded drain, during which the in-flight request receives
    // the error the engine finished it with, then the documented exit status.
    auto exiting = std::async(std::launch::async, [&] {
        return daemon::exit_on_device_fault(*sin.daemon, sin.generator, fault, 5000ms);
    });
    sin.generator.finish(0, engine::FinishReason::kError, {}, fault);
    auto rest = (*client)->read_until("data: [DONE]");
    REQUIRE(rest.ok());
    CHECK_MESSAGE(rest->find("CUDA device lost") != std::string::npos, *rest);
    CHECK(rest->find("\"error\"") != std::string::npos);
    REQUIRE(exiting.wait_for(10s) == std::future_status::ready);
    CHECK(exiting.get() == daemon::kExitDeviceFault);
    CHECK(daemon::kExitDeviceFault != 0);  // systemd's Restart=on-failure restarts it.
    CHECK_FALSE(testing::accepts_connections(sin.daemon->public_port()));
    fra.daemon->stop(0ms);
}

TEST_CASE("a stall the watchdog finds: readyz 503 naming it, gossip draining, until it moves") {
    // /readyz answered 200 and gossip advertised the pools as serving while the watchdog already
    // withheld its pings for a stuck engine: traffic kept coming until systemd killed the
    // process, without a drain.
    testing::TempDir dir;
    const auto cert = testing::make_certificate(dir.path(), "srv", {"localhost"});
    Site fra, sin;
    create_sites(dir, cert, fra, sin);
    // A batch holding a sequence whose step and layer counts do not move.
    engine::ServingStats stats;
    stats.model = "test-model";
    stats.batch_sequences = 1;
    stats.steps = 7;
    stats.layers_run = 100;
    sin.generator.set_serving_stats({stats});
    sin.daemon->start();
    REQUIRE(sin.seen_as(*fra.daemon, membership::PoolState::kServing, 10s));
    const uint16_t admin = sin.daemon->admin_port();
    CHECK(sin.daemon->stuck(20ms).empty());  // The batch is first seen: timed from now.
    CHECK(testing::plain_http_get(admin, "/readyz")->status == 200);

    // Asked again until the engine is named (the I/O probe may be "io" for a moment, slow
    // under the sanitizers).
    REQUIRE(wait_for([&] { return sin.daemon->stuck(20ms) == "engine"; }, 5s));
    CHECK(sin.daemon->stalled() == "engine");
    auto stalled = testing::plain_http_get(admin, "/readyz");
    REQUIRE(stalled.ok());
    CHECK(stalled->status == 503);
    CHECK_MESSAGE(stalled->body.find("not ready: stalled: engine") != std::string::npos,
                  stalled->body);
    CHECK(sin.seen_as(*fra.daemon, membership::PoolState::kDraining, 5s));
    CHECK_FALSE(sin.daemon->draining());  // Not a drain: nothing of it stays.
    CHECK(sin.daemon->check_health().ok());

    // A step ends: the next check clears both (with a stall long enough that the step just seen
    // is not late yet at a second ask).
    stats.steps = 8;
    sin.generator.set_serving_stats({stats});
    REQUIRE(wait_for([&] { return sin.daemon->stuck(5000ms).empty(); }, 5s));
    CHECK(sin.daemon->stalled().empty());
    auto ready = testing::plain_http_get(admin, "/readyz");
    REQUIRE(ready.ok());
    CHECK_MESSAGE(ready->status == 200, ready->body);
    CHECK(sin.seen_as(*fra.daemon, membership::PoolState::kServing, 5s));
    sin.daemon->stop(0ms);
    fra.daemon->stop(0ms);
}

TEST_CASE("the default probe is the engine's device health: a reported fault fails readyz") {
    testing::TempDir dir;
    const auto cert = testing::make_certificate(dir.path(), "srv", {"localhost"});
    Site site;
    site.create(testing::config_yaml(cert.cert_path, cert.key_path), dir.file("site.yaml"));
    site.daemon->start();
    const uint16_t admin = site.daemon->admin_port();
    REQUIRE(engine::device_health().ok());
    CHECK(testing::plain_http_get(admin, "/readyz")->status == 200);
    engine::report_device_fault(internal_error("NCCL: peer rank 1 gone (injected)"));
    auto not_ready = testing::plain_http_get(admin, "/readyz");
    engine::clear_reported_device_fault_for_testing();  // Before any CHECK can leave it set.
    REQUIRE(not_ready.ok());
    CHECK(not_ready->status == 503);
    CHECK(not_ready->body.find("peer rank 1 gone") != std::string::npos);
    // Sticky in the daemon even once the process-wide state is clear again.
    CHECK(testing::plain_http_get(admin, "/readyz")->status == 503);
    CHECK_FALSE(site.daemon->check_health().ok());
    site.daemon->stop(0ms);
}

TEST_CASE("the run loop (edgeserve run) exits with kExitDeviceFault on a device fault") {
    testing::TempDir dir;
    const auto cert = testing::make_certificate(dir.path(), "srv", {"localhost"});
    const std::string config =
        dir.write("run.yaml", testing::config_yaml(cert.cert_path, cert.key_path));
    // The fault is there before the loop starts: its first health poll (after at most
    // kHealthPollInterval) finds it.
    engine::report_device_fault(unavailable_error("CUDA device lost: injected before run"));
    std::string arg0 = "run", arg1 = "--config", arg2 = config;
    char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
    // Its own thread: run_main blocks SIGTERM/SIGINT/SIGHUP in the calling thread's mask and
    // waits for them there, so a loop that missed the fault is stopped with a SIGTERM to it.
    std::promise<int> exit_code;
    std::future<int> code = exit_code.get_future();
    std::thread loop([&] { exit_code.set_value(daemon::run_main(3, argv)); });
    const bool returned = code.wait_for(30s) == std::future_status::ready;
    if (!returned) {
        pthread_kill(loop.native_handle(), SIGTERM);
    }
    loop.join();
    engine::clear_reported_device_fault_for_testing();
    CHECK(returned);
    CHECK(code.get() == daemon::kExitDeviceFault);
}

TEST_CASE("edgeserve run: engine.backend cuda without a visible GPU is a start error") {
    const auto names = engine::available_backends();
    if (std::find(names.begin(), names.end(), "cuda") != names.end()) {
        MESSAGE("a CUDA device is visible: the start error cannot be provoked here");
        return;
    }
    testing::TempDir dir;
    const std::string config = dir.write(
        "cuda.yaml", testing::config_yaml("c.pem", "k.pem", "engine:\n  backend: cuda\n"));
    auto r = testing::run({EDGE_BINARY_DIR "/daemon/edgeserve", "run", "--config", config});
    CHECK(r.exit_code == 1);
    CHECK_MESSAGE(r.err.find("engine.backend is \"cuda\"") != std::string::npos, r.err);
    // auto falls back to the CPU and starts (stopped at once by a missing certificate instead).
    const std::string autocfg = dir.write(
        "auto.yaml", testing::config_yaml("c.pem", "k.pem", "engine:\n  backend: auto\n"));
    auto a = testing::run({EDGE_BINARY_DIR "/daemon/edgeserve", "run", "--config", autocfg});
    CHECK(a.exit_code == 1);
    CHECK(a.err.find("engine.backend") == std::string::npos);
}
