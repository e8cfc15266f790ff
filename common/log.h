#pragma once

// Structured logging: one JSON object per line on stderr (or a sink a test installs), with the
// time, level, event name and typed fields: {"ts":"...","level":"info","event":"listening",...}.
// Thread-safe: a line is formatted first and written with one call under a mutex.
// Never pass secrets (API keys, Authorization headers, prompt text) as fields.

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <variant>

namespace edge::log {

enum class Level { kDebug = 0, kInfo, kWarn, kError };

struct Field {
    using Value = std::variant<std::string, int64_t, uint64_t, double, bool>;
    Field(std::string_view k, std::string_view v) : key(k), value(std::string(v)) {}
    Field(std::string_view k, const std::string& v) : key(k), value(v) {}
    Field(std::string_view k, const char* v) : key(k), value(std::string(v)) {}
    Field(std::string_view k, bool v) : key(k), value(v) {}
    Field(std::string_view k, double v) : key(k), value(v) {}
    Field(std::string_view k, float v) : key(k), value(static_cast<double>(v)) {}
    template <typename I>
        requires(std::is_integral_v<I> && std::is_signed_v<I>)
    Field(std::string_view k, I v) : key(k), value(static_cast<int64_t>(v)) {}
    template <typename I>
        requires(std::is_integral_v<I> && std::is_unsigned_v<I> && !std::is_same_v<I, bool>)
    Field(std::string_view k, I v) : key(k), value(static_cast<uint64_t>(v)) {}

    std::string_view key;
    Value value;
};

// Lines below `level` are dropped. Default kInfo; EDGE_LOG_LEVEL=debug|info|warn|error overrides.
void set_level(Level level);
Level level();

// Replaces where lines go (nullptr restores stderr). For tests.
void set_sink(std::function<void(std::string_view line)> sink);

// Formats one line; exposed for tests.
std::string format_line(Level level, std::string_view event, std::initializer_list<Field> fields);
std::string format_line(Level level, std::string_view event, std::span<const Field> fields);

void write(Level level, std::string_view event, std::initializer_list<Field> fields);
// For a list of fields made at run time.
void write(Level level, std::string_view event, std::span<const Field> fields);

inline void debug(std::string_view event, std::initializer_list<Field> fields = {}) {
    if (level() <= Level::kDebug) {
        write(Level::kDebug, event, fields);
    }
}
inline void info(std::string_view event, std::initializer_list<Field> fields = {}) {
    write(Level::kInfo, event, fields);
}
inline void warn(std::string_view event, std::initializer_list<Field> fields = {}) {
    write(Level::kWarn, event, fields);
}
inline void error(std::string_view event, std::initializer_list<Field> fields = {}) {
    write(Level::kError, event, fields);
}

}  // namespace edge::log
