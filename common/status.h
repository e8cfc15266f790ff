#pragma once

// Status is the outcome of a fallible operation: kOk, or an error code with a message that says
// what failed and where (file:line:column, tensor name, config key). Result<T> holds either a value
// or a non-OK Status. Both are cheap to move, immutable after construction and safe to share
// between threads once built. Fallible functions return them instead of throwing; exceptions never
// cross a folder boundary.

#include <string>
#include <string_view>
#include <utility>

namespace edge {

enum class StatusCode {
    kOk = 0,
    kCancelled,
    kInvalidArgument,
    kDeadlineExceeded,
    kNotFound,
    kAlreadyExists,
    kPermissionDenied,
    kResourceExhausted,
    kFailedPrecondition,
    kAborted,
    kOutOfRange,
    kUnimplemented,
    kInternal,
    kUnavailable,
    kDataLoss,
    kUnauthenticated,
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
public:
    Status() = default;
    Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

    static Status ok_status() { return Status(); }

    bool ok() const { return code_ == StatusCode::kOk; }
    StatusCode code() const { return code_; }
    const std::string& message() const { return message_; }

    // "INVALID_ARGUMENT: message", or "OK".
    std::string to_string() const;

    // The same error with `context` and ": " put before its message; OK stays OK.
    Status with_context(std::string_view context) const;

    bool operator==(const Status& other) const = default;

private:
    StatusCode code_ = StatusCode::kOk;
    std::string message_;
};

inline Status ok_status() { return Status(); }
Status cancelled_error(std::string message);
Status invalid_argument_error(std::string message);
Status deadline_exceeded_error(std::string message);
Status not_found_error(std::string message);
Status already_exists_error(std::string message);
Status permission_denied_error(std::string message);
Status resource_exhausted_error(std::string message);
Status failed_precondition_error(std::string message);
Status aborted_error(std::string message);
Status out_of_range_error(std::string message);
Status unimplemented_error(std::string message);
Status internal_error(std::string message);
Status unavailable_error(std::string message);
Status data_loss_error(std::string message);
Status unauthenticated_error(std::string message);

}  // namespace edge

#define EDGE_STATUS_CONCAT_INNER(a, b) a##b
#define EDGE_STATUS_CONCAT(a, b) EDGE_STATUS_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define EDGE_RETURN_IF_ERROR(expr)                   \
    do {                                             \
        ::edge::Status edge_status_tmp_ = (expr);    \
        if (!edge_status_tmp_.ok()) {                \
            return edge_status_tmp_;                 \
        }                                            \
    } while (false)
