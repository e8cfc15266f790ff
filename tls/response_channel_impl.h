#pragma once

// ChannelImpl: the ResponseChannel a handler answers one request through. Its calls come from any
// thread and reach the session (tls/http_session.h) on the connection's strand; it bounds what a
// stream queues for a slow reader and keeps the record of an answer cut while the handler still
// holds it (LateRecord). Internal to tls/http_session.cc; includes Beast.

#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tls/http_session.h"

namespace edge::tls {

// The session whose handler runs on this thread right now (inside HttpHandler::handle, on the
// connection's strand): calls its channel makes there apply at once, not through the executor.
inline thread_local HttpSession* t_handling = nullptr;

// A request's record whose answer ended incomplete (the client left, a write failed) while its
// handler still held the channel, generation still running: it waits in the channel for the
// handler's last notes (tokens, outcome) and goes to the observer when the channel is destroyed.
struct LateRecord {
    std::string method;
    std::string path;
    std::string client;
    ResponseRecord record;  // Its views point into the strings above and `notes`.
    std::vector<ResponseNote> notes;
    std::shared_ptr<HttpServer::Impl::ObserverSlot> observer;
};

class ChannelImpl final : public ResponseChannel, public std::enable_shared_from_this<ChannelImpl> {
  public:
    ChannelImpl(net::any_io_executor executor, std::weak_ptr<HttpSession> session, uint64_t seq,
                size_t max_queued)
        : executor_(std::move(executor)),
          session_(std::move(session)),
          seq_(seq),
          max_queued_(max_queued) {}

    ~ChannelImpl() override {
        if (!late_) {
            return;
        }
        LateRecord& r = *late_;
        r.record.method = r.method;
        r.record.path = r.path;
        r.record.client = r.client;
        r.record.notes = r.notes;
        std::lock_guard lock(r.observer->mu);
        if (r.observer->observer != nullptr) {
            try {
                r.observer->observer->on_response(r.record);
            } catch (...) {
                // A destructor must not throw; the record is lost rather than the process.
            }
        }
    }

    // Session strand: the answer is over; the record waits for this channel's destruction.
    void defer_record(LateRecord record) {
        std::lock_guard lock(late_mu_);
        late_ = std::move(record);
    }

    void respond(HttpResponse response) override {
        deliver(Piece{Piece::kFull, std::move(response), {}});
    }
    void begin_stream(HttpResponse head) override {
        deliver(Piece{Piece::kHead, std::move(head), {}});
    }
    void write(std::string chunk) override {
        // Counted here, before the hand-over to the strand, so that what waits in the
        // io_context's queue is bounded too.
        const size_t n = chunk.size();
        // A chunk larger than the whole limit (a final event carrying many logprobs, a long
        // tool-call argument) is let through uncounted, up to kOversizedQueued of them waiting
        // at once: counted, it would mark a reader slow by its size alone. One at a time was not
        // enough: a second one written before the first reached the socket (the final event
        // and the usage event behind it) cut a reader that kept up. Only a backlog of the others
        // marks a slow reader; memory stays bounded by the limit plus kOversizedQueued chunks,
        // as one more oversized chunk while they all wait is counted (and cuts the stream).
        if (n > max_queued_ && take_oversized_slot()) {
            deliver(Piece{Piece::kChunk, {}, std::move(chunk), Piece::Account::kOversized});
            return;
        }
        const size_t queued = queued_.fetch_add(n, std::memory_order_relaxed) + n;
        if (queued > max_queued_) {
            queued_.fetch_sub(n, std::memory_order_relaxed);
            if (!overflowed_.exchange(true)) {
                on_session(
                    [seq = seq_, queued](HttpSession& s) { s.cancel_slow_stream(seq, queued); });
            }
            return;
        }
        deliver(Piece{Piece::kChunk, {}, std::move(chunk)});
    }
    void end_stream() override { deliver(Piece{Piece::kEnd, {}, {}}); }
    // The handler's last copy of the channel is gone (handler_channel()'s deleter).
    void released() { deliver(Piece{Piece::kAbandoned, {}, {}}); }
    void on_client_gone(std::function<void()> callback) override {
        if (t_handling != nullptr) {
            if (auto s = session_.lock(); s.get() == t_handling) {
                s->set_gone_callback(seq_, std::move(callback));
                return;
            }
        }
        // A session already destroyed closed its connection before this request's answer (set
        // before answering, this registration is ahead of the answer on the strand): gone.
        net::dispatch(executor_,
                      [session = session_, seq = seq_, callback = std::move(callback)]() mutable {
                          if (auto s = session.lock()) {
                              s->set_gone_callback(seq, std::move(callback));
                          } else {
                              callback();
                          }
                      });
    }
    void note(std::string name, std::variant<std::string, int64_t> value) override {
        ResponseNote note{std::move(name), std::move(value)};
        if (add_late_note(note)) {
            return;
        }
        if (t_handling != nullptr) {
            if (auto s = session_.lock(); s.get() == t_handling && s->add_note(seq_, note)) {
                return;
            }
        }
        // Holds the channel, so a record deferred meanwhile waits for this note.
        net::dispatch(executor_, [session = session_, seq = seq_, note = std::move(note),
                                  self = shared_from_this()]() mutable {
            auto s = session.lock();
            if (!s || !s->add_note(seq, note)) {
                self->add_late_note(note);
            }
        });
    }

  private:
    static constexpr int kOversizedQueued = 2;

    // One of the kOversizedQueued places for an uncounted chunk, if one is free.
    bool take_oversized_slot() {
        int queued = oversized_queued_.load();
        while (queued < kOversizedQueued &&
               !oversized_queued_.compare_exchange_weak(queued, queued + 1)) {
        }
        return queued < kOversizedQueued;
    }

    bool add_late_note(ResponseNote& note) {
        std::lock_guard lock(late_mu_);
        if (!late_) {
            return false;
        }
        late_->notes.push_back(std::move(note));
        return true;
    }

    void deliver(Piece piece) {
        on_session([seq = seq_, piece = std::move(piece)](HttpSession& s) mutable {
            s.push(seq, std::move(piece));
        });
    }
    // Runs f(session) on the session's strand: at once when called from its handler, else
    // through the executor (nothing when the session is gone).
    template <typename F>
    void on_session(F&& f) {
        if (t_handling != nullptr) {
            if (auto s = session_.lock(); s.get() == t_handling) {
                f(*s);
                return;
            }
        }
        net::dispatch(executor_, [session = session_, f = std::forward<F>(f)]() mutable {
            if (auto s = session.lock()) {
                f(*s);
            }
        });
    }

    net::any_io_executor executor_;
    std::weak_ptr<HttpSession> session_;
    uint64_t seq_;
    size_t max_queued_;
    std::atomic<bool> overflowed_{false};
    std::mutex late_mu_;
    std::optional<LateRecord> late_;

  public:
    // Bytes of chunks written to the channel and not yet to the socket; the session subtracts
    // what it wrote.
    std::atomic<size_t> queued_{0};
    // Uncounted oversized chunks waiting to be written; the session subtracts those it wrote.
    std::atomic<int> oversized_queued_{0};
};

}  // namespace edge::tls
