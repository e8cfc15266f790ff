#include "daemon/file_watcher.h"

#include <sys/stat.h>

#include <cerrno>

namespace edge::daemon {

FileStamp stamp_file(const std::string& path) {
    struct stat st {};
    FileStamp s;
    if (::stat(path.c_str(), &st) != 0) {
        s.error = errno != 0 ? errno : EIO;
        return s;
    }
    s.device = static_cast<uint64_t>(st.st_dev);
    s.inode = static_cast<uint64_t>(st.st_ino);
    s.size = static_cast<int64_t>(st.st_size);
    s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
    s.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
    return s;
}

std::map<std::string, FileStamp> stamp_files(const std::vector<std::string>& paths) {
    std::map<std::string, FileStamp> stamps;
    for (const std::string& p : paths) {
        stamps[p] = stamp_file(p);
    }
    return stamps;
}

FileWatcher::FileWatcher(std::chrono::milliseconds interval, Paths paths, OnChange on_change)
    : interval_(interval), paths_(std::move(paths)), on_change_(std::move(on_change)) {
    loaded_ = stamp_files(paths_());
    last_poll_ = loaded_;
    thread_ = std::thread([this] { run(); });
}

FileWatcher::~FileWatcher() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

void FileWatcher::loaded(const std::map<std::string, FileStamp>& stamps) {
    std::lock_guard lock(mu_);
    for (const auto& [path, stamp] : stamps) {
        loaded_[path] = stamp;
    }
}

void FileWatcher::run() {
    for (;;) {
        {
            std::unique_lock lock(mu_);
            if (wake_.wait_for(lock, interval_, [this] { return stopping_; })) {
                return;
            }
        }
        const std::vector<std::string> changed = poll();
        if (!changed.empty()) {
            on_change_(changed);
        }
    }
}

std::vector<std::string> FileWatcher::poll() {
    const std::map<std::string, FileStamp> now = stamp_files(paths_());
    std::lock_guard lock(mu_);
    std::vector<std::string> changed;
    bool settled = true;
    for (const auto& [p, stamp] : now) {
        auto was = loaded_.find(p);
        if (was != loaded_.end() && was->second == stamp) {
            continue;
        }
        changed.push_back(p);
        auto before = last_poll_.find(p);
        settled = settled && before != last_poll_.end() && before->second == stamp;
    }
    last_poll_ = now;
    if (changed.empty() || !settled) {
        return {};
    }
    for (const std::string& p : changed) {
        loaded_[p] = now.at(p);  // Reported once, whatever the reload makes of it.
    }
    return changed;
}

}  // namespace edge::daemon
