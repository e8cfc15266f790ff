#include "engine/sampling/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/cpu/ops.h"
#include "engine/tokenizer/utf8.h"

namespace edge::engine::sampling {

namespace {

Status out_of_range(const char* field, const std::string& rule) {
    return invalid_argument_error(std::string(field) + ": " + rule);
}

// Index order for sampling: higher value first, ties to the lower id.
struct ByValueDesc {
    std::span<const float> v;
    bool operator()(int32_t a, int32_t b) const { return v[a] != v[b] ? v[a] > v[b] : a < b; }
};

}  // namespace

Status validate_sampling_params(const SamplingParams& p) {
    if (!std::isfinite(p.temperature) || p.temperature < 0.0f || p.temperature > 2.0f) {
        return out_of_range("temperature", "must be in [0, 2]");
    }
    if (!std::isfinite(p.top_p) || p.top_p <= 0.0f || p.top_p > 1.0f) {
        return out_of_range("top_p", "must be in (0, 1]");
    }
    if (p.top_k < 0) {
        return out_of_range("top_k", "must be >= 0");
    }
    if (!std::isfinite(p.presence_penalty) || std::fabs(p.presence_penalty) > 2.0f) {
        return out_of_range("presence_penalty", "must be in [-2, 2]");
    }
    if (!std::isfinite(p.frequency_penalty) || std::fabs(p.frequency_penalty) > 2.0f) {
        return out_of_range("frequency_penalty", "must be in [-2, 2]");
    }
    if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.0f ||
        p.repetition_penalty > 2.0f) {
        return out_of_range("repetition_penalty", "must be in (0, 2]");
    }
    if (!std::isfinite(p.min_p) || p.min_p < 0.0f || p.min_p > 1.0f) {
        return out_of_range("min_p", "must be in [0, 1]");
    }
    if (p.max_tokens < 1) {
        return out_of_range("max_tokens", "must be >= 1");
    }
    if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) {
        return out_of_range("min_tokens", "must be in [0, max_tokens] ([0, " +
                                              std::to_string(p.max_tokens) + "] here)");
    }
    if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
        return out_of_range("top_logprobs", "must be in [0, 20]");
    }
    if (p.stop.size() > kMaxStopStrings) {
        return out_of_range("stop", "at most 16 stop strings");
    }
    if (p.stop_token_ids.size() > kMaxStopTokenIds) {
        return out_of_range("stop_token_ids",
                            "at most " + std::to_string(kMaxStopTokenIds) + " tokens");
    }
    for (TokenId id : p.stop_token_ids) {
        if (id < 0) {
            return out_of_range("stop_token_ids", "ids must be >= 0");
        }
    }
    if (p.logit_bias.size() > kMaxLogitBias) {
        return out_of_range("logit_bias", "at most 1024 tokens");
    }
    for (const auto& [id, bias] : p.logit_bias) {
        if (id < 0 || !std::isfinite(bias) || std::fabs(bias) > kMaxLogitBiasValue) {
            return invalid_argument_error("logit_bias: token " + std::to_string(id) +
                                          " needs an id >= 0 and a bias in [-100, 100]");
        }
    }
    for (size_t i = 0; i < p.stop.size(); ++i) {
        const std::string& s = p.stop[i];
        if (s.empty() || s.size() > kMaxStopBytes || !tokenizer::utf8_is_valid(s)) {
            return invalid_argument_error("stop[" + std::to_string(i) +
                                          "]: must be non-empty valid UTF-8 of at most 256 bytes");
        }
    }
    return ok_status();
}

void log_softmax(std::span<const float> logits, std::vector<float>* out) {
    out->resize(logits.size());
    if (logits.empty()) {
        return;
    }
    const float max = *std::max_element(logits.begin(), logits.end());
    const auto n = static_cast<int64_t>(logits.size());
    const float log_sum =
        static_cast<float>(std::log(cpu::exp_sum(logits.data(), n, max, out->data()))) + max;
    for (size_t i = 0; i < logits.size(); ++i) {
        (*out)[i] = logits[i] - log_sum;
    }
}

std::vector<TokenId> top_n(std::span<const float> values, int32_t n) {
    const size_t k = std::min(static_cast<size_t>(std::max(n, 0)), values.size());
    std::vector<TokenId> ids(values.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                      ByValueDesc{values});
    ids.resize(k);
    return ids;
}

Sampler::Sampler(const SamplingParams& params, uint64_t seed) : params_(params), rng_(seed) {}

void Sampler::set_context(std::span<const TokenId> prompt, std::span<const TokenId> eos_ids) {
    if (params_.repetition_penalty != 1.0f) {
        prompt_ids_.insert(prompt.begin(), prompt.end());
    }
    if (params_.min_tokens > 0) {
        eos_ids_.assign(eos_ids.begin(), eos_ids.end());
        eos_ids_.insert(eos_ids_.end(), params_.stop_token_ids.begin(),
                        params_.stop_token_ids.end());
    }
}

void Sampler::apply_penalties(std::span<float> logits) const {
    auto in_vocab = [&](TokenId id) { return id >= 0 && static_cast<size_t>(id) < logits.size(); };
    for (const auto& [id, bias] : params_.logit_bias) {
        if (in_vocab(id)) {
            logits[id] += bias;
        }
    }
    if (params_.repetition_penalty != 1.0f) {
        // Once per distinct token of the prompt and the output, as Hugging Face's and vLLM's.
        const float r = params_.repetition_penalty;
        auto penalise = [&](TokenId id) {
            float& x = logits[id];
            x = x > 0.0f ? x / r : x * r;
        };
        for (TokenId id : prompt_ids_) {
            if (in_vocab(id)) {
                penalise(id);
            }
        }
        for (const auto& [id, n] : counts_) {
            if (in_vocab(id) && !prompt_ids_.contains(id)) {
                penalise(id);
            }
        }
    }
    if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
        for (const auto& [id, n] : counts_) {
            if (in_vocab(id) && n > 0) {
                logits[id] -=
                    params_.presence_penalty + params_.frequency_penalty * static_cast<float>(n);
            }
        }
    }
    if (generated_ < params_.min_tokens) {
        for (TokenId id : eos_ids_) {
            if (in_vocab(id)) {
                logits[id] = -std::numeric_limits<float>::infinity();
            }
        }
    }
}

double Sampler::gather_candidates(int32_t at_least, double mass_wanted) {
    // An id at least `cut` times as likely as the likeliest comes before every id that is not,
    // so once the ids above a cut are enough, the k best or the nucleus are among them: cuts of
    // 1/1024, 1/65536, ... scan the probabilities instead of ordering the whole vocabulary
    // (sorting 150k ids took 15 ms a token; a few hundred usually hold the mass).
    const auto vocab = static_cast<int32_t>(probs_.size());
    for (float cut = kFirstCandidateCut;; cut *= kCandidateCutStep) {
        if (cut < kLastCandidateCut) {
            cut = 0.0f;  // Every id.
        }
        order_.clear();
        double mass = 0.0;
        for (int32_t id = 0; id < vocab; ++id) {
            const float p = probs_[static_cast<size_t>(id)];
            if (p >= cut) {
                order_.push_back(id);
                mass += p;
            }
        }
        if ((static_cast<int32_t>(order_.size()) >= at_least && mass >= mass_wanted) ||
            cut == 0.0f) {
            return mass;
        }
    }
}

double Sampler::mass_of(int32_t from, int32_t to) const {
    double mass = 0.0;
    for (int32_t i = from; i < to; ++i) {
        mass += probs_[static_cast<size_t>(order_[static_cast<size_t>(i)])];
    }
    return mass;
}

int32_t Sampler::nucleus(std::span<const float> scaled, double mass_wanted, int32_t count,
                         double* mass) {
    // A radix selection: probabilities are non-negative floats, whose bit patterns order as their
    // values. Level by level (the top 12 bits: sign, exponent and 3 mantissa bits; the next 12;
    // the last 8), the undecided candidates' mass is summed by digit; those of digits above the
    // one where the mass wanted is reached are in, those below it out, and those of that digit
    // go on. What is left after the last level is one value, taken by id until the mass is
    // reached. Two or three passes over the candidates instead of ordering them (a flat
    // distribution's nucleus is most of the vocabulary).
    struct Level {
        int shift;
        uint32_t digits;
    };
    static constexpr Level kLevels[] = {{20, 4096}, {8, 4096}, {0, 256}};
    std::array<double, 4096> by_digit;
    undecided_.assign(order_.begin(), order_.begin() + count);
    int32_t kept = 0;
    double before = 0.0;  // The mass of order_[0, kept).
    auto bits = [&](int32_t id) {
        return std::bit_cast<uint32_t>(probs_[static_cast<size_t>(id)]);
    };
    for (const Level& level : kLevels) {
        auto digit = [&](int32_t id) { return (bits(id) >> level.shift) & (level.digits - 1); };
        std::fill_n(by_digit.begin(), level.digits, 0.0);
        for (const int32_t id : undecided_) {
            by_digit[digit(id)] += probs_[static_cast<size_t>(id)];
        }
        // The digit where the mass wanted is reached, from the top (none: rounding kept the
        // total just short, and every candidate is in).
        int64_t edge = static_cast<int64_t>(level.digits) - 1;
        double above = before;
        while (edge >= 0 && above + by_digit[static_cast<size_t>(edge)] < mass_wanted) {
            above += by_digit[static_cast<size_t>(edge)];
            --edge;
        }
        // Those above the edge to order_, those at it kept (in id order still), with no branch
        // per id: each is written to both, and each cursor moves on for its own.
        size_t next = 0;
        for (const int32_t id : undecided_) {
            const auto d = static_cast<int64_t>(digit(id));
            order_[static_cast<size_t>(kept)] = id;
            kept += d > edge ? 1 : 0;
            undecided_[next] = id;
            next += d == edge ? 1 : 0;
        }
        undecided_.resize(next);
        before = above;
    }
    for (const int32_t id : undecided_) {
        if (before >= mass_wanted) {
            break;
        }
        order_[static_cast<size_t>(kept++)] = id;
        before += probs_[static_cast<size_t>(id)];
    }
    if (kept <= kSortedNucleus) {
        std::sort(order_.begin(), order_.begin() + kept, ByValueDesc{scaled});
    }
    *mass = before;
    return kept;
}

TokenId Sampler::draw(std::span<const float> scaled) {
    const auto vocab = static_cast<int32_t>(scaled.size());
    cut_made_ = false;
    const float max = *std::max_element(scaled.begin(), scaled.end());
    if (max == -std::numeric_limits<float>::infinity()) {
        return -1;  // Every token is out (a filter refused them all).
    }
    if (max == std::numeric_limits<float>::infinity()) {
        // Softmax's limit puts all the mass on the infinite ones: the first of them. (Their
        // probabilities would be inf - inf, NaN, and no walk below would find a token.)
        return static_cast<TokenId>(std::find(scaled.begin(), scaled.end(), max) -
                                    scaled.begin());
    }
    // Unnormalised probabilities of every id, by id (0 for the ones filtered out), and their
    // total summed in f64 like the cuts' masses below: in f32, ids under 6e-8 of the likeliest
    // were rounded out of it, and the walk, scaled by a short total, never reached the last ids.
    probs_.resize(static_cast<size_t>(vocab));
    double total_all = cpu::exp_sum(scaled.data(), vocab, max, probs_.data());
    if (params_.min_p > 0.0f) {
        // Min-p: less likely than min_p times the likeliest id still allowed is out (after a
        // response format's refusals, as vLLM masks first), before top-k and top-p.
        // Without a branch per id (a flat distribution mispredicts half of them): the bits of
        // an id below the cut are masked to 0. Four partial sums, not one chain of adds.
        const float cut = params_.min_p;
        auto keep = [cut](float& p) {
            p = std::bit_cast<float>(std::bit_cast<uint32_t>(p) &
                                     (0u - static_cast<uint32_t>(p >= cut)));
            return p;
        };
        std::array<double, 4> part{};
        const size_t n = probs_.size();
        size_t i = 0;
        for (; i + 4 <= n; i += 4) {
            for (size_t j = 0; j < 4; ++j) {
                part[j] += keep(probs_[i + j]);
            }
        }
        for (; i < n; ++i) {
            part[0] += keep(probs_[i]);
        }
        total_all = (part[0] + part[1]) + (part[2] + part[3]);
    }
    const bool cut_k = params_.top_k > 0 && params_.top_k < vocab;
    const bool cut_p = params_.top_p < 1.0f;
    const bool ordered = cut_k || cut_p;
    // The ids the draw walks, best first, when a cut keeps some: order_[0, kept).
    int32_t kept = vocab;
    double total = total_all;
    if (ordered) {
        if (cut_k) {
            gather_candidates(params_.top_k, 0.0);
            kept = params_.top_k;
            std::partial_sort(order_.begin(), order_.begin() + kept, order_.end(),
                              ByValueDesc{scaled});
            if (keep_top_k_) {
                top_k_ids_.assign(order_.begin(), order_.begin() + kept);  // Top-p reorders them.
            }
        } else {
            gather_candidates(0, params_.top_p * total_all);
            kept = static_cast<int32_t>(order_.size());
        }
        if (cut_p) {
            // The fewest best ids whose mass reaches top_p of the kept mass.
            kept =
                nucleus(scaled, params_.top_p * (cut_k ? mass_of(kept) : total_all), kept, &total);
        } else {
            total = mass_of(kept);
        }
    }
    cut_made_ = true;
    auto id_at = [&](int32_t i) { return ordered ? order_[static_cast<size_t>(i)] : i; };
    // 53 random bits -> u in [0, 1); the walk below is deterministic for a given seed.
    const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0);
    double target = u * total;
    // The target crosses zero only at a token of nonzero mass, so the ones min-p left at 0 need
    // no test of their own (a branch per token that a flat distribution mispredicts).
    for (int32_t i = 0; i < kept; ++i) {
        target -= probs_[static_cast<size_t>(id_at(i))];
        if (target < 0.0) {
            return id_at(i);
        }
    }
    // Rounding left a sliver past the end: the last token that can be drawn.
    int32_t last = kept - 1;
    while (last > 0 && probs_[static_cast<size_t>(id_at(last))] == 0.0f) {
        --last;
    }
    return id_at(last);
}

bool Sampler::cut_allowed(const TokenFilter& filter, bool top_k) const {
    if (!cut_made_) {
        return false;
    }
    auto allowed = [&](int32_t id) {
        // An id of no mass could not be drawn, whether refused or not.
        return probs_[static_cast<size_t>(id)] == 0.0f || filter(id);
    };
    if (top_k) {
        return std::all_of(top_k_ids_.begin(), top_k_ids_.end(), allowed);
    }
    for (int32_t id = 0; id < static_cast<int32_t>(probs_.size()); ++id) {
        if (!allowed(id)) {
            return false;
        }
    }
    return true;
}

TokenId Sampler::draw_allowed(std::span<float> logits, const TokenFilter& filter) {
    const bool top_k = params_.top_k > 0 && params_.top_k < static_cast<int32_t>(logits.size());
    if (top_k || params_.top_p >= 1.0f) {
        // Min-p, then top-k, then top-p within the k: when every id that min-p and top-k keep
        // is allowed, the refused ones out would leave the same (the likeliest is among them, so
        // min-p's bar stays, and the k best are the k best allowed, of the same mass for top-p),
        // and this draw is the one to keep. Cheap when the model wants allowed tokens: k ids
        // asked, not the vocabulary.
        keep_top_k_ = top_k;
        const TokenId id = draw(logits);
        keep_top_k_ = false;
        if (id < 0 || (filter(id) && cut_allowed(filter, top_k))) {
            return id;
        }
    }
    // Top-p without top-k measures the nucleus against the allowed ids' whole mass, which only
    // asking about every id tells; and a refused id among those kept changes the cut: every
    // refused id out, then one draw.
    constexpr float kOut = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < logits.size(); ++i) {
        if (logits[i] != kOut && !filter(static_cast<TokenId>(i))) {
            logits[i] = kOut;
        }
    }
    return draw(logits);
}

TokenId Sampler::choose(std::span<float> logits, bool greedy) {
    if (!greedy) {
        return draw(logits);
    }
    // Strictly greater keeps the first (lowest) id among equal maxima.
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return logits[best] == -std::numeric_limits<float>::infinity() ? -1
                                                                    : static_cast<TokenId>(best);
}

SampledToken Sampler::sample(std::span<float> logits, const TokenFilter* filter) {
    // Log-probabilities are the model's own, taken before penalties and temperature change the
    // logits (as OpenAI and vLLM report them), so they do not depend on the sampling knobs.
    std::vector<float> lp;
    const bool want_logprobs = params_.logprobs || params_.top_logprobs > 0;
    if (want_logprobs) {
        log_softmax(logits, &lp);
    }
    apply_penalties(logits);
    const bool greedy = params_.temperature < kGreedyTemperature;
    if (!greedy && params_.temperature != 1.0f) {
        const float inv = 1.0f / params_.temperature;
        for (float& x : logits) {
            x *= inv;
        }
    }
    const auto vocab = static_cast<int32_t>(logits.size());
    const bool cut = params_.min_p > 0.0f || params_.top_p < 1.0f ||
                     (params_.top_k > 0 && params_.top_k < vocab);
    SampledToken out;
    if (filter != nullptr && !greedy && cut) {
        // A cut draws from the allowed ids as if the refused ones had never had any probability
        // (vLLM masks before it cuts): redrawing after a refusal would not, as the first draw came
        // from the cut of every id (top_k 2 over a refused 0.5, 0.3 and 0.2 drew the 0.3 three
        // times in four, not 0.6 of the time).
        out.id = draw_allowed(logits, *filter);
    } else {
        out.id = choose(logits, greedy);
    }
    if (filter != nullptr && (greedy || !cut)) {
        // Refused candidates are taken out one at a time while that is cheap (the model mostly
        // wants an allowed token), then every token is asked once. Without a cut, a draw again
        // from the rest is a draw from the allowed ids alone.
        constexpr int kOneByOne = 8;
        constexpr float kOut = -std::numeric_limits<float>::infinity();
        for (int refused = 0; out.id >= 0 && !(*filter)(out.id); ++refused) {
            logits[static_cast<size_t>(out.id)] = kOut;
            if (refused == kOneByOne) {
                for (size_t i = 0; i < logits.size(); ++i) {
                    if (logits[i] != kOut && !(*filter)(static_cast<TokenId>(i))) {
                        logits[i] = kOut;
                    }
                }
            }
            out.id = choose(logits, greedy);
        }
    }
    if (out.id < 0) {
        // Nothing left to choose (every logit -inf, or every token refused): no token to count
        // for the penalties and min_tokens, and no logprob to look up. The scheduler ends the
        // sequence with an error on the -1.
        return out;
    }
    ++counts_[out.id];
    ++generated_;
    if (want_logprobs) {
        out.logprob = lp[out.id];
        for (TokenId id : top_n(lp, params_.top_logprobs)) {
            out.top.emplace_back(id, lp[id]);
        }
    }
    return out;
}

}  // namespace edge::engine::sampling
