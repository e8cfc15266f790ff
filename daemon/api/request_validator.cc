#include "daemon/api/request_validator.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace edge::daemon::api {

namespace json = boost::json;

bool Validator::fail(std::string message, std::string param) {
    if (!error) {
        error = invalid_request(std::move(message), std::move(param));
    }
    return false;
}

std::optional<double> Validator::number(const json::value& v, const std::string& name, double min,
                                        double max) {
    double d = 0;
    if (v.is_double()) {
        d = v.get_double();
    } else if (v.is_int64()) {
        d = static_cast<double>(v.get_int64());
    } else if (v.is_uint64()) {
        d = static_cast<double>(v.get_uint64());
    } else {
        fail("'" + name + "' must be a number", name);
        return std::nullopt;
    }
    if (!std::isfinite(d) || d < min || d > max) {
        fail("'" + name + "' must be between " + trim(min) + " and " + trim(max), name);
        return std::nullopt;
    }
    return d;
}

std::optional<int64_t> Validator::integer(const json::value& v, const std::string& name,
                                          int64_t min, int64_t max) {
    int64_t i = 0;
    if (v.is_int64()) {
        i = v.get_int64();
    } else if (v.is_uint64()) {
        if (v.get_uint64() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            fail("'" + name + "' is outside the 64-bit integer range", name);
            return std::nullopt;
        }
        i = static_cast<int64_t>(v.get_uint64());
    } else if (v.is_double() && std::trunc(v.get_double()) == v.get_double()) {
        // 1e16, or a whole number beyond 64 bits (parsed as a double). -2^63 converts
        // exactly; 2^63 would not.
        constexpr double kTwo63 = 9223372036854775808.0;
        const double d = v.get_double();
        if (!(d >= -kTwo63 && d < kTwo63)) {
            fail("'" + name + "' is outside the 64-bit integer range", name);
            return std::nullopt;
        }
        i = static_cast<int64_t>(d);
    } else {
        fail("'" + name + "' must be an integer", name);
        return std::nullopt;
    }
    if (i < min || i > max) {
        fail(
            "'" + name + "' must be between " + std::to_string(min) + " and " + std::to_string(max),
            name);
        return std::nullopt;
    }
    return i;
}

std::optional<bool> Validator::boolean(const json::value& v, const std::string& name) {
    if (!v.is_bool()) {
        fail("'" + name + "' must be a boolean", name);
        return std::nullopt;
    }
    return v.get_bool();
}

const json::string* Validator::string(const json::value& v, const std::string& name) {
    if (!v.is_string()) {
        fail("'" + name + "' must be a string", name);
        return nullptr;
    }
    return &v.get_string();
}

std::string Validator::trim(double d) {
    std::string s = std::to_string(d);
    while (s.size() > 1 && s.back() == '0') {
        s.pop_back();
    }
    if (!s.empty() && s.back() == '.') {
        s.pop_back();
    }
    return s;
}

// Only `allowed` keys in `o`, else a failure naming `where.key`.
bool only_keys(Validator& v, const json::object& o, const std::string& where,
               std::initializer_list<std::string_view> allowed) {
    for (const auto& kv : o) {
        const std::string_view key(kv.key().data(), kv.key().size());
        if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
            std::string field = where + "." + std::string(kv.key());
            return v.fail("unrecognized field '" + field + "'", field);
        }
    }
    return true;
}

// A required string member `key` of `o` (at `where`).
const json::string* required_string(Validator& v, const json::object& o, const std::string& where,
                                    std::string_view key) {
    const std::string field = where + "." + std::string(key);
    const json::value* value = o.if_contains(key);
    if (value == nullptr) {
        v.fail("'" + field + "' is required", field);
        return nullptr;
    }
    return v.string(*value, field);
}

}  // namespace edge::daemon::api
