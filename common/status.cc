#include "common/status.h"

namespace edge {

std::string_view status_code_name(StatusCode code) {
    switch (code) {
        case StatusCode::kOk: return "OK";
        case StatusCode::kCancelled: return "CANCELLED";
        case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
        case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
        case StatusCode::kNotFound: return "NOT_FOUND";
        case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
        case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
        case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
        case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
        case StatusCode::kAborted: return "ABORTED";
        case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
        case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
        case StatusCode::kInternal: return "INTERNAL";
        case StatusCode::kUnavailable: return "UNAVAILABLE";
        case StatusCode::kDataLoss: return "DATA_LOSS";
        case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
    }
    return "UNKNOWN";
}

std::string Status::to_string() const {
    if (ok()) {
        return "OK";
    }
    std::string out(status_code_name(code_));
    out += ": ";
    out += message_;
    return out;
}

Status Status::with_context(std::string_view context) const {
    if (ok()) {
        return *this;
    }
    std::string message(context);
    message += ": ";
    message += message_;
    return Status(code_, std::move(message));
}

Status cancelled_error(std::string m) { return Status(StatusCode::kCancelled, std::move(m)); }
Status invalid_argument_error(std::string m) {
    return Status(StatusCode::kInvalidArgument, std::move(m));
}
Status deadline_exceeded_error(std::string m) {
    return Status(StatusCode::kDeadlineExceeded, std::move(m));
}
Status not_found_error(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
Status already_exists_error(std::string m) {
    return Status(StatusCode::kAlreadyExists, std::move(m));
}
Status permission_denied_error(std::string m) {
    return Status(StatusCode::kPermissionDenied, std::move(m));
}
Status resource_exhausted_error(std::string m) {
    return Status(StatusCode::kResourceExhausted, std::move(m));
}
Status failed_precondition_error(std::string m) {
    return Status(StatusCode::kFailedPrecondition, std::move(m));
}
Status aborted_error(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
Status out_of_range_error(std::string m) { return Status(StatusCode::kOutOfRange, std::move(m)); }
Status unimplemented_error(std::string m) {
    return Status(StatusCode::kUnimplemented, std::move(m));
}
Status internal_error(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
Status unavailable_error(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
Status data_loss_error(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
Status unauthenticated_error(std::string m) {
    return Status(StatusCode::kUnauthenticated, std::move(m));
}

}  // namespace edge
