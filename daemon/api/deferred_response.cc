#include "daemon/api/deferred_response.h"

#include <charconv>

#include "daemon/cluster/route_planner.h"

namespace edge::daemon::api {

std::string encode_deferred_response(const tls::HttpResponse& response) {
    std::string out = std::to_string(response.status) + "\n" + response.content_type + "\n";
    for (const tls::HttpHeader& h : response.headers) {
        out += h.name + ": " + h.value + "\n";
    }
    out += "\n";
    out += response.body;
    return out;
}

std::optional<tls::HttpResponse> decode_deferred_response(std::string_view bytes) {
    auto next_line = [&bytes](std::string_view& line) {
        size_t end = bytes.find('\n');
        if (end == std::string_view::npos) {
            return false;
        }
        line = bytes.substr(0, end);
        bytes.remove_prefix(end + 1);
        return true;
    };
    tls::HttpResponse response;
    std::string_view line;
    if (!next_line(line)) {
        return std::nullopt;
    }
    auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), response.status);
    if (ec != std::errc() || end != line.data() + line.size() || response.status < 100 ||
        response.status > 599) {
        return std::nullopt;
    }
    if (!next_line(line)) {
        return std::nullopt;
    }
    response.content_type = std::string(line);
    for (;;) {
        if (!next_line(line)) {
            return std::nullopt;
        }
        if (line.empty()) {
            break;
        }
        size_t colon = line.find(": ");
        if (colon == std::string_view::npos || colon == 0) {
            return std::nullopt;
        }
        response.headers.push_back(
            {std::string(line.substr(0, colon)), std::string(line.substr(colon + 2))});
    }
    response.body = std::string(bytes);
    return response;
}

void DeferredHeadChannel::open(int64_t prompt_tokens) {
    std::lock_guard lock(mu_);
    if (opened_ || answered_) {
        return;
    }
    opened_ = true;
    tls::HttpResponse head;
    head.content_type = "application/octet-stream";
    head.headers.push_back({std::string(kDeferredHeadHeader), "1"});
    head.headers.push_back(
        {std::string(cluster::kPromptTokensHeader), std::to_string(prompt_tokens)});
    inner_->begin_stream(std::move(head));
}

void DeferredHeadChannel::respond(tls::HttpResponse response) {
    std::lock_guard lock(mu_);
    if (answered_) {
        return;
    }
    answered_ = true;
    if (!opened_) {
        inner_->respond(std::move(response));
        return;
    }
    inner_->write(encode_deferred_response(response));
    inner_->end_stream();
}

void DeferredHeadChannel::begin_stream(tls::HttpResponse head) {
    std::lock_guard lock(mu_);
    if (answered_ || opened_) {
        return;
    }
    answered_ = true;
    inner_->begin_stream(std::move(head));
}

void DeferredHeadChannel::write(std::string chunk) {
    std::lock_guard lock(mu_);
    if (answered_ && !opened_) {
        inner_->write(std::move(chunk));
    }
}

void DeferredHeadChannel::end_stream() {
    std::lock_guard lock(mu_);
    if (answered_ && !opened_) {
        inner_->end_stream();
    }
}

void DeferredHeadChannel::on_client_gone(std::function<void()> callback) {
    inner_->on_client_gone(std::move(callback));
}

}  // namespace edge::daemon::api
