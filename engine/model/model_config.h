#pragma once

// The parsed config.json of a Hugging Face checkpoint, with typed accessors whose errors name the
// file and the field ("dir/config.json: field 'hidden_size' is missing"), and the version digest
// of a checkpoint. Architectures (engine/model/archs/) read their own fields through it; the
// loader dispatches on architecture().
//
// Threading: immutable after read; safe to share.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/object.hpp>

#include "common/result.h"

namespace edge::engine {

class Checkpoint;
namespace quant {
struct QuantPolicy;
}

class ConfigJson {
public:
    // Reads and parses `dir`/config.json.
    static Result<ConfigJson> read(const std::string& dir);
    // Parses config text; `path` is used in messages.
    static Result<ConfigJson> parse(std::string_view text, std::string path);

    const std::string& path() const { return path_; }
    // The raw bytes of the file (for the version digest).
    const std::string& text() const { return text_; }
    // The parsed object, for a reader of fields the getters below do not cover.
    const boost::json::object& root() const { return root_; }
    // architectures[0], or model_type when architectures is absent.
    const std::string& architecture() const { return architecture_; }

    Result<int64_t> get_int(std::string_view key) const;
    Result<int64_t> get_int(std::string_view key, int64_t fallback) const;
    Result<double> get_double(std::string_view key) const;
    Result<double> get_double(std::string_view key, double fallback) const;
    Result<bool> get_bool(std::string_view key, bool fallback) const;
    Result<std::string> get_string(std::string_view key) const;
    // An int or a list of ints (eos_token_id is either); empty when absent or null.
    Result<std::vector<int64_t>> get_int_list(std::string_view key) const;
    bool has(std::string_view key) const;
    // True when the key is absent or JSON null.
    bool is_null(std::string_view key) const;

private:
    Status field_error(std::string_view key, std::string_view what) const;

    std::string path_;
    std::string text_;
    std::string architecture_;
    boost::json::object root_;
};

// Reads an int field and checks lo <= value <= hi.
Result<int64_t> get_int_in(const ConfigJson& config, std::string_view key, int64_t lo, int64_t hi);

// A string field that, when present and not null, must equal `only`; any other value is
// unimplemented ("config.json: field 'hidden_act' 'gelu' is not supported (only silu)").
Status require_string_if_set(const ConfigJson& config, std::string_view key, std::string_view only);

// Refuses a max_context (LoadOptions::max_context) beyond `served`, the positions the model's load
// serves: config.json's max_position_embeddings, or more where YaRN stretches it (the message
// names both then). The one text for the preflight (check-config) and every backend's load.
Status check_max_context(const ConfigJson& config, int64_t served, int64_t max_context);

// Token ids (an int or a list, as eos_token_id), each checked to lie in [0, vocab_size).
Result<std::vector<int64_t>> get_token_ids(const ConfigJson& config, std::string_view key,
                                           int64_t vocab_size);

// Hex SHA-256 over the config bytes, the checkpoint's tensor index (each tensor's name, dtype
// and shape, in name order), a sample of every tensor's bytes (64 at its start, middle and end:
// Checkpoint::content_sample), the tokenizer.json, tokenizer_config.json and
// generation_config.json beside config.json, and the quantization `policy` applied on load:
// equal for two copies of one checkpoint however sharded, different when the config, the shapes,
// the weights, the tokenizer or the policy change (a change that spares all three sampled spots
// of every tensor is missed: not a fine-tune, another seed or a requantization).
//
// The policy enters in its canonical form (QuantPolicy::to_string), so spellings of one policy
// ("experts-int4", "routed_experts=int4-g32") share a version; a policy that quantizes nothing
// adds nothing, so a model served without one keeps the version it had before policies counted
// (pins and rollout targets written then still match). A class the checkpoint stores quantized
// already, which the policy leaves as stored, still counts: a spare version is harmless, two
// different models behind one version are not.
std::string version_digest(const ConfigJson& config, const Checkpoint& checkpoint,
                           const quant::QuantPolicy& policy);

}  // namespace edge::engine
