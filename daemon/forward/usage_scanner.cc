#include "daemon/forward/usage_scanner.h"

#include <algorithm>
#include <utility>

#include <boost/json.hpp>

#include "daemon/api/completion.h"

namespace edge::daemon::forward {

namespace {

// The start of the error event a failing stream ends with (api::Response, and OpenAI's).
constexpr std::string_view kErrorEventStart = "data: {\"error\":";

// An event's text without the end of its last line; a line holds no CR or LF, so no more goes.
std::string_view without_line_end(std::string_view event) {
    while (!event.empty() && (event.back() == '\n' || event.back() == '\r')) {
        event.remove_suffix(1);
    }
    return event;
}

}  // namespace

bool UsageScanner::read_usage(std::string_view body) {
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(body, ec);
    if (ec || !v.is_object()) {
        return false;
    }
    const boost::json::value* usage = v.get_object().if_contains("usage");
    if (usage == nullptr || !usage->is_object()) {
        return false;
    }
    const boost::json::object& u = usage->get_object();
    const auto* p = u.if_contains("prompt_tokens");
    const auto* c = u.if_contains("completion_tokens");
    // A negative count from a peer would refund the tenant's token budgets: never below 0.
    if (p != nullptr && p->is_int64()) {
        prompt_tokens_ = std::max<int64_t>(p->get_int64(), 0);
    }
    if (c != nullptr && c->is_int64()) {
        completion_tokens_ = std::max<int64_t>(c->get_int64(), 0);
    }
    return p != nullptr && p->is_int64() && c != nullptr && c->is_int64();
}

void UsageScanner::feed_json(std::string_view body) {
    if (!read_usage(body)) {
        read_error(body);
    }
}

void UsageScanner::read_error(std::string_view json) {
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(json, ec);
    const boost::json::object* root = ec ? nullptr : v.if_object();
    const boost::json::value* error = root != nullptr ? root->if_contains("error") : nullptr;
    const boost::json::value* code =
        error != nullptr && error->is_object() ? error->get_object().if_contains("code") : nullptr;
    if (code != nullptr && code->is_string()) {
        error_code_ = std::string(code->get_string().subview());
    }
}

void UsageScanner::parse_event(std::string_view event) {
    constexpr std::string_view kData = "data: ";
    if (reported_ || event.substr(0, kData.size()) != kData ||
        event.find("\"usage\":{") == std::string_view::npos) {
        return;
    }
    read_usage(event.substr(kData.size()));
}

bool UsageScanner::take_report(std::string_view event) {
    constexpr std::string_view kComment = ": ";
    if (!event.starts_with(kComment) ||
        !event.substr(kComment.size()).starts_with(api::kUsageReportComment)) {
        return false;
    }
    // Withheld either way (it is this server's own comment), but only a report that reads as
    // both counts is one: a malformed one leaves the forward charged its reservation, not 0.
    reported_ =
        read_usage(R"({"usage":)" +
                   std::string(event.substr(kComment.size() + api::kUsageReportComment.size())) +
                   "}") ||
        reported_;
    return true;
}

std::string UsageScanner::feed_events(std::string_view bytes) {
    std::string out;
    size_t start = 0;  // The current event's first byte in partial_.
    size_t i = partial_.size();
    partial_.append(bytes);
    for (; i < partial_.size(); ++i) {
        const char ch = partial_[i];
        const AfterCr after_cr = std::exchange(after_cr_, AfterCr::kNone);
        if (ch == '\n' && after_cr != AfterCr::kNone) {
            if (after_cr != AfterCr::kInEvent) {
                // The end of a blank line that a lone CR seemed to end: it goes with that event,
                // else the next event would start with it and not be recognised.
                if (after_cr == AfterCr::kRelayed) {
                    out.push_back('\n');
                }
                start = i + 1;
            }
            continue;
        }
        if (ch != '\n' && ch != '\r') {
            at_line_start_ = false;
            continue;
        }
        if (!at_line_start_) {
            at_line_start_ = true;  // The end of one of the event's lines.
            if (ch == '\r') {
                after_cr_ = AfterCr::kInEvent;
            }
            continue;
        }
        // A blank line: the event ends with it.
        bool relayed = true;
        if (passing_) {
            passing_ = false;  // The tail of an over-long event: relayed, not parsed.
        } else {
            const std::string_view event =
                without_line_end(std::string_view(partial_).substr(start, i - start));
            relayed = !take_report(event);
            if (relayed) {
                parse_event(event);
                ended_ = ended_ || event == "data: [DONE]";
                if (!failed_ && event.starts_with(kErrorEventStart)) {
                    failed_ = true;
                    read_error(event.substr(6));
                }
            }
        }
        if (relayed) {
            out.append(partial_, start, i + 1 - start);
        }
        if (ch == '\r') {
            after_cr_ = relayed ? AfterCr::kRelayed : AfterCr::kWithheld;
        }
        start = i + 1;
    }
    if (passing_ || partial_.size() - start > kMaxPartialEvent) {
        // The line state above finds the event's end without its start held: relay it all. An
        // error event this long is not parsed, but its start says the stream failed (its code,
        // after the message, stays unknown).
        if (!passing_ && !failed_ &&
            std::string_view(partial_).substr(start).starts_with(kErrorEventStart)) {
            failed_ = true;
        }
        passing_ = true;
        out.append(partial_, start);
        start = partial_.size();
    }
    partial_.erase(0, start);
    return out;
}

std::string UsageScanner::flush() {
    std::string out = std::move(partial_);
    partial_.clear();
    // A peer whose stream ends without the report's blank line still sent the report: it is
    // charged and, as ours, not shown to the client.
    if (!passing_ && take_report(without_line_end(out))) {
        out.clear();
    }
    at_line_start_ = true;
    after_cr_ = AfterCr::kNone;
    passing_ = false;
    return out;
}

std::string UsageScanner::cut() {
    const bool open = passing_;
    flush();  // What it would relay is an event the stream broke inside: not relayed.
    return open ? "\n\n" : "";
}

}  // namespace edge::daemon::forward
