#pragma once

// Metrics owns the prometheus-cpp registry of the daemon and is the public server's observer:
// edgeserve_http_requests_total{route,status}, edgeserve_http_request_duration_seconds{route,
// status}, edgeserve_tls_handshakes_total{resumed}, edgeserve_tls_handshake_failures_total{reason},
// edgeserve_open_connections, edgeserve_connections_rejected_total{reason},
// edgeserve_build_info{version}. Thread-safe (prometheus-cpp metrics are atomic; the label cache
// has a mutex). serialize() renders the text exposition format for GET /metrics.

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tls/http_types.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace edge::daemon {

class Metrics final : public tls::ServerObserver {
public:
    Metrics();
    ~Metrics() override;

    std::string serialize() const;
    prometheus::Registry& registry() { return *registry_; }

    void on_connection_opened() override;
    void on_connection_closed() override;
    void on_connection_rejected(std::string_view reason) override;
    void on_handshake(bool resumed, std::string_view failure_reason) override;
    void on_response(std::string_view method, std::string_view path, int status,
                     std::chrono::nanoseconds duration) override;

    // The bounded route label for a request path.
    static std::string_view route_label(std::string_view path);

private:
    std::shared_ptr<prometheus::Registry> registry_;
    prometheus::Family<prometheus::Counter>* requests_;
    prometheus::Family<prometheus::Histogram>* durations_;
    prometheus::Family<prometheus::Counter>* handshakes_;
    prometheus::Family<prometheus::Counter>* handshake_failures_;
    prometheus::Family<prometheus::Counter>* rejected_;
    prometheus::Gauge* open_connections_;

    struct RouteStatus {
        prometheus::Counter* count;
        prometheus::Histogram* duration;
    };
    std::mutex mu_;
    std::map<std::pair<std::string_view, int>, RouteStatus> by_route_status_;
    prometheus::Counter* handshakes_full_;
    prometheus::Counter* handshakes_resumed_;
};

}  // namespace edge::daemon
