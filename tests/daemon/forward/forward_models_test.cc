// Which model names a site in a cluster answers for: those it or another live site serves; any
// other is OpenAI's 404 model_not_found, as on a site alone. Real sites (forward_fixture.h).

#include <doctest/doctest.h>

#include <string>

#include "tests/daemon/forward/forward_fixture.h"

using namespace edge;
using namespace edge::testing::forward;
using daemon::cluster::RoutePlan;
using daemon::cluster::RouteRejection;

TEST_CASE("a model no site of the cluster serves is a 404, not the planner's 503") {
    // A tenant without a models list (or authentication off): the request was admitted and
    // planned, and the planner's no_pool_serves_model 503 went out, which OpenAI clients retry
    // and then raise as a server error; only tenants with a models list got the 404.
    Cluster cluster;
    Site a(cluster, "fra", {"m"}, tenants_section());
    a.planner.set_cluster_models({"far-model", "m"});
    RoutePlan none;
    none.rejection = RouteRejection::kNoPoolServesModel;
    none.message = "no pool serves it";
    a.planner.set(none);
    auto r = a.ask(chat_request(false, "no-such-model"));
    CHECK(r->status == 404);
    CHECK(error_code_of(*r) == "model_not_found");
    CHECK(a.planner.plans() == 0);
    // Refused before admission: the rejection is counted, nothing charged.
    CHECK(metrics_contain(
        a, "edgeserve_tenant_rejections_total{reason=\"model_not_found\",tenant=\"acme\"} 1"));
    // A model another site serves is planned (here the planner says no pool can take it now).
    auto far = a.ask(chat_request(false, "far-model"));
    CHECK(far->status == 503);
    CHECK(error_code_of(*far) == "no_pool_serves_model");
    CHECK(a.planner.plans() == 1);
    // So is one a site advertises but does not serve now (draining for a restart, loading, its
    // site found dead): the planner's 503, which clients retry, not a 404 they would not.
    a.planner.set_advertised_only({"restarting-model"});
    auto restarting = a.ask(chat_request(false, "restarting-model"));
    CHECK(restarting->status == 503);
    CHECK(error_code_of(*restarting) == "no_pool_serves_model");
    CHECK(a.planner.plans() == 2);
}
