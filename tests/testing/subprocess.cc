#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/testing/test_certs.h"

extern char** environ;

namespace edge::testing {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& v) {
    std::vector<char*> out;
    for (const std::string& s : v) {
        out.push_back(const_cast<char*>(s.c_str()));
    }
    out.push_back(nullptr);
    return out;
}

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// Polls waitpid; a child is an external process, so there is no timer to drive instead.
int wait_for(pid_t pid, int timeout_ms, bool& reaped) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        int status = 0;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            reaped = true;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        if (std::chrono::steady_clock::now() > deadline) {
            return -1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

}  // namespace

CommandResult run(const std::vector<std::string>& argv, int timeout_ms, const std::string& input) {
    TempDir dir;
    std::string out_path = dir.file("out");
    std::string err_path = dir.file("err");
    std::string in_path = dir.write("in", input);
    pid_t pid = fork();
    if (pid == 0) {
        // A group of its own: a script cut at the timeout (whose EXIT trap a SIGKILL skips)
        // leaves no daemons or load loops behind to slow every later test.
        setpgid(0, 0);
        int in = open(in_path.c_str(), O_RDONLY);
        int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(in, 0);
        dup2(out, 1);
        dup2(err, 2);
        auto args = c_strings(argv);
        execvp(args[0], args.data());
        _exit(127);
    }
    setpgid(pid, pid);  // As the child does: whichever runs first, the group exists.
    CommandResult result;
    bool reaped = false;
    result.exit_code = wait_for(pid, timeout_ms, reaped);
    if (!reaped) {
        kill(-pid, SIGKILL);
        waitpid(pid, nullptr, 0);
    }
    result.out = slurp(out_path);
    result.err = slurp(err_path);
    return result;
}

bool have_program(const std::string& program) {
    return std::system(("command -v " + program + " >/dev/null 2>&1").c_str()) == 0;
}

Child::Child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
             const std::string& stderr_path) {
    std::vector<std::string> full_env;
    for (char** e = environ; *e != nullptr; ++e) {
        full_env.push_back(*e);
    }
    full_env.insert(full_env.end(), env.begin(), env.end());
    pid_ = fork();
    if (pid_ == 0) {
        int devnull = open("/dev/null", O_RDWR);
        int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(err, 2);
        auto args = c_strings(argv);
        auto envp = c_strings(full_env);
        execve(args[0], args.data(), envp.data());
        _exit(127);
    }
}

Child::~Child() {
    if (pid_ > 0 && !reaped_) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
    }
}

void Child::signal(int sig) {
    if (pid_ > 0 && !reaped_) {
        kill(pid_, sig);
    }
}

int Child::wait(int timeout_ms) { return wait_for(pid_, timeout_ms, reaped_); }

}  // namespace edge::testing
