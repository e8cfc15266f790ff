#include "daemon/commands.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli_flags.h"
#include "common/log.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/load_heartbeat.h"
#include "daemon/metrics.h"
#include "daemon/null_generator.h"
#include "daemon/preflight.h"
#include "daemon/signals.h"
#include "daemon/socket_activation.h"
#include "daemon/systemd_notify.h"
#include "engine/backend.h"
#include "engine/cpu/matmul.h"
#include "engine/engine.h"
#include "engine/load_progress.h"

namespace edge::daemon {
namespace {

std::string env_or_empty(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

log::Level parse_level(const std::string& level) {
    if (level == "debug") return log::Level::kDebug;
    if (level == "warn") return log::Level::kWarn;
    if (level == "error") return log::Level::kError;
    return log::Level::kInfo;
}

}  // namespace

int check_config_main(int argc, char** argv) {
    constexpr const char* kUsage =
        "usage: edgeserve check-config [--no-files] [--socket-activated] FILE\n"
        "  --no-files          check the YAML alone, not the certificates, models and keyring it\n"
        "                      names\n"
        "  --socket-activated  as `run` under systemd: the public listener is edgeserve.socket's,\n"
        "                      so listeners.public.port is not checked against the other ports\n";
    bool files = true;
    bool socket_activated = false;
    std::string path;
    SeenFlags seen;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        std::string wrong;
        if (arg == "--help" || arg == "-h") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        const bool option = arg.size() > 1 && arg[0] == '-';
        // A FILE given twice is named below as the extra argument it is.
        if (std::string twice = option ? seen.repeated(arg) : ""; !twice.empty()) {
            wrong = twice;
        } else if (arg == "--no-files") {
            files = false;
        } else if (arg == "--socket-activated") {
            socket_activated = true;
        } else if (option) {
            wrong = "unknown option '" + std::string(arg) + "'";
        } else if (!path.empty()) {
            wrong = "unexpected argument '" + std::string(arg) + "' (one FILE only)";
        } else {
            path = arg;
        }
        if (!wrong.empty()) {
            std::fprintf(stderr, "edgeserve check-config: %s\n%s", wrong.c_str(), kUsage);
            return 2;
        }
    }
    if (path.empty()) {
        std::fprintf(stderr, "edgeserve check-config: missing the config FILE\n%s", kUsage);
        return 2;
    }
    Result<Config> config = load_config(path);
    if (!config.ok()) {
        std::fprintf(stderr, "%s\n", config.status().message().c_str());
        return 1;
    }
    // The files the config names (certificates, models, keyring), as `run` checks them; with
    // --socket-activated (the unit's ExecStartPre) the public port is left out, as `run` given
    // the socket leaves it: it is not used.
    Result<std::vector<std::string>> warnings =
        files ? preflight_config(*config, socket_activated) : std::vector<std::string>();
    if (!warnings.ok()) {
        std::fprintf(stderr, "%s\n", warnings.status().message().c_str());
        return 1;
    }
    std::printf("%s: ok (%zu models, %s)\n", path.c_str(), config->models.size(),
                config->tenants ? "authentication on" : "authentication off");
    for (const std::string& warning : *warnings) {
        std::printf("warning: %s\n", warning.c_str());
    }
    return 0;
}

// Drains the daemon, then stops the engine while the daemon lives: the requests the drain cut
// end (cancelled) through callbacks that use its metrics and tenant limiter.
// Signals that arrive meanwhile are logged: the drain runs to its deadline regardless.
void shut_down(Daemon& daemon, engine::Generator& generator, std::chrono::milliseconds drain) {
    SignalWatcher signals_meanwhile({SIGTERM, SIGINT, SIGHUP}, [](int sig) {
        log::info("signal_while_draining",
                  {{"signal", signal_name(sig)},
                   {"detail", "already stopping; requests still running are cut at "
                              "limits.drain_deadline_ms"}});
    });
    daemon.stop(drain);
    generator.stop();
}

int exit_on_device_fault(Daemon& daemon, engine::Generator& generator, const Status& fault,
                         std::chrono::milliseconds drain) {
    log::error("device_fault_exit", {{"error", fault.message()},
                                     {"drain_ms", static_cast<int64_t>(drain.count())},
                                     {"exit_code", static_cast<int64_t>(kExitDeviceFault)}});
    shut_down(daemon, generator, drain);
    return kExitDeviceFault;
}

int run_main(int argc, char** argv) {
    constexpr const char* kUsage = "usage: edgeserve run --config FILE\n";
    std::string config_path;
    SeenFlags seen;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        std::string wrong;
        if (arg == "--help" || arg == "-h") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (std::string twice = seen.repeated(arg); !twice.empty()) {
            wrong = twice;
        } else if (arg == "--config" && i + 1 < argc) {
            config_path = argv[++i];
        } else if (arg == "--config") {
            wrong = "missing the value of --config";
        } else {
            wrong = "unexpected argument '" + std::string(arg) + "'";
        }
        if (!wrong.empty()) {
            std::fprintf(stderr, "edgeserve run: %s\n%s", wrong.c_str(), kUsage);
            return 2;
        }
    }
    if (config_path.empty()) {
        std::fprintf(stderr, "edgeserve run: missing --config FILE\n%s", kUsage);
        return 2;
    }
    // Signals are taken synchronously by this thread; blocked first, before any thread starts
    // (every thread inherits the mask) and before the checks and the load, so a SIGTERM during
    // them is a logged, clean stop rather than the default action's silent exit.
    const sigset_t signals = signal_set({SIGTERM, SIGINT, SIGHUP});
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    signal(SIGPIPE, SIG_IGN);
    // A SIGTERM or SIGINT that arrived during a step that cannot be interrupted (the checks, the
    // models' load): stop before serving.
    auto stopped_before_serving = [](std::string_view during) {
        std::optional<int> sig = take_pending_stop();
        if (sig) {
            log::info("shutdown", {{"signal", signal_name(*sig)},
                                   {"detail", "received during " + std::string(during) +
                                                  "; stopping before serving"}});
        }
        return sig.has_value();
    };

    // Socket activation (edgeserve.socket): the first inherited socket is the public listener,
    // so a restart never closes the port; listeners.public.address/port then go unused. Taken
    // first, while this is the only thread: it unsets LISTEN_* (setenv/unsetenv race getenv in
    // other threads), and resolving the backend below may start the CUDA runtime's threads.
    Result<std::vector<int>> inherited = take_listen_fds();
    if (!inherited.ok()) {
        log::error("socket_activation_invalid", {{"error", inherited.status().message()}});
        std::fprintf(stderr, "edgeserve: %s\n", inherited.status().message().c_str());
        return 1;
    }
    int public_fd = -1;
    if (inherited->size() > 1) {
        // systemd keeps its copies of them all listening: connections to one this process does
        // not serve would wait in its backlog for good, and a running service is never
        // activated again.
        const std::string message =
            "socket activation passed " + std::to_string(inherited->size()) +
            " sockets; edgeserve serves one public listener: keep one ListenStream= in "
            "edgeserve.socket (BindIPv6Only=both takes IPv4 and IPv6 on one socket)";
        log::error("socket_activation_invalid", {{"error", message}});
        std::fprintf(stderr, "edgeserve: %s\n", message.c_str());
        return 1;
    }
    if (!inherited->empty()) {
        public_fd = inherited->front();
        log::info("socket_activation", {{"public_fd", static_cast<int64_t>(public_fd)}});
    }

    Result<Config> config = load_config(config_path);
    if (!config.ok()) {
        log::error("config_invalid", {{"error", config.status().message()}});
        std::fprintf(stderr, "edgeserve: %s\n", config.status().message().c_str());
        return 1;
    }
    log::set_level(parse_level(config->log.level));
    // engine.backend: `cuda` without a device is a start error, not a silent CPU fallback.
    Result<std::string> backend = engine::resolve_backend(config->engine.backend);
    if (!backend.ok()) {
        log::error("backend_unavailable", {{"error", backend.status().to_string()}});
        std::fprintf(stderr, "edgeserve: %s\n", backend.status().message().c_str());
        return 1;
    }
    // cpu_kernels: the CPU's matmul kernels engine.cpu_kernels picks (auto: the best it has).
    const std::string cpu_kernels =
        config->engine.cpu_kernels == "auto"
            ? std::string(engine::cpu::isa_name(engine::cpu::detect_isa()))
            : config->engine.cpu_kernels;
    log::info("backend", {{"requested", config->engine.backend},
                          {"using", *backend},
                          {"cpu_kernels", cpu_kernels}});

    // Certificates, ports and the models' files are checked before the models load (which can
    // take minutes), with the same checks as check-config.
    // Its warnings are logged again, with more, when the models load.
    if (Status s = preflight_config(*config, public_fd >= 0).status(); !s.ok()) {
        log::error("config_invalid", {{"error", s.message()}});
        std::fprintf(stderr, "edgeserve: %s\n", s.message().c_str());
        return 1;
    }
    if (Status s = check_ports_free(*config, public_fd >= 0); !s.ok()) {
        log::error("start_failed", {{"error", s.message()}});
        std::fprintf(stderr, "edgeserve: %s\n", s.message().c_str());
        return 1;
    }
    if (stopped_before_serving("the config checks")) {
        return 0;
    }

    SystemdNotifier notifier(env_or_empty("NOTIFY_SOCKET"), env_or_empty("WATCHDOG_USEC"),
                             env_or_empty("WATCHDOG_PID"));
    std::unique_ptr<engine::Generator> generator;
    if (config->models.empty()) {
        log::info("no_models", {{"detail", "no models configured; /v1/models is empty"}});
        generator = std::make_unique<NullGenerator>();
    } else {
        // The load can take minutes: a SIGTERM or SIGINT meanwhile ends the process at once
        // (nothing serves yet), well within systemd's TimeoutStopSec.
        (void)notifier.notify("STATUS=loading models");
        Result<std::unique_ptr<engine::Generator>> engine = [&config, &notifier] {
            // A load that outlasts TimeoutStartSec while it moves is given more time.
            LoadHeartbeat heartbeat(notifier, engine::load_progress);
            SignalWatcher during_load({SIGTERM, SIGINT}, [](int sig) {
                log::info("shutdown", {{"signal", signal_name(sig)},
                                       {"detail", "received during the models' load; "
                                                  "exiting before serving"}});
                std::_Exit(0);
            });
            return engine::create_engine(config->engine);
        }();
        if (!engine.ok()) {
            std::string message = engine.status().code() == StatusCode::kUnimplemented
                                      ? "a configured model uses what this engine does not support"
                                      : "the engine failed to load the configured models";
            log::error("engine_failed",
                       {{"error", engine.status().to_string()}, {"detail", message}});
            std::fprintf(stderr, "edgeserve: %s: %s\n", message.c_str(),
                         engine.status().to_string().c_str());
            return 1;
        }
        generator = std::move(engine).value();
    }
    if (stopped_before_serving("the models' load")) {
        return 0;
    }

    Result<std::unique_ptr<Daemon>> daemon =
        Daemon::create(*config, *generator, SystemClock::instance(), public_fd);
    if (!daemon.ok()) {
        log::error("start_failed", {{"error", daemon.status().message()}});
        std::fprintf(stderr, "edgeserve: %s\n", daemon.status().message().c_str());
        return 1;
    }
    (*daemon)->start();
    if (Status s = notifier.notify("READY=1\nSTATUS=serving"); !s.ok()) {
        log::warn("sd_notify_failed", {{"error", s.message()}});
    }
    auto interval = notifier.watchdog_interval();
    bool watchdog_withheld = false;
    // Pinged only while the I/O threads and the engine make progress: a daemon stuck for longer
    // than the interval is then restarted by systemd (WatchdogSec). Due by the clock, not by a
    // quiet wait: signals end the wait early, and a burst of SIGHUPs (a reload per renewed file)
    // must not starve the pings until systemd kills a healthy daemon.
    auto next_ping = std::chrono::steady_clock::now();
    auto ping_watchdog = [&] {
        const auto now = std::chrono::steady_clock::now();
        if (!interval || now < next_ping) {
            return;
        }
        next_ping = now + *interval;
        const std::string stuck =
            (*daemon)->stuck(std::chrono::duration_cast<std::chrono::milliseconds>(*interval));
        if (stuck.empty()) {
            (void)notifier.notify("WATCHDOG=1");
            watchdog_withheld = false;
        } else if (!watchdog_withheld) {
            watchdog_withheld = true;
            log::error(
                "watchdog_withheld",
                {{"stuck", stuck},
                 {"stalled_over_ms",
                  static_cast<int64_t>(
                      std::chrono::duration_cast<std::chrono::milliseconds>(*interval).count())},
                 {"detail",
                  "no WATCHDOG=1, /readyz 503 and pools gossiped as draining until it moves "
                  "again; systemd restarts the service at WatchdogSec"}});
        }
    };
    ping_watchdog();
    // limits.drain_deadline_ms of the config last applied: a reload changes it for the next stop.
    std::chrono::milliseconds drain_deadline = config->limits.drain_deadline;
    for (;;) {
        // Wakes at least every kHealthPollInterval to ask for the device's health, and when the
        // next watchdog ping is due.
        auto wait = std::chrono::duration_cast<std::chrono::microseconds>(kHealthPollInterval);
        if (interval) {
            wait = std::clamp(std::chrono::duration_cast<std::chrono::microseconds>(
                                  next_ping - std::chrono::steady_clock::now()),
                              std::chrono::microseconds(0), wait);
        }
        timespec ts{static_cast<time_t>(wait.count() / 1'000'000),
                    static_cast<long>((wait.count() % 1'000'000) * 1000)};
        int sig = sigtimedwait(&signals, nullptr, &ts);
        if (Status health = (*daemon)->check_health(); !health.ok()) {
            (void)notifier.notify("STOPPING=1\nSTATUS=device fault: " + health.message());
            return exit_on_device_fault(
                **daemon, *generator, health,
                std::min(drain_deadline, kDeviceFaultDrain));
        }
        ping_watchdog();
        if (sig < 0) {
            continue;
        }
        if (sig == SIGHUP) {
            (void)notifier.notify("RELOADING=1");
            log::info("reload", {{"signal", "SIGHUP"}});
            // Certificates, tenants, keys and limits come from the config file again; a file
            // that does not load changes nothing.
            Result<Config> fresh = load_config(config_path);
            // The sections a reload leaves for the restart are checked too: one that the next
            // start would refuse fails the reload, so the operator hears of it now, not at a
            // restart days later.
            std::string part = "file";
            Status checked = fresh.status();
            if (checked.ok()) {
                checked = preflight_restart(*config, *fresh, public_fd >= 0, &part);
            }
            if (!checked.ok()) {
                (*daemon)->metrics().on_config_reload(false);
                log::error("config_reload_failed",
                           {{"part", part},
                            {"error", checked.message()},
                            {"detail", "nothing applied: " + std::string(kReloadApplies) +
                                           " stay as they were"}});
            } else if ((*daemon)->reload(*fresh).ok()) {  // All or nothing; logged.
                drain_deadline = fresh->limits.drain_deadline;
                std::vector<std::string> changed = changed_restart_sections(*config, *fresh);
                if (!changed.empty()) {
                    std::string sections;
                    for (const std::string& name : changed) {
                        sections += (sections.empty() ? "" : ",") + name;
                    }
                    log::warn("changed_sections_need_restart",
                              {{"sections", sections},
                               {"detail", "a reload applies only " + std::string(kReloadApplies) +
                                              "; these changes wait for a restart"}});
                }
            }
            (void)notifier.notify("READY=1");
            continue;
        }
        log::info("shutdown", {{"signal", signal_name(sig)}});
        (void)notifier.notify("STOPPING=1");
        shut_down(**daemon, *generator, drain_deadline);
        return 0;
    }
}

}  // namespace edge::daemon
