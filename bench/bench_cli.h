#pragma once

// What the benchmark programs share: `--name VALUE` flags (an unknown flag, a missing value or a
// number out of range stops the program with a message naming it, and `--help` lists the flags),
// decode step timing at the median step (StepTimes), and the checkpoint a bench runs on (the one
// given with --model, or a make-model preset written to a fresh temporary folder that is removed
// at exit).
//
// Threading: main thread only, before the bench starts.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "engine/tools/make_model.h"

namespace edge::bench {

// One `--name VALUE` flag (or a bare `--name` switch) bound to a variable, which holds its
// default until parsed.
struct Flag {
    std::string_view name;  // "--steps".
    std::string_view help;  // One line for --help.
    // The variable: exactly one of these is set.
    std::string* text = nullptr;  // A string flag's.
    bool* on = nullptr;           // A switch's (set to true when present).
    int64_t* wide = nullptr;      // An int64_t flag's.
    int* narrow = nullptr;        // An int flag's.
    int64_t min = 0;              // Integer flags: the smallest allowed value,
    int64_t max = INT32_MAX;      // and the largest.

    static Flag string(std::string_view name, std::string* v, std::string_view help) {
        return {.name = name, .help = help, .text = v};
    }
    static Flag boolean(std::string_view name, bool* v, std::string_view help) {
        return {.name = name, .help = help, .on = v};
    }
    static Flag integer(std::string_view name, int* v, int64_t min, std::string_view help) {
        return {.name = name, .help = help, .narrow = v, .min = min};
    }
    static Flag integer(std::string_view name, int64_t* v, int64_t min, std::string_view help) {
        return {.name = name, .help = help, .wide = v, .min = min, .max = INT64_MAX};
    }
    static Flag integer(std::string_view name, int* v, int64_t min, int64_t max,
                        std::string_view help) {
        return {.name = name, .help = help, .narrow = v, .min = min, .max = max};
    }
    static Flag integer(std::string_view name, int64_t* v, int64_t min, int64_t max,
                        std::string_view help) {
        return {.name = name, .help = help, .wide = v, .min = min, .max = max};
    }
};

// Resident set size of this process in bytes (VmRSS of /proc/self/status), 0 when unreadable.
inline int64_t rss_bytes() {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("VmRSS:", 0) == 0) {
            return std::stoll(line.substr(6)) * 1024;
        }
    }
    return 0;
}

[[noreturn]] inline void usage_error(const char* program, const std::string& what) {
    std::fprintf(stderr, "%s: %s (see --help)\n", program, what.c_str());
    std::exit(2);
}

// Sets the flags' variables from argv; `about` opens the --help text.
inline void parse_flags(int argc, char** argv, const std::vector<Flag>& flags,
                        std::string_view about) {
    const char* program = argv[0];
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            std::printf("%.*s\n\nflags:\n", static_cast<int>(about.size()), about.data());
            for (const Flag& f : flags) {
                std::printf("  %-16.*s %.*s\n", static_cast<int>(f.name.size()), f.name.data(),
                            static_cast<int>(f.help.size()), f.help.data());
            }
            std::exit(0);
        }
        const Flag* flag = nullptr;
        for (const Flag& f : flags) {
            flag = f.name == arg ? &f : flag;
        }
        if (flag == nullptr) {
            usage_error(program, "unknown argument '" + std::string(arg) + "'");
        }
        if (flag->on != nullptr) {
            *flag->on = true;
            continue;
        }
        if (i + 1 >= argc) {
            usage_error(program, std::string(arg) + " needs a value");
        }
        const std::string_view value = argv[++i];
        if (flag->text != nullptr) {
            *flag->text = value;
            continue;
        }
        int64_t n = 0;
        const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
        if (ec != std::errc() || end != value.data() + value.size() || n < flag->min ||
            n > flag->max) {
            const bool open = flag->max == INT64_MAX || flag->max == INT32_MAX;
            usage_error(program, std::string(arg) + " takes an integer " +
                                     (open ? ">= " + std::to_string(flag->min)
                                           : "in " + std::to_string(flag->min) + ".." +
                                                 std::to_string(flag->max)) +
                                     ", not '" + std::string(value) + "'");
        }
        if (flag->wide != nullptr) {
            *flag->wide = n;
        } else {
            *flag->narrow = static_cast<int>(n);
        }
    }
}

// For the benches that take at most one positional count (bench_gossip_sim N, bench_forward_hop
// N): `--help` prints `about` (exit 0), a count that is not a whole number in [min, max] or a
// second argument is a usage error (exit 2). `fallback` when none is given.
inline int64_t positional_count(int argc, char** argv, std::string_view about, int64_t fallback,
                                int64_t min, int64_t max) {
    if (argc > 1 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
        std::printf("%.*s\n", static_cast<int>(about.size()), about.data());
        std::exit(0);
    }
    if (argc > 2) {
        usage_error(argv[0], "unexpected argument '" + std::string(argv[2]) + "'");
    }
    if (argc < 2) {
        return fallback;
    }
    const std::string_view value = argv[1];
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || end != value.data() + value.size() || n < min || n > max) {
        usage_error(argv[0], "the count must be a whole number in " + std::to_string(min) + ".." +
                                 std::to_string(max) + ", not '" + std::string(value) + "'");
    }
    return n;
}

// The comma-separated names of `list`, each one of `known` (else a usage error naming them).
inline std::vector<std::string> known_names(const char* program, std::string_view flag,
                                            std::string_view list,
                                            const std::vector<std::string>& known) {
    std::vector<std::string> out;
    while (!list.empty()) {
        const size_t comma = list.find(',');
        const std::string name(list.substr(0, comma));
        list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
        if (name.empty()) {
            continue;
        }
        if (std::find(known.begin(), known.end(), name) == known.end()) {
            std::string names;
            for (const std::string& k : known) {
                names += (names.empty() ? "" : ", ") + k;
            }
            usage_error(program, std::string(flag) + ": unknown name '" + name + "' (known: " +
                                     names + ")");
        }
        out.push_back(name);
    }
    if (out.empty()) {
        usage_error(program, std::string(flag) + " names nothing");
    }
    return out;
}

// Step times of one phase. The rate is taken from the median step, as the bandwidth probe takes
// the median pass: on a shared VM the real-time scheduler's throttling (5% of each second goes to
// other processes) and other tenants stretch a few steps to 5-10x the median (seen: 12 ms steps,
// a few of 60 ms), which a whole-run mean charges to the engine and the probe's median does not.
// run_rate gives the whole-run rate beside it.
struct StepTimes {
    std::vector<double> seconds;
    std::chrono::steady_clock::time_point run_start = std::chrono::steady_clock::now();

    // Records the step that started at t0.
    void add(std::chrono::steady_clock::time_point t0) {
        seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    // Tokens per second at the median step, each step producing `tokens`.
    double median_rate(double tokens) const {
        std::vector<double> s = seconds;
        std::sort(s.begin(), s.end());
        return s.empty() ? 0.0 : tokens / s[s.size() / 2];
    }
    double run_rate(double tokens) const {
        return static_cast<double>(seconds.size()) * tokens /
               std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    }
};

namespace detail {

// The temporary checkpoint folder of the running bench ("" when none), for the signal handler.
inline char g_temp_checkpoint[4096];

// SIGINT/SIGTERM while a temporary checkpoint exists: dies of the signal as it would have, and
// leaves behind a child (made by _Fork, which unlike fork runs no atfork handler and takes no
// malloc lock) that waits until this process is gone, every thread of it that might still be
// writing the checkpoint included, then runs `rm -rf` on it. Async-signal-safe calls only.
inline void remove_temp_checkpoint_and_die(int sig) {
    if (g_temp_checkpoint[0] != '\0') {
        const pid_t parent = getpid();
        if (_Fork() == 0) {
            while (getppid() == parent) {
                const timespec wait{0, 20'000'000};
                nanosleep(&wait, nullptr);
            }
            char rm[] = "/bin/rm", flags[] = "-rf", end[] = "--";
            char* args[] = {rm, flags, end, g_temp_checkpoint, nullptr};
            char* no_env[] = {nullptr};
            execve(rm, args, no_env);
            _exit(127);
        }
    }
    // Pending until the handler returns and unblocks it, then fatal.
    signal(sig, SIG_DFL);
    raise(sig);
}

// std::exit on an error path runs no destructors: removes the temporary checkpoint then.
inline void remove_temp_checkpoint_at_exit() {
    if (g_temp_checkpoint[0] != '\0') {
        std::error_code ec;
        std::filesystem::remove_all(g_temp_checkpoint, ec);
        g_temp_checkpoint[0] = '\0';
    }
}

}  // namespace detail

// The checkpoint a bench runs on: `dir` when it is given, otherwise make-model's `preset` of
// `arch` (seed 1) written to a fresh temporary folder, removed when this is destroyed. With
// `fill`, a given `dir` that holds no checkpoint yet receives the preset and keeps it. Exits with
// the error when the preset cannot be written.
class BenchCheckpoint {
  public:
    explicit BenchCheckpoint(std::string dir, const std::string& preset = "bench",
                             const std::string& arch = "qwen3_moe", bool fill = false)
        : dir_(std::move(dir)) {
        if (!dir_.empty() &&
            (!fill || std::filesystem::exists(std::filesystem::path(dir_) / "config.json"))) {
            return;
        }
        if (dir_.empty()) {
            dir_ = (std::filesystem::temp_directory_path() /
                    ("edge_bench_" + arch + "_" + std::to_string(std::random_device{}())))
                       .string();
            temporary_ = true;
            // Interrupted (Ctrl-C, timeout), the bench must not leave gigabytes in $TMPDIR.
            if (dir_.size() < sizeof(detail::g_temp_checkpoint)) {
                // The first byte last: a handler never sees a half-written path.
                detail::g_temp_checkpoint[0] = '\0';
                std::memcpy(detail::g_temp_checkpoint + 1, dir_.c_str() + 1, dir_.size());
                detail::g_temp_checkpoint[0] = dir_[0];
                struct sigaction sa {};
                sa.sa_handler = detail::remove_temp_checkpoint_and_die;
                // Both blocked in the handler, and so in the child it leaves (execve keeps the
                // mask): a signal sent to the whole process group cannot kill that child.
                sigemptyset(&sa.sa_mask);
                sigaddset(&sa.sa_mask, SIGINT);
                sigaddset(&sa.sa_mask, SIGTERM);
                sigaction(SIGINT, &sa, nullptr);
                sigaction(SIGTERM, &sa, nullptr);
                static const bool at_exit =
                    std::atexit(detail::remove_temp_checkpoint_at_exit) == 0;
                (void)at_exit;
            }
        }
        engine::MakeModelOptions mo;
        mo.preset = preset;
        mo.arch = arch;
        mo.out_dir = dir_;
        mo.seed = 1;
        mo.overwrite = true;  // `fill`: a dir without config.json may hold a partial write.
        std::fprintf(stderr, "writing the %s preset of %s to %s\n", preset.c_str(), arch.c_str(),
                     dir_.c_str());
        if (Status st = engine::write_random_checkpoint(mo); !st.ok()) {
            std::fprintf(stderr, "make-model: %s\n", st.to_string().c_str());
            remove();
            std::exit(1);
        }
        evict_from_page_cache(dir_);
    }

    // Writes back and drops the page cache of every file in `dir`. A file just written sits in
    // the page cache in small folios, which the engine's mapping then gets with 4 KiB entries
    // (FilePmdMapped 120 MB of the bench preset's 2.5 GB) until khugepaged collapses them, hours
    // later; read back from disk through the engine's huge-page mapping it comes in as 2 MiB
    // folios (FilePmdMapped 2.5 GB), which decode at 2 threads measured ~15% faster. With
    // --model, do the same once after make-model (`sync; dd if=F iflag=nocache count=0`).
    static void evict_from_page_cache(const std::string& dir) {
        std::error_code ec;
        for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
            const int fd = ::open(e.path().c_str(), O_RDONLY);
            if (fd >= 0) {
                ::fdatasync(fd);
                ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
                ::close(fd);
            }
        }
    }
    ~BenchCheckpoint() { remove(); }
    BenchCheckpoint(const BenchCheckpoint&) = delete;
    BenchCheckpoint& operator=(const BenchCheckpoint&) = delete;

    const std::string& dir() const { return dir_; }

  private:
    void remove() {
        if (temporary_) {
            detail::g_temp_checkpoint[0] = '\0';
            std::error_code ec;
            std::filesystem::remove_all(dir_, ec);
            temporary_ = false;
        }
    }

    std::string dir_;
    bool temporary_ = false;
};

}  // namespace edge::bench
