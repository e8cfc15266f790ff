#pragma once

// A minimal valid daemon config for tests: public listener on 127.0.0.1:0 with the given
// certificate, admin on 127.0.0.1:0, short timeouts; `extra` is appended verbatim (more top-level
// sections). Header-only; pure.

#include <string>

namespace edge::testing {

// deploy/config/single-pop.yaml as shipped holds a placeholder for its tenant's key hash, which
// the loader refuses (a real hash there would be of a key every reader knows): `yaml` (that file's
// text) with the hash of no known key in its place, or "" when the placeholder is missing.
inline std::string example_with_key_hash(std::string yaml) {
    const std::string placeholder = R"("<printf '%s' \"$KEY\" | sha256sum>")";
    const size_t at = yaml.find(placeholder);
    if (at == std::string::npos) {
        return "";
    }
    return yaml.replace(at, placeholder.size(), std::string(64, 'e'));
}

inline std::string config_yaml(const std::string& cert, const std::string& key,
                               const std::string& extra = "") {
    return "listeners:\n"
           "  public:\n"
           "    address: 127.0.0.1\n"
           "    port: 0\n"
           "    certificates:\n"
           "      - server_names: [localhost]\n"
           "        cert: " + cert + "\n"
           "        key: " + key + "\n"
           "  admin:\n"
           "    address: 127.0.0.1\n"
           "    port: 0\n"
           "site:\n"
           "  id: test-site\n"
           "  region: local\n"
           "  latitude: 50.1\n"
           "  longitude: 8.7\n" + extra;
}

}  // namespace edge::testing
