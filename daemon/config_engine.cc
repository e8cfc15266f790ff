// The `models` and `engine` sections, for parse_config(): the models served and the engine's
// threads, backend, kernels, batch and KV-cache sizes, queues and expert sharding.

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>

#include "daemon/config_internal.h"
#include "routing/membership/site_state.h"

namespace edge::daemon {

Status parse_models(const Reader& r, const YAML::Node& node, const std::string& key, Config& c) {
    if (!node.IsSequence()) {
        return r.error(node, key, "expected a list of models");
    }
    std::set<std::string> names;
    for (size_t i = 0; i < node.size(); ++i) {
        std::string item = key + "[" + std::to_string(i) + "]";
        engine::ModelConfig m;
        EDGE_RETURN_IF_ERROR(r.for_each_key(
            node[i], item,
            {{"name", string_field(r, m.name)},
             {"path",
              [&](const YAML::Node& n, const std::string& k) -> Status {
                  EDGE_ASSIGN_OR_RETURN(m.path, r.path(n, k));
                  return ok_status();
              }},
             {"quantization", string_field(r, m.quantization)},
             {"max_context", int_field(r, m.max_context, 0, int64_t{1} << 24)},
             {"chat_template", string_field(r, m.chat_template)}}));
        EDGE_RETURN_IF_ERROR(r.require_keys(node[i], item, {"name", "path"}));
        if (m.name.empty() || m.name.size() > routing::membership::kMaxSiteStringBytes) {
            // Gossiped to every site, whose decoders refuse longer strings.
            return r.error(node[i]["name"], item + ".name", "must be 1 to 255 bytes");
        }
        if (!names.insert(m.name).second) {
            return r.error(node[i]["name"], item + ".name",
                           "duplicate model name '" + m.name + "'");
        }
        c.models.push_back(std::move(m));
    }
    return ok_status();
}

Status parse_engine(const Reader& r, const YAML::Node& node, const std::string& key, Config& c) {
    engine::EngineConfig& e = c.engine;
    EDGE_RETURN_IF_ERROR(r.for_each_key(
        node, key,
        {{"threads", int_field(r, e.threads, 0, 4096)},
         {"backend",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(e.backend, r.string(n, k));
              if (e.backend != "cpu" && e.backend != "cuda" && e.backend != "auto") {
                  return r.error(n, k, "expected cpu, cuda or auto");
              }
              return ok_status();
          }},
         {"activation_precision",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(const std::string p, r.string(n, k));
              if (p == "exact") {
                  e.activation_precision = engine::ActivationPrecision::kExact;
              } else if (p == "bf16") {
                  e.activation_precision = engine::ActivationPrecision::kBf16;
              } else {
                  return r.error(n, k, "expected exact or bf16");
              }
              return ok_status();
          }},
         {"cpu_kernels",
          [&](const YAML::Node& n, const std::string& k) -> Status {
              // Whether this CPU runs them is checked with the files (check-config, run).
              EDGE_ASSIGN_OR_RETURN(e.cpu_kernels, r.string(n, k));
              for (const char* known :
                   {"auto", "amx_bf16", "avx512_bf16", "avx512", "avx2", "scalar"}) {
                  if (e.cpu_kernels == known) {
                      return ok_status();
                  }
              }
              return r.error(n, k, "expected auto, amx_bf16, avx512_bf16, avx512, avx2 or scalar");
          }},
         // Gossiped as the pool's capacity, which other sites refuse past this bound.
         {"max_batch_sequences",
          int_field(r, e.max_batch_sequences, 1, routing::membership::kMaxPoolCapacity)},
         {"max_batch_tokens", int_field(r, e.max_batch_tokens, 1, 1 << 24)},
         {"max_decode_sequences", int_field(r, e.max_decode_sequences, 0, 1 << 16)},
         {"kv_cache_bytes", int_field(r, e.kv_cache_bytes, 1 << 20, int64_t{1} << 44)},
         {"kv_block_tokens", int_field(r, e.kv_block_tokens, 1, 4096)},
         {"kv_swap_bytes", int_field(r, e.kv_swap_bytes, 0, int64_t{1} << 44)},
         {"max_queue", int_field(r, e.max_queue, 1, 1 << 24)},
         {"max_queue_per_tenant", int_field(r, e.max_queue_per_tenant, 0, 1 << 24)},
         {"max_queue_wait_ms", int_field(r, e.max_queue_wait_ms, 0, int64_t{86'400'000})},
         {"prefix_cache", [&](const YAML::Node& n, const std::string& k) -> Status {
              EDGE_ASSIGN_OR_RETURN(e.prefix_cache, r.boolean(n, k));
              return ok_status();
          }},
         {"sharding", [&](const YAML::Node& n, const std::string& k) -> Status {
              engine::shard::ShardingConfig& sh = e.sharding;
              return r.for_each_key(
                  n, k,
                  {{"ranks", int_field(r, sh.ranks, 1, 256)},
                   {"slots_per_rank", int_field(r, sh.slots_per_rank, 0, 1 << 16)},
                   {"rebalance_interval_steps",
                    int_field(r, sh.rebalance_interval_steps, 0, 1 << 30)},
                   {"load_window_steps", int_field(r, sh.load_window_steps, 1, 1 << 30)},
                   {"static_plan", string_field(r, sh.static_plan)},
                   {"communicator", string_field(r, sh.communicator)}});
          }}}));
    // A step's decodes come first: a budget they can fill would leave newer sequences waiting
    // for their prefill until older ones finish.
    const int64_t decoders = e.max_decode_sequences > 0
                                 ? std::min(e.max_decode_sequences, e.max_batch_sequences)
                                 : e.max_batch_sequences;
    if (e.max_batch_tokens <= decoders) {
        return r.error(node, key,
                       "max_batch_tokens (" + std::to_string(e.max_batch_tokens) +
                           ") must exceed the sequences that decode in one step (" +
                           std::to_string(decoders) +
                           ": max_decode_sequences, or max_batch_sequences when that is 0), or "
                           "prefill stalls while they decode");
    }
    return ok_status();
}

}  // namespace edge::daemon
