// docs/config.md cannot drift from the YAML adapter: every key path parse_config accepts is named
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
// one of the xxx_field() helpers, either maybe inside empty_means_default() (so value tables such
// as {"fp8", WeightFormat::kFp8} or log fields do not count as keys). Names only: where each is
// accepted is for parse_config to say (accepted_at()).
std::set<std::string> adapter_keys() {
    std::set<std::string> keys;
    std::regex entry(
        "\\{\"([a-z_0-9]+)\",\\s*(empty_means_default\\(\\s*)?(\\[|[a-z_0-9]+_field\\()");
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

// Whether parse_config takes a key at `path` (`a[].b`): yaml_for(path) is refused for anything
// but `path` itself being unknown (`a[0].b: unknown key`).
bool accepted_at(const std::string& path) {
    std::string shown = path;
    for (size_t at = shown.find("[]"); at != std::string::npos; at = shown.find("[]", at)) {
        shown.replace(at, 2, "[0]");
    }
    Result<daemon::Config> r = daemon::parse_config(yaml_for(path), "doc.yaml");
    return r.ok() || r.status().message().find(": " + shown + ": unknown key") == std::string::npos;
}

}  // namespace

TEST_CASE("every key the YAML adapter accepts is documented in docs/config.md at its path") {
    // Each name in the adapter's tables is tried under each mapping the docs hold (the root and
    // every documented key's parents: `listeners`, `listeners.public`, `models[]`...); where
    // parse_config takes it, that full path must be documented. Names alone would let `site.port`
    // pass because `peer.port` is documented.
    const std::vector<std::string> keys = documented_keys();
    const std::set<std::string> documented(keys.begin(), keys.end());
    std::set<std::string> sections = {""};
    for (const std::string& key : keys) {
        for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) {
            sections.insert(key.substr(0, dot));
        }
    }
    const std::set<std::string> names = adapter_keys();
    CHECK(names.size() > 50);
    std::set<std::string> taken;  // The names accepted at some path tried.
    for (const std::string& section : sections) {
        for (const std::string& name : names) {
            const std::string path = section.empty() ? name : section + "." + name;
            if (!accepted_at(path)) {
                continue;
            }
            taken.insert(name);
            CHECK_MESSAGE(
                (documented.count(path) == 1 || sections.count(path) == 1 ||
                 sections.count(path + "[]") == 1),
                "parse_config accepts `" << path << "`; docs/config.md has no row for it");
        }
    }
    // A name taken under none of them belongs to a section the docs do not name at all.
    for (const std::string& name : names) {
        CHECK_MESSAGE(taken.count(name) == 1, "daemon/config*.cc accepts `"
                                                  << name
                                                  << "` under no mapping docs/config.md documents");
    }
    // And the names of the documented keys are all in the tables tried above.
    for (const std::string& key : keys) {
        std::string name = split_path(key).back();
        if (name.ends_with("[]")) {
            name.resize(name.size() - 2);
        }
        CHECK_MESSAGE(names.count(name) == 1, "docs/config.md documents `"
                                                  << key << "`; daemon/config*.cc has no such key");
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
