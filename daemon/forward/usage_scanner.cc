#include "daemon/forward/usage_scanner.h"

#include <algorithm>

#include <boost/json.hpp>

#include "daemon/api/completion.h"

namespace edge::daemon::forward {

void UsageScanner::feed_json(std::string_view body) {
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(body, ec);
    if (ec || !v.is_object()) {
        return;
    }
    const boost::json::value* usage = v.get_object().if_contains("usage");
    if (usage == nullptr || !usage->is_object()) {
        return;
    }
    const boost::json::object& u = usage->get_object();
    // A negative count from a peer would refund the tenant's token budgets: never below 0.
    if (const auto* p = u.if_contains("prompt_tokens"); p != nullptr && p->is_int64()) {
        prompt_tokens_ = std::max<int64_t>(p->get_int64(), 0);
    }
    if (const auto* c = u.if_contains("completion_tokens"); c != nullptr && c->is_int64()) {
        completion_tokens_ = std::max<int64_t>(c->get_int64(), 0);
    }
}

void UsageScanner::parse_event(std::string_view event) {
    constexpr std::string_view kData = "data: ";
    if (reported_ || event.substr(0, kData.size()) != kData ||
        event.find("\"usage\":{") == std::string_view::npos) {
        return;
    }
    feed_json(event.substr(kData.size()));
}

bool UsageScanner::take_report(std::string_view event) {
    constexpr std::string_view kComment = ": ";
    if (!event.starts_with(kComment) ||
        !event.substr(kComment.size()).starts_with(api::kUsageReportComment)) {
        return false;
    }
    feed_json(R"({"usage":)" +
              std::string(event.substr(kComment.size() + api::kUsageReportComment.size())) + "}");
    reported_ = true;
    return true;
}

std::string UsageScanner::feed_events(std::string_view bytes) {
    std::string out;
    partial_.append(bytes);
    size_t start = 0;
    for (;;) {
        size_t end = partial_.find("\n\n", std::max(start, scanned_));
        if (end == std::string::npos) {
            break;
        }
        std::string_view event(partial_.data() + start, end - start);
        if (passing_) {
            passing_ = false;  // The tail of an over-long event: relayed, not parsed.
            out.append(partial_, start, end + 2 - start);
        } else if (!take_report(event)) {
            parse_event(event);
            ended_ = ended_ || event == "data: [DONE]";
            out.append(partial_, start, end + 2 - start);
        }
        start = end + 2;
    }
    partial_.erase(0, start);
    if (passing_ || partial_.size() > kMaxPartialEvent) {
        passing_ = true;
        // Keep the last byte only, to notice a "\n\n" that straddles two pieces.
        if (partial_.size() > 1) {
            out.append(partial_, 0, partial_.size() - 1);
            partial_.erase(0, partial_.size() - 1);
        }
    }
    scanned_ = partial_.empty() ? 0 : partial_.size() - 1;
    return out;
}

std::string UsageScanner::flush() {
    std::string out = std::move(partial_);
    partial_.clear();
    scanned_ = 0;
    passing_ = false;
    return out;
}

}  // namespace edge::daemon::forward
