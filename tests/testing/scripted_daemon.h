#pragma once

// ScriptedDaemon: the real Daemon (TLS public listener on 127.0.0.1:0 with a fresh self-signed
// certificate, admin listener) answering from a ScriptedGenerator whose timing the test drives,
// on a ManualClock; plus the small JSON/SSE readers the API tests share.
//
// Threading: the test thread owns the fixture; the daemon runs its own I/O threads.

#include <boost/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "daemon/daemon.h"
#include "tests/testing/scripted_generator.h"
#include "tests/testing/test_certs.h"
#include "tests/testing/tls_client.h"

namespace edge::testing {

class ScriptedDaemon {
  public:
    // Serves `models`. `extra_yaml` is appended to testing::config_yaml (more top-level
    // sections). The daemon is started by start(), so a test can script the generator first.
    explicit ScriptedDaemon(std::vector<std::string> models);

    // Parses the config (REQUIREs it valid) and starts the daemon.
    void start(const std::string& extra_yaml = "");

    // A new TLS connection to the public listener.
    std::unique_ptr<TlsClient> client();
    // One request on a new connection, its whole response.
    HttpReply call(const std::string& method, const std::string& path, const std::string& body = "",
                   const std::string& headers = "");
    // GET /metrics on the admin listener.
    std::string metrics();

    TempDir dir;
    TestCertificate cert;
    std::string config_text;  // The config start() loaded (written to dir/c.yaml).
    ManualClock clock;
    ScriptedGenerator generator;
    std::unique_ptr<daemon::Daemon> daemon;
};

// `s` parsed as a JSON object (REQUIREs it is one).
boost::json::object json_object_of(const std::string& s);
// The `data:` payloads of an SSE body, in order.
std::vector<std::string> sse_events(const std::string& body);

}  // namespace edge::testing
