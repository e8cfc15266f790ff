#pragma once

// Sampler picks the next token of one sequence from the model's logits, as the request's
// SamplingParams say: logit_bias, presence/frequency penalties over the tokens generated so far,
// the repetition penalty over the prompt and those tokens, end-of-sequence tokens banned before
// min_tokens, then greedy (temperature below kGreedyTemperature: highest logit, ties to the lowest
// id) or temperature scaling, min-p, top-k, top-p (vLLM's order) and a draw from a seeded
// std::mt19937_64 (same seed, same logits -> same tokens). It also reports the log-probability
// of the chosen token and the top alternatives: the log-softmax of the model's own logits, before
// penalties and temperature, as OpenAI and vLLM report them.
//
// Threading: one Sampler per sequence, used by one thread at a time (the scheduler's).

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "engine/generator.h"

namespace edge::engine::sampling {

// Temperatures below this sample greedily: the scaled distribution is an argmax to float
// precision, and dividing by a smaller one could overflow the logits (vLLM uses the same bound).
inline constexpr float kGreedyTemperature = 1e-5f;
// Largest top_logprobs a request may ask for (as OpenAI).
inline constexpr int32_t kMaxTopLogprobs = 20;
// Stop strings per request at most, and bytes per stop string at most; stop token ids at most.
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopTokenIds = 64;
inline constexpr size_t kMaxStopBytes = 256;
// logit_bias entries per request at most, and the largest bias either way.
inline constexpr size_t kMaxLogitBias = 1024;
inline constexpr float kMaxLogitBiasValue = 100.0f;
// Top-k and top-p order only the ids above a cut of the likeliest's probability: this one first,
// then each time this step lower while too few remain, every id below the last.
inline constexpr float kFirstCandidateCut = 1.0f / 1024;
inline constexpr float kCandidateCutStep = 1.0f / 64;
inline constexpr float kLastCandidateCut = 1e-30f;
// A top-p nucleus of at most this many ids is walked in value order, as a full sort would walk
// it; a larger one (a flat distribution's) in the order its selection leaves.
inline constexpr int32_t kSortedNucleus = 4096;

// kInvalidArgument naming the field when a value is out of range (temperature in [0, 2], top_p in
// (0, 1], top_k >= 0, penalties in [-2, 2], repetition_penalty in (0, 2], min_p in [0, 1],
// max_tokens >= 1, min_tokens in [0, max_tokens], top_logprobs in [0, 20], stop
// strings non-empty valid UTF-8 within the limits above, logit_bias ids >= 0 with biases in
// [-100, 100]; the caller checks the ids against the vocabulary).
Status validate_sampling_params(const SamplingParams& params);

// Whether a candidate token may be chosen now (a response format's constraint).
using TokenFilter = std::function<bool(TokenId)>;

struct SampledToken {
    TokenId id = 0;  // -1: no token could be chosen (a filter refused every one).
    float logprob = 0.0f;                        // Set when logprobs were asked for.
    std::vector<std::pair<TokenId, float>> top;  // Best first, ties to the lower id.
};

class Sampler {
public:
    Sampler(const SamplingParams& params, uint64_t seed);

    // The prompt (for the repetition penalty) and the model's end-of-sequence ids (banned before
    // min_tokens, with the request's stop_token_ids); kept only when those are set. Call before
    // the first sample().
    void set_context(std::span<const TokenId> prompt, std::span<const TokenId> eos_ids);

    // Chooses a token from `logits` (vocab_size floats; overwritten with the processed values)
    // and counts it for the penalties of later steps. With `filter`, only a token it allows,
    // as if the refused tokens had never had any probability (top-k, top-p and min-p cut among
    // the allowed ones, as vLLM masks first): the best (greedy) or the draw is asked first, and
    // a refused one is taken out and the choice made again from the rest; after a few refusals,
    // or under top-p without top-k, or a cut that kept a refused token, every token is asked at
    // once. Logprobs stay the model's own.
    SampledToken sample(std::span<float> logits, const TokenFilter* filter = nullptr);

private:
    void apply_penalties(std::span<float> logits) const;
    TokenId draw(std::span<const float> scaled);
    // Puts into order_, by id, the ids whose probs_ (relative to the likeliest) reach the highest
    // cut that leaves at least `at_least` ids holding at least `mass_wanted`, and returns their
    // mass: every better id is among them.
    double gather_candidates(int32_t at_least, double mass_wanted);
    // With candidates in order_[0, count): moves the fewest best of them whose mass reaches
    // `mass_wanted` (ties to the lower id) to the front, returns how many, and sets *mass to
    // theirs. In value order up to kSortedNucleus of them (the draw may walk them in any fixed
    // order: each is drawn in proportion to its mass).
    int32_t nucleus(std::span<const float> scaled, double mass_wanted, int32_t count, double* mass);
    // The mass of order_[from, to) (of order_[0, to)).
    double mass_of(int32_t from, int32_t to) const;
    double mass_of(int32_t to) const { return mass_of(0, to); }
    // Greedy or drawn from the processed logits; -1 when none is left.
    TokenId choose(std::span<float> logits, bool greedy);
    // Drawn under a cut (top-k, top-p or min-p) from the ids `filter` allows only, the cut made
    // over them alone; refused ids' logits set to -inf when it has to ask about every id.
    TokenId draw_allowed(std::span<float> logits, const TokenFilter& filter);
    // Whether `filter` allows every id of nonzero mass that the last draw()'s min-p and top-k
    // kept: top_k_ids_ under top-k, else every id (min-p alone). False when it made no cut.
    bool cut_allowed(const TokenFilter& filter, bool top_k) const;

    SamplingParams params_;
    std::mt19937_64 rng_;
    std::unordered_map<TokenId, int32_t> counts_;  // Generated tokens, by id.
    int32_t generated_ = 0;
    std::unordered_set<TokenId> prompt_ids_;  // repetition_penalty != 1 only.
    std::vector<TokenId> eos_ids_;            // min_tokens > 0 only.
    std::vector<int32_t> order_;  // Scratch for top-k / top-p.
    std::vector<int32_t> undecided_;  // Scratch for top-p: candidates at the nucleus's edge.
    std::vector<float> probs_;    // Scratch: e^(scaled - max) by id.
    // The last draw() made its cuts (not an infinite logit's shortcut), and its k best ids, by
    // value, when keep_top_k_ asked for them (draw_allowed()).
    bool cut_made_ = false;
    bool keep_top_k_ = false;
    std::vector<int32_t> top_k_ids_;
};

// log-softmax of `logits` into `out` (same size).
void log_softmax(std::span<const float> logits, std::vector<float>* out);

// Ids of the `n` largest values, largest first, ties to the lower id.
std::vector<TokenId> top_n(std::span<const float> values, int32_t n);

}  // namespace edge::engine::sampling
