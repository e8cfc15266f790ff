// The Debian package: cpack builds edgeserve_<version>_amd64.deb from the already built binary;
// dpkg-deb shows its files, runtime dependencies (from dpkg-shlibdeps), conffiles and maintainer
// scripts (which create the user and reload systemd but never start or restart anything);
// `dpkg -x` into a scratch root gives the documented layout, and the unpacked binary runs its
// unpacked config through check-config. `cmake --install` with DESTDIR gives the same layout
// under another prefix, with the unit naming that prefix's binary.

#include <doctest/doctest.h>
#include <sys/stat.h>

#include <filesystem>
#include <regex>

#include "tests/package/package_testing.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_certs.h"

using namespace edge;
using namespace edge::package_testing;

namespace {

const char* const kFiles[] = {
    "usr/bin/edgeserve",
    "usr/lib/systemd/system/edgeserve.service",
    "usr/lib/systemd/system/edgeserve.socket",
    "usr/lib/sysusers.d/edgeserve.conf",
    "usr/lib/tmpfiles.d/edgeserve.conf",
    "etc/edgeserve/edgeserve.yaml",
    "usr/share/edgeserve/grafana/edgeserve.json",
    "usr/share/edgeserve/prometheus/prometheus.yml",
    "usr/share/edgeserve/prometheus/alerts.yml",
    "usr/share/edgeserve/prometheus/alerts_test.yml",
    "usr/share/doc/edgeserve/operations.md",
    "usr/share/doc/edgeserve/config.md",
    "usr/share/doc/edgeserve/architecture.md",
};

bool have_tools() {
    for (const char* tool : {"cpack", "dpkg-deb", "dpkg-shlibdeps", "dpkg"}) {
        if (!testing::have_program(tool)) {
            MESSAGE(tool << " not installed; skipping the package test");
            return false;
        }
    }
    return true;
}

}  // namespace

TEST_CASE("cpack builds the .deb: files, Depends, conffiles, scripts, scratch-root install") {
    if (!have_tools()) {
        return;
    }
    testing::TempDir dir;
    auto cpack = testing::run(
        {"cpack", "-G", "DEB", "--config", EDGE_BINARY_DIR "/CPackConfig.cmake", "-B", dir.path()},
        180000);
    REQUIRE_MESSAGE(cpack.exit_code == 0, cpack.out << cpack.err);
    std::string deb = dir.file(std::string("edgeserve_") + EDGE_VERSION + "_amd64.deb");
    REQUIRE_MESSAGE(std::filesystem::exists(deb), cpack.out);

    auto field = [&](const std::string& name) {
        auto r = testing::run({"dpkg-deb", "-f", deb, name});
        REQUIRE(r.exit_code == 0);
        return r.out.substr(0, r.out.find_last_not_of('\n') + 1);
    };
    CHECK(field("Package") == "edgeserve");
    CHECK(field("Version") == EDGE_VERSION);
    CHECK(field("Architecture") == "amd64");
    std::string depends = field("Depends");
    MESSAGE("Depends: " << depends);
    // dpkg-shlibdeps found the runtime libraries the binary links.
    for (const char* lib :
         {"libc6", "libstdc++6", "libssl3", "libyaml-cpp0.7", "libprometheus-cpp"}) {
        CHECK_MESSAGE(depends.find(lib) != std::string::npos, lib);
    }
    CHECK(depends.find("systemd | adduser") != std::string::npos);
    // No -dev package is needed at run time.
    CHECK(depends.find("-dev") == std::string::npos);

    auto contents = testing::run({"dpkg-deb", "-c", deb});
    REQUIRE(contents.exit_code == 0);
    for (const char* f : kFiles) {
        CHECK_MESSAGE(contents.out.find(std::string("./") + f) != std::string::npos, f);
    }
    // Every document, so the links between them (config.md to api.md, ...) resolve.
    for (const auto& doc : std::filesystem::directory_iterator(EDGE_SOURCE_DIR "/docs")) {
        const std::string name = "./usr/share/doc/edgeserve/" + doc.path().filename().string();
        const bool packaged = contents.out.find(name + "\n") != std::string::npos;
        CHECK_MESSAGE(packaged, name);
    }
    CHECK(contents.out.find("root/root") != std::string::npos);

    std::string control = dir.file("control");
    REQUIRE(testing::run({"dpkg-deb", "-e", deb, control}).exit_code == 0);
    CHECK(read_file(control + "/conffiles") == "/etc/edgeserve/edgeserve.yaml\n");
    std::string postinst = read_file(control + "/postinst");
    CHECK(postinst.find("systemd-sysusers /usr/lib/sysusers.d/edgeserve.conf") !=
          std::string::npos);
    CHECK(postinst.find("systemctl daemon-reload") != std::string::npos);
    for (const char* script : {"postinst", "prerm", "postrm"}) {
        std::string text = read_file(control + "/" + script);
        INFO(script);
        CHECK(!text.empty());
        struct stat st {};
        REQUIRE(stat((control + "/" + script).c_str(), &st) == 0);
        CHECK((st.st_mode & 0111) != 0);
        // Never start or restart on its own (prerm only stops on removal).
        std::regex starts(
            "(systemctl[^\\n]*\\b(start|restart|try-restart|reload-or-restart|"
            "enable)\\b|deb-systemd-invoke|invoke-rc\\.d)");
        CHECK_FALSE(std::regex_search(text, starts));
        auto syntax = testing::run({"sh", "-n", control + "/" + script});
        CHECK_MESSAGE(syntax.exit_code == 0, syntax.err);
    }

    std::string root = dir.file("root");
    auto extract = testing::run({"dpkg", "-x", deb, root});
    REQUIRE_MESSAGE(extract.exit_code == 0, extract.err);
    for (const char* f : kFiles) {
        CHECK_MESSAGE(std::filesystem::is_regular_file(root + "/" + f), f);
    }
    CHECK(access((root + "/usr/bin/edgeserve").c_str(), X_OK) == 0);
    std::string unit = read_file(root + "/usr/lib/systemd/system/edgeserve.service");
    CHECK(unit.find("ExecStart=/usr/bin/edgeserve run --config /etc/edgeserve/edgeserve.yaml") !=
          std::string::npos);
    CHECK(unit.find("ExecStartPre=/usr/bin/edgeserve check-config") != std::string::npos);
    CHECK(unit.find("/usr/local/bin") == std::string::npos);

    // The unpacked binary runs and accepts the unpacked config (certificates are made by
    // postinst, so only the YAML is checked).
    auto version = testing::run({root + "/usr/bin/edgeserve", "--version"});
    CHECK(version.out == std::string("edgeserve ") + EDGE_VERSION + "\n");
    auto check = testing::run({root + "/usr/bin/edgeserve", "check-config", "--no-files",
                               root + "/etc/edgeserve/edgeserve.yaml"});
    CHECK_MESSAGE(check.exit_code == 0, check.err);
}

TEST_CASE("cmake --install with DESTDIR lays out the tree and points the unit at the prefix") {
    if (!testing::have_program("cmake")) {
        MESSAGE("cmake not installed; skipping");
        return;
    }
    testing::TempDir dir;
    auto install = testing::run({"env", "DESTDIR=" + dir.path(), "cmake", "--install",
                                 EDGE_BINARY_DIR, "--prefix", "/opt/edgeserve"},
                                120000);
    REQUIRE_MESSAGE(install.exit_code == 0, install.out << install.err);
    std::string root = dir.path() + "/opt/edgeserve";
    for (const char* f : kFiles) {
        std::string path = f;
        // Everything but /etc/edgeserve is under the prefix.
        path = path.rfind("etc/", 0) == 0 ? dir.path() + "/" + path : root + "/" + path.substr(4);
        CHECK_MESSAGE(std::filesystem::is_regular_file(path), path);
    }
    std::string unit = read_file(root + "/lib/systemd/system/edgeserve.service");
    CHECK(unit.find("ExecStart=/opt/edgeserve/bin/edgeserve run") != std::string::npos);
    CHECK(unit.find("/usr/local/bin") == std::string::npos);
}

TEST_CASE("postrm purge removes the package's own certificate, never a pair installed over it") {
    namespace fs = std::filesystem;
    const std::string postrm = EDGE_SOURCE_DIR "/deploy/package/postrm";
    auto write = [](const std::string& path, const std::string& text) {
        std::ofstream(path) << text;
    };
    for (const bool replaced : {false, true}) {
        CAPTURE(replaced);
        testing::TempDir dir;
        const std::string root = dir.file("root");
        const std::string tls = root + "/etc/edgeserve/tls";
        fs::create_directories(tls);
        fs::create_directories(root + "/var/lib/edgeserve");
        fs::create_directories(root + "/var/log/edgeserve");
        fs::create_directories(root + "/etc/systemd/system/sockets.target.wants");
        fs::create_symlink("/usr/lib/systemd/system/edgeserve.socket",
                           root + "/etc/systemd/system/sockets.target.wants/edgeserve.socket");
        // As postinst leaves a certificate it made: the two files and their digests.
        write(tls + "/server.crt", "package certificate\n");
        write(tls + "/server.key", "package key\n");
        auto marked = testing::run({"sh", "-c",
                                    "cd '" + tls +
                                        "' && sha256sum server.crt server.key "
                                        ">.self-signed-by-package"});
        REQUIRE(marked.exit_code == 0);
        if (replaced) {
            // docs/operations.md: the operator installs the site's own pair under these names.
            write(tls + "/server.key", "the site's real key\n");
        }
        auto purge = testing::run({"env", "DPKG_ROOT=" + root, "sh", postrm, "purge"});
        CHECK_MESSAGE(purge.exit_code == 0, purge.err);
        CHECK(fs::exists(tls + "/server.crt") == replaced);
        CHECK(fs::exists(tls + "/server.key") == replaced);
        if (replaced) {
            CHECK(read_file(tls + "/server.key") == "the site's real key\n");
        }
        CHECK_FALSE(fs::exists(tls + "/.self-signed-by-package"));
        CHECK_FALSE(fs::exists(root + "/var/lib/edgeserve"));
        CHECK_FALSE(fs::exists(root + "/var/log/edgeserve"));
        CHECK_FALSE(fs::is_symlink(root + "/etc/systemd/system/sockets.target.wants/"
                                          "edgeserve.socket"));
    }
}
