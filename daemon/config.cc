// The YAML adapter: parse_config() and load_config(), the checks of the text as a whole (one
// document, UTF-8, closed quotes), the root mapping and the field handlers its sections share; the
// sections are parsed in config_listeners.cc, config_tenants.cc, config_engine.cc and
// config_cluster.cc (shared parts in config_internal.h). These are the only files that call
// yaml-cpp. Its exceptions stop here and become Status values with file:line:column and the key
// path.

#include "daemon/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_set>

#include <boost/asio/ip/address.hpp>

#include "common/file.h"
#include "daemon/config_internal.h"
#include "engine/tokenizer/utf8.h"
#include "tls/cidr.h"

namespace edge::daemon {

std::function<Status(const YAML::Node&, const std::string&)> number_field(const Reader& r,
                                                                          double& field,
                                                                          double min, double max,
                                                                          double scale) {
    return [&r, &field, min, max, scale](const YAML::Node& n, const std::string& k) -> Status {
        EDGE_ASSIGN_OR_RETURN(double v, r.number(n, k, min, max));
        field = v * scale;
        return ok_status();
    };
}

std::function<Status(const YAML::Node&, const std::string&)> string_field(const Reader& r,
                                                                          std::string& field) {
    return [&r, &field](const YAML::Node& n, const std::string& k) -> Status {
        EDGE_ASSIGN_OR_RETURN(field, r.string(n, k));
        return ok_status();
    };
}

std::function<Status(const YAML::Node&, const std::string&)> ms_field(
    const Reader& r, std::chrono::milliseconds& field) {
    return [&r, &field](const YAML::Node& n, const std::string& k) {
        return r.milliseconds(n, k, field);
    };
}

std::function<Status(const YAML::Node&, const std::string&)> ms0_field(
    const Reader& r, std::chrono::milliseconds& field) {
    return [&r, &field](const YAML::Node& n, const std::string& k) -> Status {
        EDGE_ASSIGN_OR_RETURN(int64_t v, r.integer(n, k, 0, 86'400'000));
        field = std::chrono::milliseconds(v);
        return ok_status();
    };
}

std::function<Status(const YAML::Node&, const std::string&)> ip_field(const Reader& r,
                                                                      std::string& field) {
    return [&r, &field](const YAML::Node& n, const std::string& k) -> Status {
        EDGE_ASSIGN_OR_RETURN(field, r.string(n, k));
        boost::system::error_code ec;
        (void)boost::asio::ip::make_address(field, ec);
        if (ec) {
            return r.error(n, k, "expected an IP literal (not a host name)");
        }
        return ok_status();
    };
}

std::function<Status(const YAML::Node&, const std::string&)> identifier_field(const Reader& r,
                                                                              std::string& field) {
    return [&r, &field](const YAML::Node& n, const std::string& k) -> Status {
        EDGE_ASSIGN_OR_RETURN(field, r.string(n, k));
        if (field.empty() || field.size() > 64) {
            return r.error(n, k, "must be 1 to 64 characters");
        }
        if (!is_identifier(field)) {
            return r.error(n, k, "may hold only letters, digits, '.', '_' and '-'");
        }
        return ok_status();
    };
}

namespace {

// The tenant models (tenant i, its models[j]) that are not one of `served`, in order.
std::vector<std::pair<size_t, size_t>> unserved_tenant_models(
    const std::vector<TenantConfig>& tenants, const std::vector<std::string>& served) {
    std::vector<std::pair<size_t, size_t>> unserved;
    for (size_t i = 0; i < tenants.size(); ++i) {
        for (size_t j = 0; j < tenants[i].models.size(); ++j) {
            if (std::find(served.begin(), served.end(), tenants[i].models[j]) == served.end()) {
                unserved.emplace_back(i, j);
            }
        }
    }
    return unserved;
}

// A new top-level section here is compared by changed_restart_sections() too (or, when SIGHUP
// applies it, left out there on purpose).
Status parse_root(const Reader& r, const YAML::Node& root, Config& c) {
    EDGE_RETURN_IF_ERROR(r.for_each_key(
        root, "",
        {{"listeners",
          [&](const YAML::Node& n, const std::string& k) { return parse_listeners(r, n, k, c); }},
         {"site",
          [&](const YAML::Node& n, const std::string& k) { return parse_site(r, n, k, c); }},
         {"models",
          [&](const YAML::Node& n, const std::string& k) { return parse_models(r, n, k, c); }},
         {"engine",
          [&](const YAML::Node& n, const std::string& k) { return parse_engine(r, n, k, c); }},
         {"tenants",
          [&](const YAML::Node& n, const std::string& k) { return parse_tenants(r, n, k, c); }},
         {"limits",
          [&](const YAML::Node& n, const std::string& k) { return parse_limits(r, n, k, c); }},
         {"routing",
          [&](const YAML::Node& n, const std::string& k) { return parse_routing(r, n, k, c); }},
         {"gossip",
          [&](const YAML::Node& n, const std::string& k) { return parse_gossip(r, n, k, c); }},
         {"peer",
          [&](const YAML::Node& n, const std::string& k) { return parse_peer(r, n, k, c); }},
         {"proxy_protocol",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              return r.for_each_key(
                  n, k, {{"trusted", [&](const YAML::Node& tn, const std::string& tk) -> Status {
                              EDGE_ASSIGN_OR_RETURN(c.proxy_protocol.trusted, r.strings(tn, tk));
                              Result<tls::CidrSet> set =
                                  tls::CidrSet::parse(c.proxy_protocol.trusted);
                              if (!set.ok()) {
                                  return r.error(tn, tk, set.status().message());
                              }
                              return ok_status();
                          }}});
          }},
         {"log", [&](const YAML::Node& n, const std::string& k) -> Status {
              return r.for_each_key(
                  n, k,
                  {{"level",
                    [&](const YAML::Node& ln, const std::string& lk) -> Status {
                        EDGE_ASSIGN_OR_RETURN(c.log.level, r.string(ln, lk));
                        if (c.log.level != "debug" && c.log.level != "info" &&
                            c.log.level != "warn" && c.log.level != "error") {
                            return r.error(ln, lk, "expected debug, info, warn or error");
                        }
                        return ok_status();
                    }},
                   {"access_log", [&](const YAML::Node& an, const std::string& ak) -> Status {
                        EDGE_ASSIGN_OR_RETURN(c.log.access_log, r.boolean(an, ak));
                        return ok_status();
                    }}});
          }}}));
    EDGE_RETURN_IF_ERROR(r.require_keys(root, "", {"listeners", "site"}));
    // In a cluster the other sites route by the distance to this one until their network
    // coordinates settle: a position left out would read as (0, 0), off the coast of Africa.
    if (c.gossip.enabled) {
        const YAML::Node site = root["site"];
        for (const char* k : {"latitude", "longitude"}) {
            if (!site[k]) {
                return r.error(site, "site",
                               std::string("missing '") + k +
                                   "': a site in a cluster (`gossip`) gives its position");
            }
        }
    }
    // A site alone serves only its models: a tenant's list names them. In a cluster it may name
    // models other sites serve (a front door serves none itself), which requests reach by
    // forwarding.
    if (c.tenants && !c.gossip.enabled) {
        std::vector<std::string> served;
        for (const auto& m : c.models) {
            served.push_back(m.name);
        }
        if (const auto unserved = unserved_tenant_models(*c.tenants, served); !unserved.empty()) {
            const auto [i, j] = unserved.front();
            std::string k = "tenants[" + std::to_string(i) + "].models[" + std::to_string(j) + "]";
            return r.error(root["tenants"][i]["models"][j], k,
                           "model '" + (*c.tenants)[i].models[j] +
                               "' is not in `models` (a site outside a cluster serves only its "
                               "own)");
        }
    }
    c.engine.models = c.models;
    return ok_status();
}

// Where the text stops being one YAML document, if it does: the 0-based line and what is there.
// A `---` marker after content (comments, blank lines and directives are not content) starts a
// second document; content after a `...` end marker belongs to none. yaml-cpp's Load reads the
// first document and silently drops the rest, so a `...` that a template tool emitted mid-file
// (PyYAML writes one after a lone scalar) would drop every section after it: `tenants` among
// them, which turns authentication off.
struct DocumentBreak {
    int line = 0;
    std::string message;
};

std::optional<DocumentBreak> document_break(std::string_view text) {
    // A UTF-8 byte order mark is not content: YAML reads a marker after it (and after comments)
    // as the document's start, as it does without one.
    if (text.starts_with("\xEF\xBB\xBF")) {
        text.remove_prefix(3);
    }
    bool content = false;
    std::optional<int> end_marker;  // The line of a `...` seen so far.
    int line = 0;
    auto is_marker = [](std::string_view l, std::string_view m) {
        return l.starts_with(m) && (l.size() == 3 || l[3] == ' ' || l[3] == '\t');
    };
    for (size_t pos = 0; pos < text.size(); ++line) {
        size_t end = text.find('\n', pos);
        if (end == std::string_view::npos) {
            end = text.size();
        }
        std::string_view l = text.substr(pos, end - pos);
        pos = end + 1;
        if (!l.empty() && l.back() == '\r') {
            l.remove_suffix(1);
        }
        const bool start = is_marker(l, "---");
        if (start && content) {
            return DocumentBreak{line,
                                 "a second YAML document (`---` after the first); the "
                                 "configuration is one document"};
        }
        if (is_marker(l, "...")) {
            end_marker = end_marker.value_or(line);
            continue;
        }
        const size_t first = l.find_first_not_of(" \t");
        const bool blank_or_comment = first == std::string_view::npos || l[first] == '#';
        if (end_marker && !blank_or_comment) {
            return DocumentBreak{line, "content after the end of the document (`...` on line " +
                                           std::to_string(*end_marker + 1) +
                                           "); the configuration is one document"};
        }
        // Content on a `---` line (`--- {a: 1}`) belongs to the document the marker starts.
        const size_t after_marker = start ? l.find_first_not_of(" \t", 3) : first;
        if (!blank_or_comment && l[0] != '%' && after_marker != std::string_view::npos &&
            l[after_marker] != '#') {
            content = true;
        }
    }
    return std::nullopt;
}

// yaml-cpp reports a tab in the indentation as whatever it breaks ("end of map not found",
// "illegal map value"), without a word of tabs; YAML indents with spaces only. When the line of a
// parse error, or the line above it, has a tab before its first character, the error says so.
std::string tab_indentation_hint(std::string_view text, const YAML::Mark& mark) {
    if (mark.is_null()) {
        return {};
    }
    int line = 0;
    for (size_t pos = 0; pos < text.size() && line <= mark.line; ++line) {
        size_t end = text.find('\n', pos);
        if (end == std::string_view::npos) {
            end = text.size();
        }
        const std::string_view l = text.substr(pos, end - pos);
        pos = end + 1;
        const size_t first = l.find_first_not_of(" \t\r");
        if (line + 1 >= mark.line && first != std::string_view::npos &&
            l.substr(0, first).find('\t') != std::string_view::npos) {
            return " (line " + std::to_string(line + 1) +
                   " is indented with a tab; YAML indents with spaces only)";
        }
    }
    return {};
}

// Where `text` first stops being UTF-8, if it does: a mark with the 0-based line and byte column
// (as yaml-cpp counts them). yaml-cpp passes such bytes through as they are: a Latin-1 "é" in a
// model name would be served in /v1/models as JSON no client decodes, and would never match the
// UTF-8 name clients send.
std::optional<YAML::Mark> first_non_utf8(std::string_view text) {
    const size_t bad = engine::tokenizer::utf8_first_invalid(text);
    if (bad == text.size()) {
        return std::nullopt;
    }
    const std::string_view before = text.substr(0, bad);
    const size_t line_start = before.rfind('\n') + 1;  // npos + 1 == 0: the first line.
    YAML::Mark mark;
    mark.pos = static_cast<int>(bad);
    mark.line = static_cast<int>(std::count(before.begin(), before.end(), '\n'));
    mark.column = static_cast<int>(bad - line_start);
    return mark;
}

// yaml-cpp 0.7 accepts a quoted scalar whose closing quote never comes: it runs to the end of
// the input and swallows every section after it. Each quoted scalar (yaml-cpp tags it "!") is
// checked in the raw text from its opening quote at Mark().pos: a double-quoted one ends at an
// unescaped `"`, a single-quoted one at a `'` not doubled. Each node of the text is visited once
// (`seen` holds their positions): an alias is the node it names, and following every alias path
// of nested aliases would take exponential time (a "billion laughs" file of 600 bytes).
Status check_quoted_scalars(const Reader& r, std::string_view text, size_t offset,
                            const YAML::Node& node, std::unordered_set<int>& seen) {
    if (!node.Mark().is_null() && !seen.insert(node.Mark().pos).second) {
        return ok_status();
    }
    if (node.IsMap()) {
        for (auto it = node.begin(); it != node.end(); ++it) {
            EDGE_RETURN_IF_ERROR(check_quoted_scalars(r, text, offset, it->first, seen));
            EDGE_RETURN_IF_ERROR(check_quoted_scalars(r, text, offset, it->second, seen));
        }
        return ok_status();
    }
    if (node.IsSequence()) {
        for (size_t i = 0; i < node.size(); ++i) {
            EDGE_RETURN_IF_ERROR(check_quoted_scalars(r, text, offset, node[i], seen));
        }
        return ok_status();
    }
    if (!node.IsScalar() || node.Tag() != "!" || node.Mark().is_null()) {
        return ok_status();
    }
    const size_t start = offset + static_cast<size_t>(node.Mark().pos);
    if (start >= text.size() || (text[start] != '"' && text[start] != '\'')) {
        return ok_status();  // A block scalar (| or >), or a tagged one.
    }
    const char quote = text[start];
    for (size_t i = start + 1; i < text.size(); ++i) {
        if (quote == '"' && text[i] == '\\') {
            ++i;  // The escaped character, whatever it is.
        } else if (text[i] == quote) {
            if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
                ++i;  // '' is a quote inside a single-quoted string.
            } else {
                return ok_status();
            }
        }
    }
    return r.error(node, "",
                   std::string("unterminated quoted string (no closing ") + quote +
                       " before the end of the file)");
}

}  // namespace

Result<Config> parse_config(std::string_view yaml_text, const std::string& source) {
    Config config;
    config.source = source;
    // Relative paths in the config are relative to its directory, made absolute now: the
    // values (and their errors, on a reload too) then say where they point.
    std::filesystem::path base = std::filesystem::path(source).parent_path();
    if (base.empty()) {
        base = ".";
    }
    std::error_code cwd_error;
    if (std::filesystem::path absolute = std::filesystem::absolute(base, cwd_error);
        !cwd_error) {
        base = absolute;
    }
    Reader reader(source, base);
    try {
        // Not YAML::LoadAll: yaml-cpp 0.7 can loop forever in it on malformed input (the
        // fuzzer found one). A second document starts with `---` at column 0 after content.
        if (std::optional<DocumentBreak> b = document_break(yaml_text)) {
            YAML::Mark mark;
            mark.line = b->line;
            return reader.error(mark, "", b->message);
        }
        if (std::optional<YAML::Mark> bad = first_non_utf8(yaml_text)) {
            char byte[8];
            std::snprintf(byte, sizeof(byte), "0x%02X",
                          static_cast<unsigned char>(yaml_text[static_cast<size_t>(bad->pos)]));
            return reader.error(*bad, "",
                                std::string("byte ") + byte +
                                    " is not UTF-8; the configuration is UTF-8 text");
        }
        YAML::Node root = YAML::Load(std::string(yaml_text));
        if (!root.IsDefined() || root.IsNull()) {
            return invalid_argument_error(source + ": empty configuration");
        }
        // yaml-cpp's marks do not count a UTF-8 byte order mark.
        const size_t offset = yaml_text.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;
        std::unordered_set<int> seen;
        EDGE_RETURN_IF_ERROR(check_quoted_scalars(reader, yaml_text, offset, root, seen));
        EDGE_RETURN_IF_ERROR(parse_root(reader, root, config));
    } catch (const YAML::Exception& e) {
        return reader.error(e.mark, "", e.msg + tab_indentation_hint(yaml_text, e.mark));
    } catch (const std::exception& e) {
        return invalid_argument_error(source + ": " + e.what());
    }
    return config;
}

std::vector<std::string> changed_restart_sections(const Config& running, const Config& fresh) {
    // Each section's parsed values without what a reload applies. Compared as values, not as
    // YAML text, so that reordered keys or a default written out do not ask for a restart.
    auto listeners = [](const Config& c) {
        PublicListenerConfig pub = c.listener;
        pub.certificates.clear();
        AdminListenerConfig admin = c.admin;
        admin.token_file.clear();  // Read again by a reload.
        return std::pair(pub, admin);
    };
    auto engine = [](const Config& c) {
        engine::EngineConfig e = c.engine;
        e.models.clear();  // The `models` section's, compared there.
        return e;
    };
    auto gossip = [](const Config& c) {
        GossipConfig g = c.gossip;
        g.keys.clear();
        g.keyring_file.clear();
        return g;
    };
    auto peer = [](const Config& c) {
        std::optional<PeerConfig> p = c.peer;
        if (p) {
            p->ca_path.clear();
            p->cert_path.clear();
            p->key_path.clear();
        }
        return p;
    };
    std::vector<std::string> changed;
    auto check = [&](const char* section, auto value) {
        if (!(value(running) == value(fresh))) {
            changed.push_back(section);
        }
    };
    // In name order.
    check("engine", engine);
    check("gossip", gossip);
    check("listeners", listeners);
    check("log", [](const Config& c) { return c.log; });
    check("models", [](const Config& c) { return c.models; });
    check("peer", peer);
    check("proxy_protocol", [](const Config& c) { return c.proxy_protocol; });
    // SIGHUP applies the routing weights; the outlier detector's settings and the initial
    // target versions wait for a restart.
    check("routing",
          [](const Config& c) { return std::pair(c.routing.outlier, c.routing.target_versions); });
    check("site", [](const Config& c) { return c.site; });
    return changed;
}

Status check_tenant_models(const Config& fresh, const std::vector<std::string>& served) {
    if (!fresh.tenants) {
        return ok_status();
    }
    const auto unserved = unserved_tenant_models(*fresh.tenants, served);
    if (unserved.empty()) {
        return ok_status();
    }
    // Every one, not the first: the operator fixes the list (or restarts) once.
    std::string names;
    for (const auto& [i, j] : unserved) {
        names += (names.empty() ? "" : ", ") + std::string("tenants[") + std::to_string(i) +
                 "].models[" + std::to_string(j) + "]: model '" + (*fresh.tenants)[i].models[j] +
                 "'";
    }
    std::string list;
    for (const std::string& name : served) {
        list += (list.empty() ? "" : ", ") + name;
    }
    return invalid_argument_error(fresh.source + ": " + names +
                                  (unserved.size() == 1 ? " is" : " are") +
                                  " not served here (this site serves " +
                                  (list.empty() ? "none" : list) +
                                  " until a restart applies a changed `models` section)");
}

bool is_identifier(std::string_view s) {
    return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
               ch == '.' || ch == '_' || ch == '-';
    });
}

Result<Config> load_config(const std::string& path) {
    Result<std::string> text = read_small_file(path, uint64_t{16} << 20);
    if (text.status().code() == StatusCode::kNotFound) {
        return not_found_error("cannot open config file '" + path + "'");
    }
    if (!text.ok()) {
        return text.status();
    }
    EDGE_ASSIGN_OR_RETURN(Config config, parse_config(*text, path));
    // A testing-only key in a config file read by the daemon (run, check-config, SIGHUP): refused
    // unless the environment says this is a test (never set in the systemd unit).
    const char* testing = std::getenv("EDGESERVE_TESTING");
    if (!config.gossip.testing_peer_delay.empty() &&
        (testing == nullptr || std::string_view(testing) != "1")) {
        return invalid_argument_error(
            path + ": gossip.testing_peer_delay_ms is for tests only (it delays gossip packets "
                   "and forwarded requests on purpose); refused unless the environment sets "
                   "EDGESERVE_TESTING=1");
    }
    return config;
}

}  // namespace edge::daemon
