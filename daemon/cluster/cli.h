#pragma once

// The cluster subcommands: `edgeserve members|pools|route|rollout`, each a plain-HTTP call to a
// daemon's admin listener (--admin host:port, default 127.0.0.1:9443) that prints the answer as
// a table (or the JSON with --json). A site with listeners.admin.token_file wants its token:
// --token-file FILE, or the file $EDGESERVE_ADMIN_TOKEN_FILE names. Each returns the process exit
// status: 0 on success, 1 when the daemon could not be reached or answered an error, 2 on bad
// arguments.

#include <string>

#include "common/result.h"

namespace edge::daemon::cluster {

int members_main(int argc, char** argv);
int pools_main(int argc, char** argv);
int route_main(int argc, char** argv);
int rollout_main(int argc, char** argv);

struct AdminAnswer {
    int status = 0;
    std::string body;
};
// One plain-HTTP request to `admin` ("host:port") with a 5 s deadline; a non-empty `token` is
// sent as `Authorization: Bearer <token>`.
Result<AdminAnswer> admin_request(const std::string& admin, const std::string& method,
                                  const std::string& target, const std::string& token = "");

}  // namespace edge::daemon::cluster
