#pragma once

// `edgeserve quant-eval --model DIR --policies P1,P2,... [--text FILE] [--tokens N] [--chunk N]
// [--threads N] [--no-per-class]`: runs the unquantized model and the model under each
// quantization policy over the same text, teacher-forced in chunks of --chunk tokens (each chunk
// from position 0), and reports per policy: weight bytes, mean and p99 KL divergence of the
// next-token distribution against the unquantized model, top-1 agreement, perplexity and its
// ratio to the unquantized one, logit RMSE, and single-stream decode tokens/s. Then the same for
// each tensor class present in the model quantized alone, in each format the policies use. Prints
// a table, then one JSON line. Policies are separated by commas; inside one policy, `+` joins
// items (`experts-int4+attention=fp8`). The text defaults to DIR/eval.txt.
//
// Threading: free functions; loads one model at a time on the calling thread.

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"

namespace edge::engine {

struct QuantEvalOptions {
    std::string model_dir;              // Checkpoint directory (the baseline: as stored).
    std::vector<std::string> policies;  // Policy strings (parse_quant_policy syntax).
    std::string text_path;              // Text to score; empty: model_dir/eval.txt.
    std::vector<TokenId> token_ids;     // When non-empty, scored instead of the text.
    int64_t tokens = 512;               // Tokens scored (the text's first N).
    int64_t chunk = 256;                // Tokens per teacher-forced chunk (context length).
    int32_t threads = 0;                // Compute threads; 0: one per core.
    int32_t decode_steps = 32;          // Single-token steps timed for decode tokens/s; 0: none.
    bool per_class = true;              // Also each tensor class quantized alone.
};

struct QuantEvalRow {
    // The baseline's stored format ("bf16", "f16", "f32"; "as-stored" for a checkpoint with
    // quantized tensors), else the policy or "class=format".
    std::string label;
    std::string policy;        // Canonical policy string.
    int64_t weight_bytes = 0;  // Weights as held in memory.
    double mean_kl = 0.0;      // Mean KL(p_baseline || p_policy) over scored positions, nats.
    double p99_kl = 0.0;       // 99th percentile of the same.
    double top1 = 1.0;         // Fraction of positions whose argmax equals the baseline's.
    double perplexity = 0.0;   // exp(mean NLL of the next token) over the scored text.
    double ppl_ratio = 1.0;    // perplexity / baseline perplexity.
    double logit_rmse = 0.0;   // RMS difference of raw logits against the baseline.
    double decode_tps = 0.0;   // Single-stream decode tokens per second.
    int64_t positions = 0;     // Positions compared (KL, top-1, RMSE).
    int64_t scored = 0;        // Next tokens scored for the perplexity.
};

// Runs the evaluation; rows[0] is the baseline.
Result<std::vector<QuantEvalRow>> run_quant_eval(const QuantEvalOptions& options);

// Readable table (one row per line) and one-line JSON of the rows.
std::string quant_eval_table(const std::vector<QuantEvalRow>& rows);
std::string quant_eval_json(const std::vector<QuantEvalRow>& rows);

int quant_eval_main(int argc, char** argv);

}  // namespace edge::engine
