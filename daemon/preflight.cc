#include "daemon/preflight.h"

#include <algorithm>
#include <optional>
#include <vector>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>

#include "daemon/admin_server.h"
#include "daemon/cluster/cluster.h"
#include "engine/backend.h"
#include "engine/cpu/matmul.h"
#include "engine/model/loader.h"
#include "engine/model/model_config.h"
#include "engine/shard/communicator.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tiktoken.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_config.h"
#include "tls/tls_context.h"

namespace edge::daemon {
namespace {

struct Listener {
    std::string key;  // The config key of its port.
    std::string address;
    uint16_t port;
};

// Two TCP listeners on one port collide when either listens everywhere or both on one address,
// however each is written ("::0", "0:0::0" and "::" are one; an IPv4-mapped address is its IPv4
// one). The config holds IP literals only.
bool same_or_wildcard(const std::string& a, const std::string& b) {
    auto parse = [](const std::string& text) {
        boost::system::error_code ec;
        boost::asio::ip::address address = boost::asio::ip::make_address(text, ec);
        if (!ec && address.is_v6() && address.to_v6().is_v4_mapped()) {
            address = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, address.to_v6());
        }
        return ec ? std::optional<boost::asio::ip::address>() : address;
    };
    const auto x = parse(a);
    const auto y = parse(b);
    if (!x || !y) {
        return a == b;
    }
    return x->is_unspecified() || y->is_unspecified() || *x == *y;
}

// The TCP ports the daemon listens on (gossip also takes UDP on its port).
std::vector<Listener> tcp_listeners(const Config& config, bool public_socket_inherited) {
    std::vector<Listener> listeners;
    if (!public_socket_inherited) {
        listeners.push_back(
            {"listeners.public.port", config.listener.address, config.listener.port});
    }
    listeners.push_back({"listeners.admin.port", config.admin.address, config.admin.port});
    if (config.peer) {
        listeners.push_back({"peer.port", config.peer->address, config.peer->port});
    }
    if (config.gossip.enabled) {
        listeners.push_back({"gossip.port", config.gossip.bind_address, config.gossip.port});
    }
    return listeners;
}

Status check_ports(const Config& config, bool public_socket_inherited) {
    const std::vector<Listener> listeners = tcp_listeners(config, public_socket_inherited);
    for (size_t i = 0; i < listeners.size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
            const Listener& a = listeners[j];
            const Listener& b = listeners[i];
            if (a.port != 0 && a.port == b.port && same_or_wildcard(a.address, b.address)) {
                return invalid_argument_error(config.source + ": " + b.key + ": port " +
                                              std::to_string(b.port) + " is also " + a.key);
            }
        }
    }
    return ok_status();
}

// What the engine reads first when it loads `model`, and the options it checks by name. On
// success, a warning when the model will load without chat ("" when none).
Result<std::string> check_model(const engine::ModelConfig& model,
                                const engine::shard::ShardingConfig& sharding) {
    // config.json and its architecture's fields, the safetensors headers, the stored
    // quantization and the policy, and max_context against the positions the model serves:
    // what the load checks before reading a weight.
    EDGE_RETURN_IF_ERROR(
        engine::check_model_files(model.path, model.quantization, sharding, model.max_context));
    EDGE_ASSIGN_OR_RETURN(std::unique_ptr<engine::tokenizer::Tokenizer> tokenizer,
                          engine::tokenizer::load_checkpoint_tokenizer(model.path));
    // As the load refuses it: a tokenizer whose ids the model has no rows for.
    EDGE_ASSIGN_OR_RETURN(engine::ConfigJson config, engine::ConfigJson::read(model.path));
    if (Result<int64_t> vocab = config.get_int("vocab_size");
        vocab.ok() && tokenizer->vocab_size() > *vocab) {
        return invalid_argument_error("tokenizer has " + std::to_string(tokenizer->vocab_size()) +
                                      " tokens but " + config.path() + " says vocab_size " +
                                      std::to_string(*vocab));
    }
    EDGE_ASSIGN_OR_RETURN(engine::tokenizer::TokenizerConfig tokenizer_config,
                          engine::tokenizer::load_tokenizer_config(model.path));
    // kNotFound ("auto" recognises no format) only turns chat completions off for the model.
    Result<engine::tokenizer::ChatFormat> format =
        engine::tokenizer::choose_chat_format(model.chat_template, tokenizer_config, *tokenizer);
    if (!format.ok() && format.status().code() != StatusCode::kNotFound) {
        return format.status();
    }
    std::string warning;
    if (!format.ok() && !tokenizer_config.chat_template.empty()) {
        warning = "the chat template (" + tokenizer_config.chat_template_file +
                  ") is in no known format: chat requests will be refused; set "
                  "models[].chat_template to one of " +
                  std::string(engine::tokenizer::kChatFormatNames);
    }
    if (format.ok()) {
        // The format's control tokens, as the load checks them (a named format the vocabulary
        // cannot write fails the load).
        if (auto chat = engine::tokenizer::ChatTemplate::create(*format, tokenizer.get());
            !chat.ok()) {
            return chat.status().with_context("chat_template " + model.chat_template);
        }
    }
    return warning;
}

// The engine options a start checks by name: engine.backend (one this host has: `cuda` needs
// the CUDA backend compiled in and a GPU visible), engine.cpu_kernels (one this CPU runs) and
// engine.sharding.communicator (one compiled in).
Status check_engine(const Config& config) {
    const std::string& file = config.source;
    // As `run` resolves it first thing: a reload that took a `cuda` this host lacks would leave
    // the next start to fail.
    if (Status backend = engine::resolve_backend(config.engine.backend).status(); !backend.ok()) {
        return backend.with_context(file + ": engine.backend");
    }
    if (config.engine.cpu_kernels != "auto") {
        if (Result<engine::cpu::Isa> isa = engine::cpu::isa_by_name(config.engine.cpu_kernels);
            !isa.ok()) {
            return isa.status().with_context(file + ": engine.cpu_kernels");
        }
    }
    const std::vector<std::string> communicators = engine::shard::available_communicators();
    if (std::find(communicators.begin(), communicators.end(),
                  config.engine.sharding.communicator) == communicators.end()) {
        std::string known;
        for (const std::string& c : communicators) {
            known += (known.empty() ? "" : ", ") + c;
        }
        return invalid_argument_error(file + ": engine.sharding.communicator: '" +
                                      config.engine.sharding.communicator +
                                      "' is not compiled in (available: " + known + ")");
    }
    return ok_status();
}

// check_model() for each of config.models; on success, preflight_config()'s warnings.
Result<std::vector<std::string>> check_models(const Config& config) {
    const std::string& file = config.source;
    std::vector<std::string> warnings;
    for (size_t i = 0; i < config.models.size(); ++i) {
        const engine::ModelConfig& m = config.models[i];
        Result<std::string> warning = check_model(m, config.engine.sharding);
        if (!warning.ok()) {
            return warning.status().with_context(file + ": models[" + std::to_string(i) +
                                                 "] (\"" + m.name + "\", " + m.path + ")");
        }
        if (!warning->empty()) {
            warnings.push_back(file + ": models[" + std::to_string(i) + "] (\"" + m.name +
                               "\"): " + *warning);
        }
    }
    return warnings;
}

}  // namespace

Status preflight_reload(const Config& config, std::string* refused_part) {
    const std::string& file = config.source;
    auto refuse = [refused_part](const char* part, Status error) {
        if (refused_part != nullptr) {
            *refused_part = part;
        }
        return error;
    };
    const auto& certs = config.listener.certificates;
    // As the start loads them: a key that does not match, is encrypted, or that every user may
    // read (tls::use_private_key_file) fails here, naming the file.
    for (size_t i = 0; i < certs.size(); ++i) {
        Result<std::unique_ptr<tls::TlsContextStore>> store =
            tls::TlsContextStore::create({certs[i]});
        if (!store.ok()) {
            return refuse("certificates",
                          store.status().with_context(file + ": listeners.public.certificates[" +
                                                      std::to_string(i) + "]"));
        }
    }
    if (config.peer) {
        const PeerConfig& p = *config.peer;
        Result<std::unique_ptr<tls::TlsContextStore>> store =
            tls::TlsContextStore::create({tls::CertificateConfig{{}, p.cert_path, p.key_path}},
                                         tls::ClientAuthConfig{p.ca_path});
        if (!store.ok()) {
            return refuse("peer_certificates", store.status().with_context(file + ": peer"));
        }
    }
    if (!config.admin.token_file.empty()) {
        if (Result<std::string> token = read_admin_token(config.admin.token_file); !token.ok()) {
            return refuse("admin_token",
                          token.status().with_context(file + ": listeners.admin.token_file"));
        }
    }
    if (config.gossip.enabled) {
        // membership_config names the config file and `gossip` itself.
        if (Status s = cluster::membership_config(config).status(); !s.ok()) {
            return refuse("gossip", s);
        }
        Result<routing::membership::Keyring> keyring = cluster::load_keyring(config.gossip);
        if (!keyring.ok()) {
            return refuse("gossip", keyring.status().with_context(file));
        }
    }
    return ok_status();
}

Result<std::vector<std::string>> preflight_config(const Config& config,
                                                  bool public_socket_inherited) {
    EDGE_RETURN_IF_ERROR(preflight_reload(config));
    EDGE_RETURN_IF_ERROR(check_ports(config, public_socket_inherited));
    EDGE_RETURN_IF_ERROR(check_engine(config));
    return check_models(config);
}

Status preflight_restart(const Config& running, const Config& fresh,
                         bool public_socket_inherited, std::string* refused_part) {
    const std::vector<std::string> changed = changed_restart_sections(running, fresh);
    auto has = [&changed](const char* section) {
        return std::find(changed.begin(), changed.end(), section) != changed.end();
    };
    // As preflight_config() would check the sections a reload leaves for the restart: a reload
    // that took them would report success for a config the next start (ExecStartPre's
    // check-config) refuses. The rest preflight_reload() checks on every reload.
    Status checked;
    const char* part = "";
    if (has("listeners") || has("peer") || has("gossip")) {
        checked = check_ports(fresh, public_socket_inherited);
        part = has("listeners") ? "listeners" : has("peer") ? "peer" : "gossip";
    }
    if (checked.ok() && has("engine")) {
        checked = check_engine(fresh);
        part = "engine";
    }
    // The sharding settings are part of what a model directory is checked against.
    if (checked.ok() && (has("models") || has("engine"))) {
        checked = check_models(fresh).status();
        part = "models";
    }
    if (checked.ok()) {
        return ok_status();
    }
    if (refused_part != nullptr) {
        *refused_part = part;
    }
    return Status(checked.code(), checked.message() + " (a reload leaves `" + part +
                                      "` for the restart, which would fail on this config)");
}

Status check_ports_free(const Config& config, bool public_socket_inherited) {
    namespace net = boost::asio;
    net::io_context io;
    for (const Listener& l : tcp_listeners(config, public_socket_inherited)) {
        boost::system::error_code ec;
        const net::ip::address address = net::ip::make_address(l.address, ec);
        if (ec || l.port == 0) {
            continue;  // A name the listener resolves itself, or any free port.
        }
        const net::ip::tcp::endpoint endpoint(address, l.port);
        net::ip::tcp::acceptor probe(io);
        probe.open(endpoint.protocol(), ec);
        if (!ec) {
            probe.set_option(net::socket_base::reuse_address(true), ec);
            probe.bind(endpoint, ec);
        }
        if (ec) {
            return unavailable_error(config.source + ": " + l.key + ": cannot listen on " +
                                     l.address + ":" + std::to_string(l.port) + ": " +
                                     ec.message());
        }
    }
    // Gossip also binds UDP on its port; another process's UDP socket there would otherwise be
    // found only after the models load.
    boost::system::error_code ec;
    const net::ip::address gossip_address = net::ip::make_address(config.gossip.bind_address, ec);
    if (config.gossip.enabled && !ec && config.gossip.port != 0) {
        const net::ip::udp::endpoint endpoint(gossip_address, config.gossip.port);
        net::ip::udp::socket probe(io);
        probe.open(endpoint.protocol(), ec);
        if (!ec) {
            probe.bind(endpoint, ec);
        }
        if (ec) {
            return unavailable_error(config.source + ": gossip.port: cannot bind UDP " +
                                     config.gossip.bind_address + ":" +
                                     std::to_string(config.gossip.port) + ": " + ec.message());
        }
    }
    return ok_status();
}

}  // namespace edge::daemon
