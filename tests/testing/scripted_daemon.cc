#include "tests/testing/scripted_daemon.h"

#include <doctest/doctest.h>

#include "tests/testing/config_yaml.h"
#include "tests/testing/test_daemon.h"

namespace edge::testing {

ScriptedDaemon::ScriptedDaemon(std::vector<std::string> models) : generator(std::move(models)) {
    cert = make_certificate(dir.path(), "srv", {"localhost"});
}

void ScriptedDaemon::start(const std::string& extra_yaml) {
    config_text = config_yaml(cert.cert_path, cert.key_path, extra_yaml);
    daemon = make_daemon(config_text, dir.file("c.yaml"), generator, clock);
    daemon->start();
}

std::unique_ptr<TlsClient> ScriptedDaemon::client() {
    auto c = TlsClient::connect(daemon->public_port());
    REQUIRE_MESSAGE(c.ok(), c.status().to_string());
    return std::move(c).value();
}

HttpReply ScriptedDaemon::call(const std::string& method, const std::string& path,
                               const std::string& body, const std::string& headers) {
    auto c = client();
    REQUIRE(c->send(http_request(method, path, body, headers)).ok());
    auto r = c->read_response();
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    return *r;
}

std::string ScriptedDaemon::metrics() {
    auto m = plain_http_get(daemon->admin_port(), "/metrics");
    REQUIRE_MESSAGE(m.ok(), m.status().to_string());
    return m->body;
}

boost::json::object json_object_of(const std::string& s) {
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(s, ec);
    REQUIRE_MESSAGE(!ec, s);
    REQUIRE_MESSAGE(v.is_object(), s);
    return v.get_object();
}

std::vector<std::string> sse_events(const std::string& body) {
    std::vector<std::string> out;
    size_t pos = 0;
    while ((pos = body.find("data: ", pos)) != std::string::npos) {
        const size_t end = body.find("\n\n", pos);
        REQUIRE_MESSAGE(end != std::string::npos, "unterminated SSE event in: " << body);
        out.push_back(body.substr(pos + 6, end - pos - 6));
        pos = end + 2;
    }
    return out;
}

}  // namespace edge::testing
