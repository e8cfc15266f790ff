#pragma once

// FileWatcher notices that files were replaced or rewritten, for the certificates a daemon
// serves: a renewal tool (certbot, cert-manager, a deploy script) writes new files and the daemon
// reloads them without a SIGHUP. It polls stat() of each file every `interval` (links followed),
// so every way of replacing a file is seen the same way: a rewrite in place, a rename over it, a
// symlink pointed at a new target (certbot's live/ links, Kubernetes' ..data swap), a file
// removed. A change is reported once the files have stayed as they are for one more poll, so a
// writer caught between the certificate and its key is not read half done; each state of the
// files is reported once, whether the reload it triggers succeeds or not.
//
// Polling rather than inotify: a handful of stat() calls every few seconds costs nothing, and it
// needs no watch on each directory of each link's chain to follow symlink swaps.
//
// Threading: one thread of its own calls `paths` and `on_change`, never while holding the
// watcher's lock, so they may take the caller's locks and call loaded(). loaded() from any thread.
// The destructor stops the thread and waits for a call in progress.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace edge::daemon {

// What stat() says of a file; equal stamps mean the file was not touched.
struct FileStamp {
    int error = 0;  // errno of a failed stat (ENOENT: missing), else 0 and the fields below.
    uint64_t device = 0;
    uint64_t inode = 0;
    int64_t size = 0;
    int64_t mtime_ns = 0;
    int64_t ctime_ns = 0;

    bool operator==(const FileStamp&) const = default;
};

// stat() of `path`, links followed.
FileStamp stamp_file(const std::string& path);

// Stamps of each of `paths`.
std::map<std::string, FileStamp> stamp_files(const std::vector<std::string>& paths);

class FileWatcher {
public:
    // The files to watch now (asked at every poll: the set may change).
    using Paths = std::function<std::vector<std::string>()>;
    // The files (among Paths) that changed since they were last loaded, by name, each once.
    using OnChange = std::function<void(const std::vector<std::string>& changed)>;

    // Takes the files' stamps now as loaded and starts polling. `interval` > 0.
    FileWatcher(std::chrono::milliseconds interval, Paths paths, OnChange on_change);
    ~FileWatcher();
    FileWatcher(const FileWatcher&) = delete;
    FileWatcher& operator=(const FileWatcher&) = delete;

    // The owner (re)read these files, as they were when `stamps` were taken (before the read):
    // that state is not reported again. A SIGHUP reload calls this, so the watcher does not
    // reload what the signal just did.
    void loaded(const std::map<std::string, FileStamp>& stamps);

private:
    void run();
    // One poll; the changed files to report (empty: none).
    std::vector<std::string> poll();

    const std::chrono::milliseconds interval_;
    const Paths paths_;
    const OnChange on_change_;
    std::mutex mu_;
    std::condition_variable wake_;
    bool stopping_ = false;                       // Guarded by mu_.
    std::map<std::string, FileStamp> loaded_;     // Guarded by mu_: as last loaded or reported.
    std::map<std::string, FileStamp> last_poll_;  // Guarded by mu_: as the previous poll saw.
    std::thread thread_;
};

}  // namespace edge::daemon
