// One connection's answers (HttpSession, tls/http_session.h): a whole response in one write,
// the server's own error answers, and the answers a handler produces through its channel, whole
// or streamed (chunked, or an event stream with keepalive comments), with the write deadlines
// and the response record each gets.

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <string>
#include <string_view>

#include "common/log.h"
#include "tls/http_framing.h"
#include "tls/http_session.h"
#include "tls/response_channel_impl.h"

namespace edge::tls {
namespace {

// Whether an event stream whose body so far ends with `tail` is between events: nothing written
// yet, or a blank line just ended one. Other blank-line spellings (LF CRLF, CR CR) count as
// inside an event: they only cost a keepalive comment, where a wrong guess would cut an event.
bool ends_event(std::string_view tail) {
    return tail.empty() || tail.ends_with("\n\n") || tail.ends_with("\r\n\r\n");
}

// Appends `data` to `tail` and keeps the last 4 bytes of the two: enough for ends_event when a
// blank line is split between chunks.
void keep_tail(std::string& tail, std::string_view data) {
    constexpr size_t kKeep = 4;
    tail += data.substr(data.size() - std::min(data.size(), kKeep));
    tail.erase(0, tail.size() - std::min(tail.size(), kKeep));
}

}  // namespace

net::awaitable<bool> HttpSession::write_full(HttpResponse& response, int version, bool keep_alive,
                                             bool head_only) {
    // Formatted by hand into a buffer the session reuses: one TLS write, no allocation per
    // request once the buffer has grown.
    std::string& out = write_buffer_;
    out.clear();
    format_head(out, response, version, keep_alive, response.body.size());
    set_deadline(limits_->write_timeout);
    boost::system::error_code wec;
    if (head_only) {
        auto head = net::buffer(out);
        wec = co_await stream_.write(head);
    } else if (response.body.size() <= 16 * 1024) {
        // Head and body in one buffer: one TLS record.
        out += response.body;
        auto single = net::buffer(out);
        wec = co_await stream_.write(single);
    } else {
        auto head = net::buffer(out);
        wec = co_await stream_.write(head);
        // write_timeout per slice, not for the whole body: a slow client that keeps reading a
        // large answer (a forwarded one may be 64 MiB) is not cut; one that stops is.
        constexpr size_t kSlice = 256 * 1024;
        for (size_t at = 0; !wec && at < response.body.size(); at += kSlice) {
            set_deadline(limits_->write_timeout);
            auto slice = net::buffer(response.body.data() + at,
                                     std::min(kSlice, response.body.size() - at));
            wec = co_await stream_.write(slice);
        }
    }
    if (out.capacity() > 64 * 1024) {
        std::string().swap(out);
    }
    co_return !wec;
}

net::awaitable<void> HttpSession::reject(int status, std::string_view message, int version,
                                         std::string_view method, std::string_view target) {
    HttpResponse response{status, "application/json", {}, error_body(message)};
    HttpRequest line;  // For its path(): the route the record is counted under.
    line.target = std::string(target);
    ResponseRecord record;
    record.method = method;
    record.path = target.empty() ? std::string_view() : line.path();
    record.client = remote_;
    record.status = status;
    const bool head_only = method == "HEAD";  // Its answer has no content (RFC 9110 9.3.2).
    record.complete = co_await write_full(response, version, false, head_only);
    record.body_bytes = record.complete && !head_only ? response.body.size() : 0;
    // From the start of the request's read, not of this answer: a 408 held the connection for
    // the whole timeout.
    record.duration = Clock::now() - request_start_;
    server_.observer_->on_response(record);
}

net::awaitable<bool> HttpSession::serve_response(int version, bool keep_alive,
                                                 Clock::time_point start, std::string_view method,
                                                 std::string_view path) {
    int status = kClientClosedRequest;
    uint64_t body_bytes = 0;
    bool streaming = false;
    bool event_stream = false;       // A text/event-stream head went out.
    Clock::time_point last_write{};  // Of the stream's head or last chunk.
    // The stream's last bytes written (4 at most): whether they end an event, so a keepalive
    // comment may go next. A handler (the forward relay) may write an event in pieces, and the
    // blank line that ends one may be split between two of them.
    std::string tail;
    bool ok = true;
    const auto write_timeout = limits_->write_timeout;
    // RFC 9110 section 9.3.2: no content in an answer to HEAD, whatever the handler produced.
    const bool head_only = method == "HEAD";
    for (;;) {
        if (pending_.empty()) {
            if (client_gone_) {
                ok = false;
                break;
            }
            // A write deadline bounds one write, not the wait for the next piece: generation
            // may pause (a preempted request) while the client keeps reading.
            clear_deadline();
            // The watcher reads behind any bytes already buffered (a pipelined request), up to
            // max_header_bytes of them; past that the client is not watched until the next
            // request is parsed.
            if (!watcher_running_ && buffer_.size() < limits_->max_header_bytes) {
                start_watcher();
                // The watcher may have finished at once (a client already gone, its EOF already
                // read), and its wake-up then found no wait to cancel: look again before waiting.
                continue;
            }
            const auto keepalive = limits_->stream_keepalive;
            if (event_stream && !head_only && keepalive.count() > 0 && ends_event(tail)) {
                // A silent event stream gets a comment (HttpLimits::stream_keepalive), between
                // events only: inside one it would become part of that event's data.
                const Clock::time_point due = last_write + keepalive;
                if (Clock::now() >= due) {
                    pending_.push_back(
                        Piece{Piece::kChunk, {}, ": keepalive\n\n", Piece::Account::kNone});
                    continue;
                }
                co_await wait_signal(due - Clock::now());
                continue;
            }
            co_await wait_signal(std::chrono::hours(24 * 365));
            continue;
        }
        Piece piece = std::move(pending_.front());
        pending_.pop_front();
        keep_alive = keep_alive && !draining();
        if (piece.kind == Piece::kFull && !streaming) {
            status = piece.response.status;
            ok = co_await write_full(piece.response, version, keep_alive, head_only);
            if (ok && !head_only) {
                body_bytes = piece.response.body.size();
            }
            break;
        }
        if (piece.kind == Piece::kHead && !streaming) {
            streaming = true;
            event_stream = piece.response.content_type.starts_with("text/event-stream");
            status = piece.response.status;
            if (version < 11) {
                keep_alive = false;  // The end of the body is the end of the connection.
            }
            write_buffer_.clear();
            format_head(write_buffer_, piece.response, version, keep_alive, std::nullopt);
            set_deadline(write_timeout);
            auto head = net::buffer(write_buffer_);
            boost::system::error_code ec = co_await stream_.write(head);
            if (ec) {
                ok = false;
                break;
            }
            last_write = Clock::now();
            continue;
        }
        if (piece.kind == Piece::kChunk && streaming) {
            // Coalesce whatever else is already queued into one write.
            size_t counted = 0;
            int oversized = 0;
            auto take = [&](const Piece& p) {
                counted += p.account == Piece::Account::kQueued ? p.data.size() : 0;
                oversized += p.account == Piece::Account::kOversized ? 1 : 0;
            };
            take(piece);
            while (!pending_.empty() && pending_.front().kind == Piece::kChunk) {
                take(pending_.front());
                piece.data += pending_.front().data;
                pending_.pop_front();
            }
            // What the channel counted for these chunks is off its backlog once they are
            // written (or dropped).
            auto written = [&] {
                channel_->queued_.fetch_sub(counted, std::memory_order_relaxed);
                if (oversized > 0) {
                    channel_->oversized_queued_.fetch_sub(oversized);
                }
            };
            if (piece.data.empty() || head_only) {
                written();
                continue;
            }
            set_deadline(write_timeout);
            boost::system::error_code ec;
            if (version >= 11) {
                // Size line, data and CRLF in one buffer: one TLS record per write.
                std::string& out = write_buffer_;
                out.clear();
                char size[24];
                auto end = std::to_chars(size, size + sizeof(size), piece.data.size(), 16).ptr;
                out.append(size, end);
                out += "\r\n";
                out += piece.data;
                out += "\r\n";
                auto chunk = net::buffer(out);
                ec = co_await stream_.write(chunk);
                if (out.capacity() > 64 * 1024) {
                    std::string().swap(out);
                }
            } else {
                auto raw = net::buffer(piece.data);
                ec = co_await stream_.write(raw);
            }
            written();
            if (ec) {
                ok = false;
                break;
            }
            last_write = Clock::now();
            body_bytes += piece.data.size();
            keep_tail(tail, piece.data);
            continue;
        }
        if (piece.kind == Piece::kEnd && streaming) {
            if (version >= 11 && !head_only) {
                set_deadline(write_timeout);
                static constexpr std::string_view kLast = "0\r\n\r\n";
                auto last = net::buffer(kLast.data(), kLast.size());
                boost::system::error_code ec = co_await stream_.write(last);
                ok = !ec;
            }
            if (version < 11) {
                keep_alive = false;
            }
            break;
        }
        if (piece.kind == Piece::kAbandoned) {
            // The handler let go of the channel with its answer unfinished (a handler bug): a
            // 500 when nothing went out yet; a stream begun is cut (the connection closes, so
            // the client sees it incomplete rather than waiting for the rest forever).
            log::error("handler_abandoned_response",
                       {{"path", path}, {"streaming", streaming}, {"peer", remote_}});
            if (streaming) {
                ok = false;
                break;
            }
            HttpResponse error{500, "text/plain; charset=utf-8", {}, "internal error\n"};
            status = error.status;
            ok = co_await write_full(error, version, keep_alive, head_only);
            if (ok && !head_only) {
                body_bytes = error.body.size();
            }
            break;
        }
        // Out-of-order calls (a chunk before the head, a second respond) are ignored.
    }
    clear_deadline();  // The last write is done; what comes next sets its own.
    if (!ok) {
        // Before the answer counts as done, so the handler hears of it (a failed or timed-out
        // write cancels the generation, as a client that left does).
        mark_client_gone();
        answer_cut_ = true;
    }
    response_done_ = true;
    gone_callback_ = nullptr;
    ResponseRecord record;
    record.method = method;
    record.path = path;
    record.client = remote_;
    record.status = status;
    record.complete = ok;
    record.body_bytes = body_bytes;
    record.duration = Clock::now() - start;
    if (!ok && channel_.use_count() > 1) {
        // The handler still holds the channel (a generation being cancelled): its last notes
        // (tokens, outcome) come after this, so the record goes out when it lets go.
        channel_->defer_record(LateRecord{std::string(method), std::string(path), remote_, record,
                                          std::move(notes_), server_.late_observer_});
        co_return false;
    }
    record.notes = notes_;
    server_.observer_->on_response(record);
    co_return ok && keep_alive;
}

}  // namespace edge::tls
