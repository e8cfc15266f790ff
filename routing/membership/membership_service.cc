#include "routing/membership/membership_service.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <future>
#include <mutex>
#include <unordered_map>

#include "common/log.h"
#include "routing/membership/interface_address.h"

namespace edge::routing::membership {

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::ip::udp;
using boost::system::error_code;

Result<std::pair<std::string, uint16_t>> split_host_port(const std::string& addr) {
    std::string host;
    std::string port;
    if (!addr.empty() && addr[0] == '[') {
        const size_t close = addr.find(']');
        if (close == std::string::npos || close + 1 >= addr.size() || addr[close + 1] != ':') {
            return invalid_argument_error("address '" + addr + "' is not [host]:port");
        }
        host = addr.substr(1, close - 1);
        port = addr.substr(close + 2);
    } else {
        const size_t colon = addr.rfind(':');
        if (colon == std::string::npos) {
            return invalid_argument_error("address '" + addr + "' has no port");
        }
        host = addr.substr(0, colon);
        port = addr.substr(colon + 1);
    }
    if (host.empty() || port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos) {
        return invalid_argument_error("address '" + addr + "' is not host:port");
    }
    const unsigned long p = std::stoul(port);
    if (p > 65535) {
        return invalid_argument_error("address '" + addr + "' port out of range");
    }
    return std::make_pair(host, static_cast<uint16_t>(p));
}

namespace {

Result<asio::ip::address> parse_ip(const std::string& host) {
    error_code ec;
    auto ip = asio::ip::make_address(host, ec);
    if (ec) {
        return invalid_argument_error("'" + host + "' is not an IP address");
    }
    return ip;
}

std::string endpoint_string(const asio::ip::address& ip, uint16_t port) {
    return ip.is_v6() ? "[" + ip.to_string() + "]:" + std::to_string(port)
                      : ip.to_string() + ":" + std::to_string(port);
}

// A stream body is read in pieces of at most this many bytes, so the buffer holds only what the
// peer has actually sent.
constexpr size_t kStreamReadChunk = 64 * 1024;

std::array<uint8_t, 4> frame_header(size_t n) {
    return {static_cast<uint8_t>(n >> 24), static_cast<uint8_t>(n >> 16),
            static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)};
}

}  // namespace

class MembershipService::Impl final : public Transport, public std::enable_shared_from_this<Impl> {
public:
    Impl(asio::io_context& io) : io_(io), strand_(asio::make_strand(io)), udp_(strand_),
                                 acceptor_(strand_), timer_(strand_) {}

    Status bind(const std::string& host, uint16_t port) {
        EDGE_ASSIGN_OR_RETURN(auto ip, parse_ip(host));
        error_code ec;
        // Port 0: take a free UDP port, then the same TCP port (retry if TCP's is taken).
        for (int attempt = 0; attempt < 20; ++attempt) {
            udp_.open(ip.is_v6() ? udp::v6() : udp::v4(), ec);
            if (!ec) udp_.bind(udp::endpoint(ip, port), ec);
            if (ec) {
                return unavailable_error("gossip: cannot bind UDP " + endpoint_string(ip, port) +
                                         ": " + ec.message());
            }
            const uint16_t bound = udp_.local_endpoint().port();
            acceptor_.open(ip.is_v6() ? tcp::v6() : tcp::v4(), ec);
            if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
            if (!ec) acceptor_.bind(tcp::endpoint(ip, bound), ec);
            if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
            if (!ec) {
                port_ = bound;
                host_ = ip;
                return ok_status();
            }
            udp_.close();
            acceptor_.close();
            if (port != 0) {
                return unavailable_error("gossip: cannot bind TCP " + endpoint_string(ip, port) +
                                         ": " + ec.message());
            }
        }
        return unavailable_error("gossip: no port free for both UDP and TCP on " + host);
    }

    // Transport: called on the strand by Memberlist.
    void send_packet(const std::string& addr, std::vector<uint8_t> bytes) override {
        auto ep = resolve(addr);
        if (!ep.ok() || closed_) {
            return;
        }
        auto buf = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
        const udp::endpoint to(ep->first, ep->second);
        const Duration delay = packet_delay_ ? packet_delay_(addr) : Duration::zero();
        if (delay > Duration::zero()) {
            // Testing only (see set_packet_delay): hold the datagram back, then send it.
            auto self = shared_from_this();
            auto t = std::make_shared<asio::steady_timer>(strand_);
            t->expires_after(delay);
            t->async_wait(asio::bind_executor(strand_, [self, t, buf, to](error_code ec) {
                if (ec || self->closed_) {
                    return;
                }
                self->udp_.async_send_to(asio::buffer(*buf), to,
                                         asio::bind_executor(self->strand_,
                                                             [buf](error_code, size_t) {}));
            }));
            return;
        }
        udp_.async_send_to(asio::buffer(*buf), to,
                           asio::bind_executor(strand_, [buf](error_code, size_t) {}));
    }

    void send_stream(const std::string& addr, uint64_t id, std::vector<uint8_t> request) override {
        auto self = shared_from_this();
        // A seed (gossip.join) may be a host name, resolved at each attempt; members gossip
        // their IP addresses.
        auto hp = split_host_port(addr);
        Result<asio::ip::address> ip =
            hp.ok() ? parse_ip(hp->first) : Result<asio::ip::address>(hp.status());
        if (!hp.ok() || closed_) {
            Status st = hp.ok() ? unavailable_error("gossip: service closed") : hp.status();
            asio::post(strand_, [self, id, st] { self->finish_stream(id, st); });
            return;
        }
        auto conn = std::make_shared<StreamConn>(strand_);
        conn->out = std::move(request);
        conn->header_out = frame_header(conn->out.size());
        conn->deadline.expires_after(ml_->config().stream_timeout);
        conn->deadline.async_wait(asio::bind_executor(strand_, [conn](error_code ec) {
            if (!ec) {
                error_code ignored;
                conn->socket.close(ignored);
                if (conn->resolver) {
                    conn->resolver->cancel();  // A lookup still running ends now.
                }
            }
        }));
        auto connected = [self, conn, id, addr](error_code ec) {
            if (ec) {
                return self->fail_stream(conn, id, "connect to " + addr, ec);
            }
            error_code no_remote;
            const auto remote = conn->socket.remote_endpoint(no_remote);
            if (!no_remote) {
                conn->peer = endpoint_string(remote.address(), remote.port());
            }
            std::array<asio::const_buffer, 2> bufs{asio::buffer(conn->header_out),
                                                   asio::buffer(conn->out)};
            asio::async_write(
                conn->socket, bufs,
                asio::bind_executor(self->strand_, [self, conn, id, addr](error_code ec, size_t) {
                    if (ec) {
                        return self->fail_stream(conn, id, "write to " + addr, ec);
                    }
                    self->read_frame(conn, [self, conn, id](Result<std::vector<uint8_t>> r) {
                        conn->deadline.cancel();
                        error_code ignored;
                        conn->socket.close(ignored);
                        self->finish_stream(id, std::move(r), conn->peer);
                    });
                }));
        };
        if (ip.ok()) {
            conn->socket.async_connect(tcp::endpoint(*ip, hp->second),
                                       asio::bind_executor(strand_, std::move(connected)));
            return;
        }
        conn->resolver = std::make_unique<tcp::resolver>(strand_);
        conn->resolver->async_resolve(
            hp->first, std::to_string(hp->second),
            asio::bind_executor(
                strand_, [self, conn, id, addr, connected = std::move(connected)](
                             error_code ec, tcp::resolver::results_type found) {
                    if (!ec && conn->deadline.expiry() <= asio::steady_timer::clock_type::now()) {
                        ec = asio::error::timed_out;  // The stream's deadline passed meanwhile.
                    }
                    if (ec) {
                        return self->fail_stream(conn, id, "resolve " + addr, ec);
                    }
                    asio::async_connect(
                        conn->socket, found,
                        asio::bind_executor(
                            self->strand_,
                            [connected](error_code ec, const tcp::endpoint&) { connected(ec); }));
                }));
    }

    void start(std::vector<std::string> seeds) {
        auto self = shared_from_this();
        asio::post(strand_, [self, seeds = std::move(seeds)] {
            self->ml_->start();
            if (!seeds.empty()) {
                self->ml_->join(seeds);
            }
            self->receive_udp();
            self->accept_tcp();
            self->after_event();
        });
    }

    void post(std::function<void(Memberlist&)> fn) {
        auto self = shared_from_this();
        asio::post(strand_, [self, fn = std::move(fn)] {
            if (self->closed_) {
                return;
            }
            fn(*self->ml_);
            self->after_event();
        });
    }

    void stop(Duration drain, bool graceful) {
        auto self = shared_from_this();
        auto done = std::make_shared<std::promise<void>>();
        auto fut = done->get_future();
        asio::post(strand_, [self, drain, graceful, done] {
            if (self->closed_) {
                done->set_value();
                return;
            }
            if (!graceful) {
                self->close();
                done->set_value();
                return;
            }
            self->ml_->leave();
            self->after_event();
            auto t = std::make_shared<asio::steady_timer>(self->strand_);
            t->expires_after(drain);
            t->async_wait(asio::bind_executor(self->strand_, [self, t, done](error_code) {
                self->close();
                done->set_value();
            }));
        });
        // A caller that stopped running the io_context gets its thread back anyway.
        if (fut.wait_for(drain + std::chrono::seconds(5)) == std::future_status::timeout) {
            log::warn("gossip_stop_timeout", {{"name", ml_->name()}});
        }
        // The snapshot leave() handed to the writer thread, on disk before the process exits:
        // waited for here, off the strand, which kept gossiping the leave meanwhile. A write
        // that failed was logged by the writer; one stuck in a slow disk is not waited for
        // long.
        if (graceful) {
            if (Status st = ml_->flush_snapshot(SnapshotWriter::kFinalWriteWait);
                st.code() == StatusCode::kDeadlineExceeded) {
                log::warn("gossip_snapshot_flush_timeout",
                          {{"name", ml_->name()}, {"error", st.to_string()}});
            }
        }
    }

    std::shared_ptr<const MembershipSnapshot> snapshot() const { return snapshot_.load(); }

    asio::io_context& io_;
    asio::strand<asio::io_context::executor_type> strand_;
    udp::socket udp_;
    tcp::acceptor acceptor_;
    asio::steady_timer timer_;
    std::unique_ptr<Memberlist> ml_;
    std::atomic<std::shared_ptr<const MembershipSnapshot>> snapshot_;
    uint16_t port_ = 0;
    asio::ip::address host_;
    bool closed_ = false;
    std::function<Duration(const std::string&)> packet_delay_;
    TimePoint armed_ = TimePoint::max();
    uint64_t published_ = ~uint64_t{0};
    // Inbound stream connections open now, in all and by source address (strand only).
    size_t inbound_streams_ = 0;
    std::unordered_map<asio::ip::address, size_t> inbound_by_source_;
    std::array<uint8_t, 65536> udp_buf_{};
    udp::endpoint udp_from_;

private:
    struct StreamConn {
        explicit StreamConn(asio::strand<asio::io_context::executor_type>& s)
            : socket(s), deadline(s) {}
        // An inbound connection holds one of max_inbound_streams slots until its last handler
        // lets go of it (on the strand, or single-threaded at io_context teardown).
        ~StreamConn() {
            if (inbound_owner) {
                --inbound_owner->inbound_streams_;
                auto it = inbound_owner->inbound_by_source_.find(source);
                if (it != inbound_owner->inbound_by_source_.end() && --it->second == 0) {
                    inbound_owner->inbound_by_source_.erase(it);
                }
                inbound_owner->ml_->stats().inbound_streams.fetch_sub(1);
            }
        }
        std::shared_ptr<Impl> inbound_owner;
        asio::ip::address source;  // Inbound: the address the connection came from.
        tcp::socket socket;
        std::unique_ptr<tcp::resolver> resolver;  // A host-name seed's lookup, while it runs.
        // Outbound: the "ip:port" connected to, which Memberlist matches host-name seeds by.
        std::string peer;
        asio::steady_timer deadline;
        std::array<uint8_t, 4> header_out{};
        std::array<uint8_t, 4> header_in{};
        std::vector<uint8_t> out;
        std::vector<uint8_t> in;
    };

    Result<std::pair<asio::ip::address, uint16_t>> resolve(const std::string& addr) {
        EDGE_ASSIGN_OR_RETURN(auto hp, split_host_port(addr));
        EDGE_ASSIGN_OR_RETURN(auto ip, parse_ip(hp.first));
        return std::make_pair(ip, hp.second);
    }

    void fail_stream(const std::shared_ptr<StreamConn>& conn, uint64_t id, const std::string& what,
                     error_code ec) {
        conn->deadline.cancel();
        error_code ignored;
        conn->socket.close(ignored);
        finish_stream(id, unavailable_error("gossip stream: " + what + ": " + ec.message()));
    }

    void finish_stream(uint64_t id, Result<std::vector<uint8_t>> r, const std::string& peer = {}) {
        if (closed_) {
            return;
        }
        ml_->handle_stream_response(id, std::move(r), peer);
        after_event();
    }

    template <typename Done>
    void read_frame(const std::shared_ptr<StreamConn>& conn, Done done) {
        auto self = shared_from_this();
        asio::async_read(
            conn->socket, asio::buffer(conn->header_in),
            asio::bind_executor(strand_, [self, conn, done](error_code ec, size_t) mutable {
                if (ec) {
                    return done(unavailable_error("gossip stream: read header: " + ec.message()));
                }
                const size_t n = (size_t{conn->header_in[0]} << 24) |
                                 (size_t{conn->header_in[1]} << 16) |
                                 (size_t{conn->header_in[2]} << 8) | size_t{conn->header_in[3]};
                if (n == 0 || n > self->ml_->config().max_stream_bytes) {
                    return done(data_loss_error("gossip stream: frame of " + std::to_string(n) +
                                                " bytes is out of bounds"));
                }
                conn->in.clear();
                self->read_body(conn, n, std::move(done));
            }));
    }

    // Reads the rest of a body of `n` bytes into conn->in, one bounded chunk at a time.
    template <typename Done>
    void read_body(const std::shared_ptr<StreamConn>& conn, size_t n, Done done) {
        const size_t have = conn->in.size();
        if (have == n) {
            return done(std::move(conn->in));
        }
        const size_t chunk = std::min(kStreamReadChunk, n - have);
        conn->in.resize(have + chunk);
        auto self = shared_from_this();
        asio::async_read(
            conn->socket, asio::buffer(conn->in.data() + have, chunk),
            asio::bind_executor(strand_, [self, conn, n, done](error_code ec, size_t) mutable {
                if (ec) {
                    return done(unavailable_error("gossip stream: read body: " + ec.message()));
                }
                self->read_body(conn, n, std::move(done));
            }));
    }

    void receive_udp() {
        if (closed_) {
            return;
        }
        auto self = shared_from_this();
        udp_.async_receive_from(asio::buffer(udp_buf_), udp_from_,
            asio::bind_executor(strand_, [self](error_code ec, size_t n) {
                if (self->closed_) {
                    return;
                }
                if (!ec) {
                    const std::string from =
                        endpoint_string(self->udp_from_.address(), self->udp_from_.port());
                    self->ml_->handle_packet(from, std::span<const uint8_t>(self->udp_buf_.data(), n));
                    self->after_event();
                }
                self->receive_udp();
            }));
    }

    void accept_tcp() {
        if (closed_) {
            return;
        }
        auto self = shared_from_this();
        acceptor_.async_accept(asio::bind_executor(strand_, [self](error_code ec, tcp::socket s) {
            if (self->closed_) {
                return;
            }
            if (!ec) {
                error_code remote_ec;
                const tcp::endpoint remote = s.remote_endpoint(remote_ec);
                const size_t cap = self->ml_->config().max_inbound_streams;
                auto held = self->inbound_by_source_.find(remote.address());
                if (remote_ec || self->inbound_streams_ >= cap ||
                    (held != self->inbound_by_source_.end() &&
                     held->second >= self->per_source_cap(remote.address()))) {
                    // Drop it unread, so a flood of connections costs a socket each.
                    self->ml_->stats().inbound_streams_refused.fetch_add(1);
                    error_code ignored;
                    s.close(ignored);
                } else {
                    self->serve(std::move(s), remote);
                }
            }
            self->accept_tcp();
        }));
    }

    // Inbound streams one address may hold: an eighth of max_inbound_streams (at least one)
    // for each member other than this one known at that address (several sites on one host
    // share it), and one eighth for an address with none. A single host trickling bytes into
    // streams held to the stream timeout would otherwise take every slot and fail every
    // member's push-pull with this site; a member opens one or two streams at a time.
    size_t per_source_cap(const asio::ip::address& source) const {
        size_t members = 0;
        for (const MemberView& m : snapshot_.load()->members) {
            if (m.is_local || m.state == NodeState::kDead || m.state == NodeState::kLeft) {
                continue;
            }
            auto host = split_host_port(m.addr);
            error_code ec;
            if (host.ok() && asio::ip::make_address(host->first, ec) == source && !ec) {
                ++members;
            }
        }
        return std::max<size_t>(1, ml_->config().max_inbound_streams / 8) *
               std::max<size_t>(1, members);
    }

    void serve(tcp::socket socket, const tcp::endpoint& remote) {
        auto self = shared_from_this();
        auto conn = std::make_shared<StreamConn>(strand_);
        conn->socket = std::move(socket);
        conn->inbound_owner = self;
        conn->source = remote.address();
        ++inbound_streams_;
        ++inbound_by_source_[remote.address()];
        ml_->stats().inbound_streams.fetch_add(1);
        const std::string from = endpoint_string(remote.address(), remote.port());
        conn->deadline.expires_after(ml_->config().stream_timeout);
        conn->deadline.async_wait(asio::bind_executor(strand_, [conn](error_code ec) {
            if (!ec) {
                error_code ignored;
                conn->socket.close(ignored);
            }
        }));
        read_frame(conn, [self, conn, from](Result<std::vector<uint8_t>> req) {
            if (!req.ok() || self->closed_) {
                conn->deadline.cancel();
                error_code ignored;
                conn->socket.close(ignored);
                return;
            }
            auto resp = self->ml_->handle_stream(from, *req);
            self->after_event();
            if (!resp.ok()) {
                log::debug("gossip_stream_rejected",
                           {{"from", from}, {"error", resp.status().to_string()}});
                conn->deadline.cancel();
                error_code ignored;
                conn->socket.close(ignored);
                return;
            }
            conn->out = std::move(resp).value();
            conn->header_out = frame_header(conn->out.size());
            std::array<asio::const_buffer, 2> bufs{asio::buffer(conn->header_out),
                                                   asio::buffer(conn->out)};
            asio::async_write(conn->socket, bufs,
                              asio::bind_executor(self->strand_, [conn](error_code, size_t) {
                                  conn->deadline.cancel();
                                  error_code ignored;
                                  conn->socket.close(ignored);
                              }));
        });
    }

    // After every input: re-arm the protocol timer and publish a snapshot if anything changed.
    void after_event() {
        if (closed_) {
            return;
        }
        if (ml_->change_count() != published_) {
            published_ = ml_->change_count();
            snapshot_.store(ml_->snapshot());
        }
        const TimePoint next = ml_->next_deadline();
        if (next == armed_) {
            return;
        }
        armed_ = next;
        if (next == TimePoint::max()) {
            timer_.cancel();
            return;
        }
        timer_.expires_at(next);
        auto self = shared_from_this();
        timer_.async_wait(asio::bind_executor(strand_, [self, next](error_code ec) {
            if (ec || self->closed_ || self->armed_ != next) {
                return;
            }
            self->armed_ = TimePoint::max();
            self->ml_->run_due_timers();
            self->after_event();
        }));
    }

    void close() {
        closed_ = true;
        error_code ignored;
        timer_.cancel();
        udp_.close(ignored);
        acceptor_.close(ignored);
    }
};

Result<std::unique_ptr<MembershipService>> MembershipService::create(
    asio::io_context& io, MembershipConfig config, Keyring keyring, SiteState initial_state,
    const std::string& bind_host, uint16_t port) {
    auto impl = std::make_shared<Impl>(io);
    EDGE_RETURN_IF_ERROR(impl->bind(bind_host, port));
    if (config.advertise_addr.empty()) {
        asio::ip::address advertised = impl->host_;
        if (advertised.is_unspecified()) {
            EDGE_ASSIGN_OR_RETURN(advertised, choose_advertise_address(interface_addresses(),
                                                                       advertised.is_v6()));
            log::info("gossip_advertise_chosen",
                      {{"bind", endpoint_string(impl->host_, impl->port_)},
                       {"advertise", endpoint_string(advertised, impl->port_)},
                       {"fix", "set gossip.advertise_address to choose another"}});
        }
        config.advertise_addr = endpoint_string(advertised, impl->port_);
    }
    // Each process life starts at the wall-clock second (see initial_incarnation), so what a
    // previous life left in the cluster (it may have crashed a moment ago) is out-ranked at once.
    const int64_t wall_s = SystemClock::instance().wall_now_us() / 1'000'000;
    if (wall_s > 0 && static_cast<uint64_t>(wall_s) < (uint64_t{1} << 32)) {
        config.initial_incarnation =
            std::max(config.initial_incarnation, static_cast<uint64_t>(wall_s));
    }
    EDGE_ASSIGN_OR_RETURN(impl->ml_, Memberlist::create(std::move(config), std::move(keyring),
                                                        SystemClock::instance(), *impl,
                                                        std::move(initial_state)));
    impl->snapshot_.store(impl->ml_->snapshot());
    return std::unique_ptr<MembershipService>(new MembershipService(std::move(impl)));
}

MembershipService::~MembershipService() {
    // Without a running io_context no handler can run; otherwise close on the strand.
    if (impl_->io_.stopped()) {
        impl_->closed_ = true;
    } else {
        kill();
    }
}

uint16_t MembershipService::port() const { return impl_->port_; }
const std::string& MembershipService::advertise_addr() const {
    return impl_->ml_->config().advertise_addr;
}
void MembershipService::set_event_callback(Memberlist::EventCallback cb) {
    impl_->ml_->set_event_callback(std::move(cb));
}
void MembershipService::set_user_event_callback(Memberlist::UserEventCallback cb) {
    impl_->ml_->set_user_event_callback(std::move(cb));
}
void MembershipService::set_local_state(Memberlist::LocalStateFn fn) {
    impl_->ml_->set_local_state(std::move(fn));
}
void MembershipService::set_merge_remote_state(Memberlist::MergeStateFn fn) {
    impl_->ml_->set_merge_remote_state(std::move(fn));
}
void MembershipService::set_packet_delay(std::function<Duration(const std::string&)> delay) {
    impl_->packet_delay_ = std::move(delay);
}
void MembershipService::start(const std::vector<std::string>& seeds) { impl_->start(seeds); }
void MembershipService::post(std::function<void(Memberlist&)> fn) { impl_->post(std::move(fn)); }
void MembershipService::stop(Duration drain) { impl_->stop(drain, true); }
void MembershipService::kill() { impl_->stop(Duration::zero(), false); }
std::shared_ptr<const MembershipSnapshot> MembershipService::snapshot() const {
    return impl_->snapshot();
}
const MembershipStats& MembershipService::stats() const { return impl_->ml_->stats(); }

}  // namespace edge::routing::membership
