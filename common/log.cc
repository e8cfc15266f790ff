#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include <boost/json.hpp>

#include "common/clock.h"
#include "common/json_text.h"

namespace edge::log {
namespace {

Level level_from_env() {
    const char* env = std::getenv("EDGE_LOG_LEVEL");
    if (env == nullptr) {
        return Level::kInfo;
    }
    std::string_view v(env);
    if (v == "debug") return Level::kDebug;
    if (v == "warn") return Level::kWarn;
    if (v == "error") return Level::kError;
    return Level::kInfo;
}

std::atomic<Level>& current_level() {
    static std::atomic<Level> level{level_from_env()};
    return level;
}

std::mutex& sink_mutex() {
    static std::mutex mu;
    return mu;
}

std::function<void(std::string_view)>& sink() {
    static std::function<void(std::string_view)> s;
    return s;
}

std::string_view level_name(Level level) {
    switch (level) {
        case Level::kDebug: return "debug";
        case Level::kInfo: return "info";
        case Level::kWarn: return "warn";
        case Level::kError: return "error";
    }
    return "info";
}

std::string timestamp() {
    const int64_t us = SystemClock::instance().wall_now_us();
    // Floored, so a clock before 1970 still gives a fraction in [0, 1e6).
    const int64_t frac = ((us % 1'000'000) + 1'000'000) % 1'000'000;
    const auto secs = static_cast<std::time_t>((us - frac) / 1'000'000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[96];  // Room for any int in every field, so nothing is cut.
    std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(frac));
    return buf;
}

}  // namespace

void set_level(Level level) { current_level().store(level); }
Level level() { return current_level().load(); }

void set_sink(std::function<void(std::string_view)> s) {
    std::lock_guard lock(sink_mutex());
    sink() = std::move(s);
}

std::string format_line(Level lvl, std::string_view event, std::span<const Field> fields) {
    boost::json::object obj;
    obj["ts"] = timestamp();
    obj["level"] = level_name(lvl);
    obj["event"] = event;
    for (const Field& f : fields) {
        boost::json::string_view key(f.key.data(), f.key.size());
        std::visit([&](const auto& v) { obj[key] = v; }, f.value);
    }
    return json_text(obj);
}

std::string format_line(Level lvl, std::string_view event, std::initializer_list<Field> fields) {
    return format_line(lvl, event, std::span<const Field>(fields.begin(), fields.size()));
}

void write(Level lvl, std::string_view event, std::initializer_list<Field> fields) {
    write(lvl, event, std::span<const Field>(fields.begin(), fields.size()));
}

void write(Level lvl, std::string_view event, std::span<const Field> fields) {
    if (lvl < level()) {
        return;
    }
    std::string line = format_line(lvl, event, fields);
    std::lock_guard lock(sink_mutex());
    if (sink()) {
        sink()(line);
        return;
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
}

}  // namespace edge::log
