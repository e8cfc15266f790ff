// FileWatcher on real files in a temporary directory: rewrites, renames over a file, symlink
// swaps and removals are reported once each, after the files have settled; loaded() states are
// not reported again; nothing is reported while nothing changes.

#include "daemon/file_watcher.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "tests/testing/test_certs.h"

using namespace edge;
using namespace std::chrono_literals;

namespace {

// What the watcher reported, in order.
class Reports {
public:
    void add(const std::vector<std::string>& changed) {
        {
            std::lock_guard lock(mu_);
            reports_.push_back(changed);
        }
        cv_.notify_all();
    }
    // Waits (up to 5 s) until there are `n` reports; all of them.
    std::vector<std::vector<std::string>> wait_for(size_t n) {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, 5s, [&] { return reports_.size() >= n; });
        return reports_;
    }
    size_t count() {
        std::lock_guard lock(mu_);
        return reports_.size();
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::vector<std::string>> reports_;
};

// Sets a file's mtime `seconds` ahead, so a rewrite within the same clock tick still differs
// (ctime changes as well, but not every filesystem has nanosecond stamps).
void touch_ahead(const std::string& path, int seconds) {
    namespace fs = std::filesystem;
    fs::last_write_time(path, fs::last_write_time(path) + std::chrono::seconds(seconds));
}

}  // namespace

TEST_CASE("file watcher: each change is reported once, after it settles") {
    testing::TempDir dir;
    const std::string cert = dir.write("a.crt", "one");
    const std::string key = dir.write("a.key", "one");
    Reports reports;
    daemon::FileWatcher watcher(
        20ms, [&] { return std::vector<std::string>{cert, key}; },
        [&](const std::vector<std::string>& changed) { reports.add(changed); });

    std::this_thread::sleep_for(120ms);
    CHECK(reports.count() == 0);  // Nothing changed: nothing reported.

    // A rewrite in place.
    dir.write("a.crt", "two, longer");
    auto r = reports.wait_for(1);
    REQUIRE(r.size() == 1);
    CHECK(r[0] == std::vector<std::string>{cert});

    // A new file renamed over the key (how most tools write), and the certificate touched.
    const std::string fresh = dir.write("a.key.tmp", "three");
    REQUIRE(::rename(fresh.c_str(), key.c_str()) == 0);
    touch_ahead(cert, 10);
    r = reports.wait_for(2);
    REQUIRE(r.size() == 2);
    CHECK(r[1] == std::vector<std::string>{cert, key});

    // Removed: reported (the reload then fails and says why), and not again while it stays so.
    std::filesystem::remove(key);
    r = reports.wait_for(3);
    REQUIRE(r.size() == 3);
    CHECK(r[2] == std::vector<std::string>{key});
    std::this_thread::sleep_for(120ms);
    CHECK(reports.count() == 3);

    // Back again.
    dir.write("a.key", "four");
    r = reports.wait_for(4);
    REQUIRE(r.size() == 4);
    CHECK(r[3] == std::vector<std::string>{key});
}

TEST_CASE("file watcher: a symlink pointed at a new target is a change") {
    // The layout of certbot's live/ directory and of Kubernetes secret volumes.
    testing::TempDir dir;
    dir.write("v1.crt", "first");
    dir.write("v2.crt", "second");
    const std::string link = dir.file("live.crt");
    REQUIRE(::symlink("v1.crt", link.c_str()) == 0);
    Reports reports;
    daemon::FileWatcher watcher(
        20ms, [&] { return std::vector<std::string>{link}; },
        [&](const std::vector<std::string>& changed) { reports.add(changed); });
    const std::string next = dir.file("live.crt.tmp");
    REQUIRE(::symlink("v2.crt", next.c_str()) == 0);
    REQUIRE(::rename(next.c_str(), link.c_str()) == 0);
    auto r = reports.wait_for(1);
    REQUIRE(r.size() == 1);
    CHECK(r[0] == std::vector<std::string>{link});
}

TEST_CASE("file watcher: a state the owner loaded itself is not reported") {
    testing::TempDir dir;
    const std::string cert = dir.write("a.crt", "one");
    Reports reports;
    // A long interval: the owner's reload happens between two polls.
    daemon::FileWatcher watcher(
        150ms, [&] { return std::vector<std::string>{cert}; },
        [&](const std::vector<std::string>& changed) { reports.add(changed); });
    dir.write("a.crt", "two, longer");
    watcher.loaded(daemon::stamp_files({cert}));  // As a SIGHUP reload of the same file does.
    std::this_thread::sleep_for(500ms);
    CHECK(reports.count() == 0);
    // A later change is still seen.
    dir.write("a.crt", "three, longer still");
    auto r = reports.wait_for(1);
    REQUIRE(r.size() == 1);
    CHECK(r[0] == std::vector<std::string>{cert});
}

TEST_CASE("file watcher: a file still being written is reported once it stops changing") {
    testing::TempDir dir;
    const std::string cert = dir.write("a.crt", "x");
    Reports reports;
    daemon::FileWatcher watcher(
        40ms, [&] { return std::vector<std::string>{cert}; },
        [&](const std::vector<std::string>& changed) { reports.add(changed); });
    // A change at every poll for a while: never settled, never reported.
    std::string content = "x";
    for (int i = 0; i < 8; ++i) {
        content += "more";
        dir.write("a.crt", content);
        std::this_thread::sleep_for(25ms);
    }
    const size_t while_writing = reports.count();
    CHECK(while_writing <= 1);  // A slow machine may see a pause as settled; not every write.
    auto r = reports.wait_for(while_writing + 1);
    CHECK(r.size() == while_writing + 1);
    std::this_thread::sleep_for(150ms);
    CHECK(reports.count() == while_writing + 1);
}
