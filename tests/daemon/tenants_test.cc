#include "daemon/tenants.h"

#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "daemon/systemd_notify.h"
#include "tests/testing/test_certs.h"

using namespace edge::daemon;

TEST_CASE("SHA-256 of keys, bearer parsing and per-tenant model lists") {
    CHECK(TenantTable::sha256_hex("test") ==
          "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
    std::vector<TenantConfig> tenants = {
        {"acme", {TenantTable::sha256_hex("k1"), TenantTable::sha256_hex("k2")}, {"m1"}},
        {"zeta", {TenantTable::sha256_hex("k3")}, {}},
    };
    TenantTable table(tenants);
    CHECK(table.enabled());
    CHECK(table.authenticate("").outcome == AuthOutcome::kMissing);
    CHECK(table.authenticate("Basic abc").outcome == AuthOutcome::kMissing);
    CHECK(table.authenticate("Bearer nope").outcome == AuthOutcome::kUnknown);
    auto m = table.authenticate("Bearer k2");
    REQUIRE(m.outcome == AuthOutcome::kOk);
    CHECK(m.tenant->name == "acme");
    CHECK(m.tenant->may_use("m1"));
    CHECK_FALSE(m.tenant->may_use("m2"));
    auto z = table.authenticate("bearer k3");
    REQUIRE(z.outcome == AuthOutcome::kOk);
    CHECK(table.authenticate("BEARER k3").outcome == AuthOutcome::kOk);
    CHECK(table.authenticate("BeArEr k3").outcome == AuthOutcome::kOk);
    CHECK(table.authenticate("Bearerk3").outcome == AuthOutcome::kMissing);
    CHECK(z.tenant->may_use("anything"));

    TenantTable off(std::nullopt);
    CHECK_FALSE(off.enabled());
    CHECK(off.authenticate("").tenant->name == "anonymous");
}

TEST_CASE("tenant cache scopes: kept while a key stays, new for a name that returns without one") {
    const std::string k1 = TenantTable::sha256_hex("k1"), k2 = TenantTable::sha256_hex("k2"),
                      k3 = TenantTable::sha256_hex("k3");
    TenantTable first(std::vector<TenantConfig>{{"acme", {k1, k2}, {}}, {"zeta", {k3}, {}}});
    const std::string acme = first.find("acme")->cache_scope;
    CHECK(acme.starts_with("acme#"));
    CHECK(first.find("zeta")->cache_scope != acme);
    // Another table from the same config (another process): other tags.
    TenantTable elsewhere(std::vector<TenantConfig>{{"acme", {k1, k2}, {}}});
    CHECK(elsewhere.find("acme")->cache_scope != acme);
    // Reloaded with one key rotated (k2 kept): the same tenant, the same scope.
    TenantTable rotated(std::vector<TenantConfig>{{"acme", {k2, k3}, {}}}, &first);
    CHECK(rotated.find("acme")->cache_scope == acme);
    // The name again with none of its keys: another customer, a new scope.
    TenantTable reused(std::vector<TenantConfig>{{"acme", {TenantTable::sha256_hex("k9")}, {}}},
                       &rotated);
    CHECK(reused.find("acme")->cache_scope != acme);
    CHECK(reused.find("acme")->cache_scope.starts_with("acme#"));
    // Authentication off: one anonymous scope.
    TenantTable off(std::nullopt, &first);
    CHECK(off.find("x")->cache_scope == "anonymous");
}

TEST_CASE("tenant cache scopes: a renamed tenant keeps its scope by key, as the limiter does") {
    const std::string k1 = TenantTable::sha256_hex("k1"), k2 = TenantTable::sha256_hex("k2"),
                      k3 = TenantTable::sha256_hex("k3"), k4 = TenantTable::sha256_hex("k4"),
                      k5 = TenantTable::sha256_hex("k5");
    TenantTable first(std::vector<TenantConfig>{{"acme", {k1, k2}, {}}, {"zeta", {k3}, {}}});
    const std::string acme = first.find("acme")->cache_scope;
    const std::string zeta = first.find("zeta")->cache_scope;
    // Renamed, one key kept: the same customer, whose cached blocks stay (they were dropped).
    TenantTable renamed(
        std::vector<TenantConfig>{{"acme-corp", {k2, k4}, {}}, {"zeta", {k3}, {}}}, &first);
    CHECK(renamed.find("acme-corp")->cache_scope == acme);
    CHECK(renamed.find("zeta")->cache_scope == zeta);
    // And renamed again by the next reload.
    TenantTable again(std::vector<TenantConfig>{{"acme-inc", {k4}, {}}}, &renamed);
    CHECK(again.find("acme-inc")->cache_scope == acme);
    // A tenant that keeps its name and a key keeps its scope; a new one with its other key
    // does not share it.
    TenantTable split(std::vector<TenantConfig>{{"spin", {k1}, {}}, {"acme", {k2}, {}}}, &first);
    CHECK(split.find("acme")->cache_scope == acme);
    CHECK(split.find("spin")->cache_scope != acme);
    CHECK(split.find("spin")->cache_scope.starts_with("spin#"));
    // The name kept without its keys is another customer; the holder of a key is the old one.
    TenantTable moved(std::vector<TenantConfig>{{"acme", {k5}, {}}, {"beta", {k1}, {}}}, &first);
    CHECK(moved.find("beta")->cache_scope == acme);
    CHECK(moved.find("acme")->cache_scope != acme);
    // Two new names holding keys of one old tenant: the first in the config takes the scope.
    TenantTable two(std::vector<TenantConfig>{{"b", {k2}, {}}, {"a", {k1}, {}}}, &first);
    CHECK(two.find("b")->cache_scope == acme);
    CHECK(two.find("a")->cache_scope != acme);
    // A new name holding no old key gets a scope of its own.
    TenantTable fresh(std::vector<TenantConfig>{{"new", {k5}, {}}}, &first);
    CHECK(fresh.find("new")->cache_scope != acme);
    CHECK(fresh.find("new")->cache_scope != zeta);
    CHECK(fresh.find("new")->cache_scope.starts_with("new#"));
}

TEST_CASE("systemd notifier: path and abstract sockets, watchdog interval") {
    edge::testing::TempDir dir;
    std::string path = dir.file("n.sock");
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    SystemdNotifier n(path, "3000000", "");
    CHECK(n.enabled());
    REQUIRE(n.watchdog_interval().has_value());
    CHECK(n.watchdog_interval()->count() == 1500000);
    REQUIRE(n.notify("READY=1").ok());
    char buf[64] = {};
    CHECK(recv(fd, buf, sizeof(buf), 0) == 7);
    CHECK(std::string(buf) == "READY=1");
    close(fd);

    CHECK_FALSE(SystemdNotifier("", "", "").enabled());
    CHECK(SystemdNotifier("", "", "").notify("READY=1").ok());
    CHECK_FALSE(SystemdNotifier(path, "100", "1").watchdog_interval().has_value());  // Not our pid.
    CHECK_FALSE(SystemdNotifier("relative", "", "").notify("X=1").ok());
}
