#include "daemon/forward/usage_scanner.h"

#include <boost/json.hpp>

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
    if (const auto* p = u.if_contains("prompt_tokens"); p != nullptr && p->is_int64()) {
        prompt_tokens_ = p->get_int64();
    }
    if (const auto* c = u.if_contains("completion_tokens"); c != nullptr && c->is_int64()) {
        completion_tokens_ = c->get_int64();
    }
}

void UsageScanner::parse_event(std::string_view event) {
    constexpr std::string_view kData = "data: ";
    if (event.substr(0, kData.size()) != kData ||
        event.find("\"usage\":{") == std::string_view::npos) {
        return;
    }
    feed_json(event.substr(kData.size()));
}

void UsageScanner::feed_events(std::string_view bytes) {
    while (!bytes.empty()) {
        size_t end = bytes.find("\n\n");
        // An event's "\n\n" may straddle two pieces.
        if (!partial_.empty() && partial_.back() == '\n' && bytes.front() == '\n') {
            end = std::string_view::npos;
            if (!skipping_) {
                partial_.pop_back();
                parse_event(partial_);
            }
            partial_.clear();
            skipping_ = false;
            bytes.remove_prefix(1);
            continue;
        }
        if (end == std::string_view::npos) {
            if (!skipping_ && partial_.size() + bytes.size() > kMaxPartialEvent) {
                skipping_ = true;
                partial_.clear();
            }
            if (skipping_) {
                // Keep the last byte only, to notice a straddling "\n\n".
                partial_.assign(1, bytes.back());
            } else {
                partial_.append(bytes);
            }
            return;
        }
        if (!skipping_) {
            if (partial_.empty()) {
                parse_event(bytes.substr(0, end));
            } else {
                partial_.append(bytes.substr(0, end));
                parse_event(partial_);
            }
        }
        partial_.clear();
        skipping_ = false;
        bytes.remove_prefix(end + 2);
    }
}

}  // namespace edge::daemon::forward
