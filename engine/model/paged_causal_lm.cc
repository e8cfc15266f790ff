#include "engine/model/paged_causal_lm.h"

#include <unistd.h>

#include <vector>

#include "engine/backend.h"
#include "engine/cpu/ops.h"
#include "engine/model/loader.h"
#include "engine/model/model_config.h"
#include "engine/model/weight_loader.h"

namespace edge::engine {

Status PagedCausalLM::create_kv_cache(int32_t layers, int32_t kv_heads, int32_t head_dim,
                                      int32_t slots, int32_t max_context, int32_t block_tokens,
                                      int64_t kv_cache_bytes) {
    if (slots < 1) {
        return invalid_argument_error("load options: max_slots must be at least 1");
    }
    if (block_tokens < 1 || block_tokens > 4096) {
        return invalid_argument_error("load options: kv_block_tokens " +
                                      std::to_string(block_tokens) + " is not in [1, 4096]");
    }
    KvCacheShape shape;
    shape.layers = layers;
    shape.kv_heads = kv_heads;
    shape.head_dim = head_dim;
    shape.slots = slots;
    shape.max_context = max_context;
    shape.block_tokens = block_tokens;
    const int64_t per_token = int64_t{layers} * 2 * kv_heads * head_dim * 4;
    const int64_t blocks_per_slot = (int64_t{max_context} + block_tokens - 1) / block_tokens;
    shape.budget_bytes = kv_cache_bytes > 0
                             ? kv_cache_bytes
                             : int64_t{slots} * blocks_per_slot * block_tokens * per_token;
    auto kv = KvCache::create(shape);
    if (!kv.ok()) {
        return kv.status().with_context("load options: kv_cache_bytes");
    }
    kv_ = std::move(kv).value();
    return ok_status();
}

Status PagedCausalLM::prepare_batch(std::span<const SequenceChunk> batch, int64_t* total) {
    *total = 0;
    const ModelSpec& s = spec();
    std::vector<SlotGrowth> growth;
    growth.reserve(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
        const SequenceChunk& ch = batch[i];
        const std::string where =
            "forward: chunk " + std::to_string(i) + " (slot " + std::to_string(ch.slot) + ")";
        if (!kv_->in_use(ch.slot)) {
            return invalid_argument_error(where + ": slot is not acquired");
        }
        for (size_t j = 0; j < i; ++j) {
            if (batch[j].slot == ch.slot) {
                return invalid_argument_error(where + ": slot appears twice in one batch");
            }
        }
        if (ch.start_pos != kv_->length(ch.slot)) {
            return invalid_argument_error(where + ": start_pos " + std::to_string(ch.start_pos) +
                                          " is not the slot's length " +
                                          std::to_string(kv_->length(ch.slot)));
        }
        if (ch.tokens.empty()) {
            return invalid_argument_error(where + ": no tokens");
        }
        const int64_t end = int64_t{ch.start_pos} + static_cast<int64_t>(ch.tokens.size());
        if (end > s.max_context) {
            return invalid_argument_error(where + ": positions " + std::to_string(ch.start_pos) +
                                          ".." + std::to_string(end - 1) +
                                          " go beyond the context of " +
                                          std::to_string(s.max_context) + " tokens");
        }
        for (TokenId t : ch.tokens) {
            if (t < 0 || t >= s.vocab_size) {
                return invalid_argument_error(where + ": token id " + std::to_string(t) +
                                              " is outside the vocabulary of " +
                                              std::to_string(s.vocab_size));
            }
        }
        growth.push_back(SlotGrowth{ch.slot, static_cast<int32_t>(end)});
        *total += static_cast<int64_t>(ch.tokens.size());
    }
    Status st = kv_->reserve(growth);
    if (!st.ok()) {
        *total = 0;
        return resource_exhausted_error("forward: " + st.message());
    }
    return ok_status();
}

Status PagedCausalLM::finish_load(const std::string& dir, const LoadOptions& options,
                                  const PagedModelShape& shape, ModelSpec* spec) {
    int64_t max_context = shape.max_position_embeddings;
    if (options.max_context > max_context) {
        EDGE_ASSIGN_OR_RETURN(ConfigJson config, ConfigJson::read(dir));
        return check_max_context(config, max_context, options.max_context);
    }
    if (options.max_context > 0) {
        max_context = options.max_context;
    }
    // The cache is reserved, not committed, so a budget beyond this machine's memory would load
    // (its block tables alone, ~50 bytes a block, take minutes to build for 2^44 bytes, with no
    // progress to show) and then fail only as the blocks fill: refused here, naming the setting.
    if (const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        options.kv_cache_bytes > 0 && pages > 0 && page > 0 &&
        options.kv_cache_bytes / page > pages) {
        return invalid_argument_error(
            dir + ": kv_cache_bytes " + std::to_string(options.kv_cache_bytes) +
            " is more than this machine's memory (" +
            std::to_string(static_cast<int64_t>(pages) * page) +
            " bytes); lower engine.kv_cache_bytes");
    }
    EDGE_RETURN_IF_ERROR(create_kv_cache(
        static_cast<int32_t>(shape.layers), static_cast<int32_t>(shape.kv_heads),
        static_cast<int32_t>(shape.head_dim), options.max_slots, static_cast<int32_t>(max_context),
        options.kv_block_tokens, options.kv_cache_bytes));
    spec->architecture = shape.architecture;
    spec->vocab_size = static_cast<int32_t>(shape.vocab_size);
    spec->max_context = static_cast<int32_t>(max_context);
    for (int64_t id : shape.eos_token_ids) {
        spec->eos_token_ids.push_back(static_cast<TokenId>(id));
    }
    spec->bos_token_id = static_cast<TokenId>(
        shape.bos_token_id >= 0 && shape.bos_token_id < shape.vocab_size ? shape.bos_token_id
                                                                         : -1);
    spec->version = shape.version;
    spec->weight_bytes = shape.weight_bytes;
    spec->kv_bytes_per_token = shape.kv_bytes_per_token;
    return ok_status();
}

void PagedCausalLM::commit_batch(std::span<const SequenceChunk> batch) {
    for (const SequenceChunk& ch : batch) {
        kv_->set_length(ch.slot, ch.start_pos + static_cast<int32_t>(ch.tokens.size()));
    }
}

int64_t PagedCausalLM::embed_batch(std::span<const SequenceChunk> batch, const Weight& embed,
                                   float* x) {
    int64_t n = 0;
    for (const SequenceChunk& ch : batch) {
        n += static_cast<int64_t>(ch.tokens.size());
    }
    tok_slot_.resize(static_cast<size_t>(n));
    tok_pos_.resize(static_cast<size_t>(n));
    int64_t i = 0;
    int64_t out_rows = 0;
    for (const SequenceChunk& ch : batch) {
        for (size_t j = 0; j < ch.tokens.size(); ++j, ++i) {
            tok_slot_[i] = ch.slot;
            tok_pos_[i] = ch.start_pos + static_cast<int32_t>(j);
            embedding_row(embed, ch.tokens[j], x + i * embed.cols);
        }
        out_rows += ch.all_logits ? static_cast<int64_t>(ch.tokens.size()) : 1;
    }
    return out_rows;
}

void PagedCausalLM::batch_logits(std::span<const SequenceChunk> batch, const float* x,
                                 std::span<const float> final_norm, float eps,
                                 const Weight& lm_head, int64_t out_rows, Backend& backend,
                                 std::vector<float>& h, std::vector<float>* logits) {
    const int64_t H = lm_head.cols;
    float* hn = grow(h, static_cast<size_t>(out_rows * H));
    int64_t row = 0;
    int64_t i = 0;
    for (const SequenceChunk& ch : batch) {
        const int64_t len = static_cast<int64_t>(ch.tokens.size());
        for (int64_t j = ch.all_logits ? 0 : len - 1; j < len; ++j, ++row) {
            cpu::rms_norm(x + (i + j) * H, final_norm.data(), H, eps, hn + row * H);
        }
        i += len;
    }
    logits->resize(static_cast<size_t>(out_rows * lm_head.rows));
    backend.matmul(lm_head, hn, out_rows, logits->data(), lm_head.rows);
}

void PagedCausalLM::for_each_host_task(int64_t n, const std::function<void(int64_t)>& body) {
    Backend* backend = host_backend();
    if (backend == nullptr || backend->threads() < 2 || n < 2) {
        CausalLM::for_each_host_task(n, body);
        return;
    }
    backend->for_each_task(n, [&](int64_t i, int) { body(i); });
}

}  // namespace edge::engine
