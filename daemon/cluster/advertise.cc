#include "daemon/cluster/advertise.h"

namespace edge::daemon::cluster {

std::string public_host(std::string_view advertise_address, std::string_view bind_address) {
    if (!advertise_address.empty()) {
        return std::string(advertise_address.substr(0, advertise_address.rfind(':')));
    }
    if (bind_address != "0.0.0.0" && bind_address != "::") {
        return std::string(bind_address);
    }
    return {};
}

bool is_loopback_host(std::string_view host) {
    return host == "localhost" || host == "::1" || host == "[::1]" || host.starts_with("127.");
}

std::string reachable_address(std::string_view listen, uint16_t port,
                              std::string_view public_host) {
    std::string host(listen);
    if (host == "0.0.0.0" || host == "::") {
        host = public_host;
    } else if (is_loopback_host(host) && !public_host.empty() && !is_loopback_host(public_host)) {
        host.clear();
    }
    if (host.empty()) {
        return host;
    }
    const bool v6 = host.find(':') != std::string::npos && host[0] != '[';
    return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace edge::daemon::cluster
