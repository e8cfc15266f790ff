#pragma once

// Result<T> is either a value of T or a non-OK Status (abseil's StatusOr, in our vocabulary).
// Accessing value() of an error Result is a bug in our code and aborts through EDGE_CHECK.
// Thread contract: like T; a Result is not synchronized.

#include <optional>
#include <type_traits>
#include <utility>

#include "common/check.h"
#include "common/status.h"

namespace edge {

template <typename T>
class [[nodiscard]] Result {
public:
    // An error; `status` must not be OK.
    Result(Status status) : status_(std::move(status)) {  // NOLINT(runtime/explicit)
        EDGE_CHECK(!status_.ok(), "Result built from an OK Status without a value");
    }
    Result(const T& value) : value_(value) {}  // NOLINT(runtime/explicit)
    Result(T&& value) : value_(std::move(value)) {}  // NOLINT(runtime/explicit)
    template <typename U>
        requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, T> &&
                 !std::is_same_v<std::decay_t<U>, Status>)
    Result(U&& value) : value_(std::forward<U>(value)) {}  // NOLINT(runtime/explicit)

    bool ok() const { return status_.ok(); }
    const Status& status() const { return status_; }

    const T& value() const& {
        EDGE_CHECK(ok(), "value() of an error Result: " + status_.to_string());
        return *value_;
    }
    T& value() & {
        EDGE_CHECK(ok(), "value() of an error Result: " + status_.to_string());
        return *value_;
    }
    T&& value() && {
        EDGE_CHECK(ok(), "value() of an error Result: " + status_.to_string());
        return std::move(*value_);
    }
    const T& operator*() const& { return value(); }
    T& operator*() & { return value(); }
    T&& operator*() && { return std::move(*this).value(); }
    const T* operator->() const { return &value(); }
    T* operator->() { return &value(); }

    T value_or(T fallback) const& { return ok() ? *value_ : std::move(fallback); }

private:
    Status status_;
    std::optional<T> value_;
};

}  // namespace edge

// Evaluates `rexpr` (a Result); on error returns its Status, else moves the value into `lhs`,
// which may be a declaration (`auto x`) or an existing variable.
#define EDGE_ASSIGN_OR_RETURN(lhs, rexpr) \
    EDGE_ASSIGN_OR_RETURN_IMPL(EDGE_STATUS_CONCAT(edge_result_, __LINE__), lhs, rexpr)
#define EDGE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
    auto tmp = (rexpr);                             \
    if (!tmp.ok()) {                                \
        return tmp.status();                        \
    }                                               \
    lhs = std::move(tmp).value()
