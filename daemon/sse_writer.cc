#include "daemon/sse_writer.h"

namespace edge::daemon {

std::string SseWriter::format_event(std::string_view json) {
    std::string out;
    out.reserve(json.size() + 8);
    out += "data: ";
    out += json;
    out += "\n\n";
    return out;
}

void SseWriter::begin(std::vector<tls::HttpHeader> headers) {
    if (begun_) {
        return;
    }
    begun_ = true;
    tls::HttpResponse head;
    head.status = 200;
    head.content_type = "text/event-stream";
    head.headers = std::move(headers);
    head.headers.push_back({"Cache-Control", "no-cache"});
    head.headers.push_back({"X-Accel-Buffering", "no"});
    channel_->begin_stream(std::move(head));
}

void SseWriter::event(std::string_view json) {
    begin();
    if (!finished_) {
        channel_->write(format_event(json));
    }
}

void SseWriter::events(const std::vector<std::string>& jsons) {
    if (jsons.empty()) {
        return;  // Nothing to write: not even the head (a whole answer writes none).
    }
    begin();
    if (finished_) {
        return;
    }
    std::string all;
    for (const std::string& json : jsons) {
        all += format_event(json);
    }
    channel_->write(std::move(all));
}

void SseWriter::comment(std::string_view text) {
    begin();
    if (!finished_) {
        std::string line = ": ";
        line += text;
        line += "\n\n";
        channel_->write(std::move(line));
    }
}

void SseWriter::done() {
    begin();
    if (finished_) {
        return;
    }
    finished_ = true;
    channel_->write("data: [DONE]\n\n");
    channel_->end_stream();
}

}  // namespace edge::daemon
