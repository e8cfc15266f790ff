#pragma once

// Validator collects the first error of a request body being parsed (parse_openai_request and
// the parsers of its fields in request_*.h): typed getters that fail with a 400 naming the field.
// Not thread-safe: one per parse.

#include <boost/json.hpp>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/api/api_error.h"

namespace edge::daemon::api {

// Fails with the first error found; fields are checked in a fixed order.
class Validator {
  public:
    std::optional<ApiError> error;

    bool fail(std::string message, std::string param);

    std::optional<double> number(const boost::json::value& v, const std::string& name, double min,
                                 double max);

    std::optional<int64_t> integer(const boost::json::value& v, const std::string& name,
                                   int64_t min, int64_t max);

    std::optional<bool> boolean(const boost::json::value& v, const std::string& name);

    const boost::json::string* string(const boost::json::value& v, const std::string& name);

  private:
    static std::string trim(double d);
};

// Only `allowed` keys in `o`, else a failure naming `where.key`.
bool only_keys(Validator& v, const boost::json::object& o, const std::string& where,
               std::initializer_list<std::string_view> allowed);

// A required string member `key` of `o` (at `where`).
const boost::json::string* required_string(Validator& v, const boost::json::object& o,
                                           const std::string& where, std::string_view key);

}  // namespace edge::daemon::api
