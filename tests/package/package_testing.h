#pragma once

// Helpers for the package suite (header-only: the suite globs *_test.cc): the built binary, files,
// waiting for a daemon's log line, a loopback listening socket, and a daemon process started the
// way systemd's socket activation starts it (the socket as descriptor 3, LISTEN_FDS/LISTEN_PID).
// Not thread-safe; one owner thread per object.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/loopback_socket.h"

extern char** environ;

namespace edge::package_testing {

inline const std::string kBinary = EDGE_BINARY_DIR "/daemon/edgeserve";

inline std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// Polls the file until it contains `needle`. The writer is another process, so there is no clock
// to drive instead; false after `timeout_ms`.
inline bool wait_for_text(const std::string& path, const std::string& needle,
                          int timeout_ms = 30000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
        if (read_file(path).find(needle) != std::string::npos) {
            return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

// "key":NUMBER from a JSON log; 0 when absent.
inline uint16_t port_from_log(const std::string& log, const std::string& key) {
    std::smatch m;
    std::regex re("\"" + key + "\":([0-9]+)");
    if (!std::regex_search(log, m, re)) {
        return 0;
    }
    return static_cast<uint16_t>(std::stoi(m[1]));
}

// A listening TCP socket on 127.0.0.1 with a free port (close-on-exec; the caller owns it).
inline int listen_loopback(uint16_t& port) { return testing::bind_loopback(SOCK_STREAM, port); }

// `edgeserve run --config CONFIG`, stderr to `log_path`; with `listen_fd` >= 0 the socket is
// passed as descriptor 3 with LISTEN_FDS=1 and LISTEN_PID set to the child's pid, exactly as
// systemd does. Every other descriptor is closed in the child.
class DaemonProcess {
  public:
    // `second_fd`: a second inherited socket (descriptor 4); both must be above 4.
    DaemonProcess(const std::string& config, int listen_fd, const std::string& log_path,
                  std::vector<std::string> env = {}, int second_fd = -1) {
        std::vector<std::string> argv = {kBinary, "run", "--config", config};
        for (char** e = environ; *e; ++e) {
            if (std::strncmp(*e, "LISTEN_", 7) != 0 && std::strncmp(*e, "NOTIFY_SOCKET=", 14)) {
                env.emplace_back(*e);
            }
        }
        if (listen_fd >= 0) {
            env.emplace_back(second_fd >= 0 ? "LISTEN_FDS=2" : "LISTEN_FDS=1");
        }
        std::vector<char*> c_argv;
        for (auto& a : argv) {
            c_argv.push_back(a.data());
        }
        c_argv.push_back(nullptr);
        std::vector<char*> c_env;
        for (auto& e : env) {
            c_env.push_back(e.data());
        }
        char pid_entry[64] = "LISTEN_PID=";
        if (listen_fd >= 0) {
            c_env.push_back(pid_entry);
        }
        c_env.push_back(nullptr);
        int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        REQUIRE(log_fd >= 0);
        pid_ = fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            // Only async-signal-safe calls from here on.
            dup2(log_fd, 2);
            int null_fd = open("/dev/null", O_RDWR);
            dup2(null_fd, 0);
            dup2(null_fd, 1);
            if (listen_fd >= 0) {
                if (listen_fd == 3) {
                    fcntl(3, F_SETFD, 0);
                } else {
                    dup2(listen_fd, 3);
                }
                if (second_fd >= 0) {
                    dup2(second_fd, 4);
                }
                // LISTEN_PID=<our pid>, formatted by hand.
                char digits[20];
                int n = 0;
                for (pid_t p = getpid(); p > 0; p /= 10) {
                    digits[n++] = static_cast<char>('0' + p % 10);
                }
                char* out = pid_entry + std::strlen("LISTEN_PID=");
                while (n > 0) {
                    *out++ = digits[--n];
                }
                *out = '\0';
            }
            syscall(SYS_close_range, listen_fd < 0 ? 3u : second_fd < 0 ? 4u : 5u, ~0u, 0u);
            execve(c_argv[0], c_argv.data(), c_env.data());
            _exit(127);
        }
        close(log_fd);
    }
    ~DaemonProcess() {
        if (!reaped_) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
    }
    DaemonProcess(const DaemonProcess&) = delete;
    DaemonProcess& operator=(const DaemonProcess&) = delete;

    pid_t pid() const { return pid_; }
    void signal(int sig) { kill(pid_, sig); }
    bool running() {
        if (reaped_) {
            return false;
        }
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
            reaped_ = true;
            exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            return false;
        }
        return true;
    }
    // The exit code, or -1 when it did not exit normally within `timeout_ms`.
    int wait(int timeout_ms) {
        auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        while (running()) {
            if (std::chrono::steady_clock::now() > deadline) {
                return -1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return exit_code_;
    }

  private:
    pid_t pid_ = -1;
    bool reaped_ = false;
    int exit_code_ = -1;
};

}  // namespace edge::package_testing
