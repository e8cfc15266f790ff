#include "daemon/access_log.h"

#include <algorithm>
#include <chrono>
#include <variant>
#include <vector>

#include "common/log.h"
#include "daemon/api/completion.h"

namespace edge::daemon {
namespace {

// The method as logged. A 408's record carries the request line's first word as the client sent
// it, unchecked (any bytes, up to max_header_bytes of them): what is not an HTTP method token
// (RFC 9110 5.6.2) of at most kMaxMethodBytes is logged as "(unparsed)". Beast checked the
// methods of the requests it parsed, and "" (an answer made before a method was read) stays.
std::string_view logged_method(std::string_view method) {
    constexpr size_t kMaxMethodBytes = 32;
    constexpr std::string_view kTokenPunctuation = "!#$%&'*+-.^_`|~";
    const auto is_tchar = [&](char c) {
        return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
               kTokenPunctuation.find(c) != std::string_view::npos;
    };
    if (method.size() > kMaxMethodBytes || !std::all_of(method.begin(), method.end(), is_tchar)) {
        return "(unparsed)";
    }
    return method;
}

}  // namespace

void AccessLog::on_connection_opened() {
    if (next_ != nullptr) {
        next_->on_connection_opened();
    }
}

void AccessLog::on_connection_closed() {
    if (next_ != nullptr) {
        next_->on_connection_closed();
    }
}

void AccessLog::on_connection_rejected(std::string_view reason) {
    if (next_ != nullptr) {
        next_->on_connection_rejected(reason);
    }
}

void AccessLog::on_handshake(bool resumed, std::string_view failure_reason) {
    if (next_ != nullptr) {
        next_->on_handshake(resumed, failure_reason);
    }
}

void AccessLog::on_stream_cancelled(std::string_view reason) {
    if (next_ != nullptr) {
        next_->on_stream_cancelled(reason);
    }
}

void AccessLog::on_response(const tls::ResponseRecord& record) {
    if (next_ != nullptr) {
        next_->on_response(record);
    }
    if (!enabled_) {
        return;
    }
    const double ms = std::chrono::duration<double, std::milli>(record.duration).count();
    // The path as sent may hold any byte: the log shows what is not UTF-8 as \xNN.
    const std::string path = api::logprob_token_text(record.path);
    std::vector<log::Field> fields{{"listener", listener_},
                                   {"method", logged_method(record.method)},
                                   {"path", path},
                                   {"status", record.status},
                                   {"duration_ms", ms},
                                   {"body_bytes", record.body_bytes},
                                   {"complete", record.complete},
                                   {"client", record.client}};
    fields.reserve(fields.size() + record.notes.size());
    // Notes may carry what a client or peer sent (a forwarding site's name, a request id): their
    // text is held to UTF-8 the same way, so the line stays valid JSON.
    for (const tls::ResponseNote& note : record.notes) {
        if (const std::string* text = std::get_if<std::string>(&note.value)) {
            fields.emplace_back(note.name, api::logprob_token_text(*text));
        } else {
            fields.emplace_back(note.name, std::get<int64_t>(note.value));
        }
    }
    log::write(log::Level::kInfo, "request", fields);
}

}  // namespace edge::daemon
