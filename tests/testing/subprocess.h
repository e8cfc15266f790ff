#pragma once

// Running programs from tests: run() for short commands (stdout/stderr captured, bounded time),
// Child for a long-running daemon (spawned with extra environment, stderr to a file, signalled
// and reaped by the test). Not thread-safe; one owner thread.

#include <sys/types.h>

#include <string>
#include <vector>

namespace edge::testing {

struct CommandResult {
    int exit_code = -1;  // -1: did not exit normally (signal or timeout).
    std::string out;
    std::string err;
};

// Runs argv[0] (looked up in PATH) with stdin from /dev/null or `input`, in a process group of
// its own; kills the group (what it started too) after `timeout_ms`.
CommandResult run(const std::vector<std::string>& argv, int timeout_ms = 20000,
                  const std::string& input = "");

// True when `program` is found in PATH.
bool have_program(const std::string& program);

class Child {
public:
    // `env` entries "NAME=value" are added to the inherited environment.
    Child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
          const std::string& stderr_path);
    ~Child();  // SIGKILLs and reaps a child still running.

    pid_t pid() const { return pid_; }
    void signal(int sig);
    // The exit code, or -1 when it did not exit normally within `timeout_ms`.
    int wait(int timeout_ms);

private:
    pid_t pid_ = -1;
    bool reaped_ = false;
};

}  // namespace edge::testing
