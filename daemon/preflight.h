#pragma once

// preflight_config() checks what a loaded Config names outside itself, without serving: every
// certificate and key pair loads and matches, no key file is open to every user (the public
// chains and the peer mTLS set, through
// the same TlsContextStore::create the daemon uses), no two TCP listeners share a port, each
// model directory passes engine::check_model_files (config.json and its architecture's fields,
// the safetensors headers, the stored quantization and the policy: what the load checks before
// reading a weight), its max_context is within the positions it serves (with YaRN, the stretched
// length), its tokenizer loads and its chat_template is known, engine.backend is one this host
// has (`cuda`: compiled in and a GPU visible), the sharding communicator is compiled in, and the
// gossip settings and keyring load. `edgeserve check-config`
// runs it after load_config(), and `run` runs it before loading the models, so the two cannot
// disagree and a certificate typo fails the start at once. Errors name the config file and the
// key. Pure apart from reading files; call from any thread.

#include <string>
#include <vector>

#include "common/result.h"
#include "daemon/config.h"

namespace edge::daemon {

// `public_socket_inherited`: the public listener comes from socket activation, so
// listeners.public.address/port are not used (and not checked against the other ports).
// On success, what would load but not work fully, one line each, for check-config to print
// (`run` logs the same at load): a model whose chat template is in no known format serves
// completions only.
Result<std::vector<std::string>> preflight_config(const Config& config,
                                                  bool public_socket_inherited = false);

// What a SIGHUP reads again, checked as preflight_config() checks it (preflight_config runs
// it first): every certificate and key pair (public chains, the peer mTLS set), the admin token
// file, the gossip settings and keyring. The daemon runs it on a reloaded config before it
// applies any of it, so a config with one bad part changes nothing. Errors name the config file
// and the key; on one, `refused_part` (when given) is set to the part it is in, as the daemon's
// config_reload_failed event names it: "certificates" (listeners.public.certificates),
// "peer_certificates" (`peer`), "admin_token" or "gossip".
Status preflight_reload(const Config& config, std::string* refused_part = nullptr);

// What SIGHUP checks of the sections a reload does not apply (changed_restart_sections() from
// `running`, the config the daemon started with, to `fresh`), as preflight_config() checks them:
// changed listeners, peer or gossip sections the ports, a changed engine section its backend,
// cpu_kernels and communicator, changed models or engine sections each model directory. A
// reload that took such a config would report success while the next start (check-config, then
// `run`) refuses it. The error names the config file and key and says the next start would fail;
// `refused_part` (when given) is set to the section: "listeners", "peer", "gossip", "engine" or
// "models". Unchanged sections are not looked at (they passed at the start).
Status preflight_restart(const Config& running, const Config& fresh,
                         bool public_socket_inherited = false,
                         std::string* refused_part = nullptr);

// For `run`, before the models load (which can take minutes): each TCP listener's address and
// port can be bound now (a port another process listens on fails here, at once). Not part of
// check-config, which runs beside a live daemon whose ports are taken. kUnavailable names the
// config key and the system's reason.
Status check_ports_free(const Config& config, bool public_socket_inherited = false);

}  // namespace edge::daemon
