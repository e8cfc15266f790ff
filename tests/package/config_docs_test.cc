// docs/config.md cannot drift from the YAML adapter: every key daemon/config*.cc accepts is named
// in a docs table row and every documented key is accepted by parse_config (it is not "unknown").

#include <doctest/doctest.h>

#include <filesystem>
#include <regex>
#include <set>

#include "daemon/config.h"
#include "tests/package/package_testing.h"

using namespace edge;
using namespace edge::package_testing;

namespace {

// Full key paths from the first column of the docs' tables: | `a.b[].c` | ...
std::vector<std::string> documented_keys() {
    std::string doc = read_file(EDGE_SOURCE_DIR "/docs/config.md");
    REQUIRE(!doc.empty());
    std::vector<std::string> keys;
    std::regex row("\\n\\| `([a-z_0-9.\\[\\]]+)` \\|");
    for (auto it = std::sregex_iterator(doc.begin(), doc.end(), row); it != std::sregex_iterator();
         ++it) {
        keys.push_back((*it)[1]);
    }
    return keys;
}

// Key names the adapter's handler tables accept: {"name", <handler>} in daemon/config*.cc (the
// root in config.cc, each group of sections in a file of its own), where the handler is a lambda or
// one of the xxx_field() helpers (so value tables such as {"fp8", WeightFormat::kFp8} or log
// fields do not count as keys).
std::set<std::string> adapter_keys() {
    std::set<std::string> keys;
    std::regex entry("\\{\"([a-z_0-9]+)\",\\s*(\\[|[a-z_0-9]+_field\\()");
    int files = 0;
    for (const auto& file : std::filesystem::directory_iterator(EDGE_SOURCE_DIR "/daemon")) {
        const std::string name = file.path().filename().string();
        if (!name.starts_with("config") || !name.ends_with(".cc")) {
            continue;
        }
        std::string source = read_file(file.path().string());
        REQUIRE(!source.empty());
        ++files;
        for (auto it = std::sregex_iterator(source.begin(), source.end(), entry);
             it != std::sregex_iterator(); ++it) {
            keys.insert((*it)[1]);
        }
    }
    REQUIRE(files > 0);
    return keys;
}

std::vector<std::string> split_path(const std::string& path) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (;;) {
        size_t dot = path.find('.', start);
        parts.push_back(path.substr(start, dot - start));
        if (dot == std::string::npos) {
            return parts;
        }
        start = dot + 1;
    }
}

// A YAML document holding only `path` (lists for `[]` components) set to a mapping whose one
// entry is a list, which no key accepts: a scalar or list key fails on its type, a map key (model
// -> digest, site -> delay) on the entry's value, an unknown key as "unknown key".
std::string yaml_for(const std::string& path) {
    std::string yaml;
    std::string indent;
    for (const std::string& part : split_path(path)) {
        bool list = part.size() > 2 && part.compare(part.size() - 2, 2, "[]") == 0;
        yaml += indent + (list ? part.substr(0, part.size() - 2) : part) + ":\n";
        indent += "  ";
        if (list) {
            yaml += indent + "-\n";
            indent += "  ";
        }
    }
    return yaml + indent + "not_a_value_of_this_key: [1]\n";
}

}  // namespace

TEST_CASE("every key the YAML adapter accepts is documented in docs/config.md") {
    std::set<std::string> documented_names;
    for (const std::string& key : documented_keys()) {
        for (std::string part : split_path(key)) {
            if (part.size() > 2 && part.compare(part.size() - 2, 2, "[]") == 0) {
                part.resize(part.size() - 2);
            }
            documented_names.insert(part);
        }
    }
    std::set<std::string> accepted = adapter_keys();
    CHECK(accepted.size() > 50);
    for (const std::string& key : accepted) {
        CHECK_MESSAGE(
            documented_names.count(key) == 1,
            "daemon/config*.cc accepts `" << key << "`; docs/config.md has no row for it");
    }
    for (const std::string& name : documented_names) {
        CHECK_MESSAGE(accepted.count(name) == 1, "docs/config.md documents `"
                                                     << name
                                                     << "`; daemon/config*.cc has no such key");
    }
}

TEST_CASE("every key docs/config.md documents is accepted by parse_config at that path") {
    std::vector<std::string> keys = documented_keys();
    CHECK(keys.size() > 50);
    for (const std::string& key : keys) {
        std::string yaml = yaml_for(key);
        Result<daemon::Config> r = daemon::parse_config(yaml, "doc.yaml");
        INFO(key << "\n" << yaml);
        REQUIRE_FALSE(r.ok());
        const std::string& message = r.status().message();
        CHECK_MESSAGE(message.find("unknown key") == std::string::npos, message);
        CHECK_MESSAGE(message.find(key.substr(0, key.find('['))) != std::string::npos, message);
    }
    // The probe itself tells an unknown key apart.
    auto unknown = daemon::parse_config(yaml_for("limits.no_such_key_ms"), "doc.yaml");
    REQUIRE_FALSE(unknown.ok());
    CHECK(unknown.status().message().find("limits.no_such_key_ms: unknown key") !=
          std::string::npos);
}
