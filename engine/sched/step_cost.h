#pragma once

// StepCost: an online fit of how long an engine step takes for the work it does,
//
//   seconds ~= a + b * prefill_tokens + c * decode_tokens,
//
// by least squares with exponential forgetting (each step's weight decays by kForget a step, so
// the fit follows a pool whose speed changes), a, b, c >= 0. From it come the two speeds a pool
// advertises for routing: prefill at the marginal cost of a prompt token (1 / b), and decode as
// what a decode-only step of n sequences would give (n / (a + c * n)). Unlike rates taken from
// whole steps, neither needs steps of one kind: under sustained mixed load (every step decodes
// some sequences and prefills a chunk of others) both stay current, and a decode rate is not
// lowered by the prefill that shared its steps.
//
// A figure is given only once the inputs varied enough to tell the terms apart and the fit
// predicts it to kMaxRelativeError (its standard error, the residuals taken as at least
// kMinNoise of a step's time), else 0, and the caller keeps its own estimate: all steps alike (one
// prompt chunk beside one batch size), prefill and decode tokens that always sum to the step
// budget, a step time that does not depend on the work (a fake clock). Once given, a figure is
// held while the fit cannot tell it (a spell of decode-only steps says nothing of b; a change of
// speed leaves residuals too large to trust until it is forgotten). Steps with no time,
// no tokens, or a time that is not finite or past kMaxSeconds are ignored; a step far from a
// trusted fit's prediction (a stall, a first step that warms up) counts as kClip times or
// 1 / kClip times that prediction.
// An attention term (the positions a step attends to) is left out: the advertised figures are for
// a prompt and a batch of unknown contexts, and under steady load it moves with the decode count.
//
// Each observe() costs a few hundred flops and allocates nothing. Not thread-safe: one writer
// (the scheduler's thread), whose caller publishes the figures.

#include <array>
#include <cstdint>

namespace edge::engine::sched {

class StepCost {
public:
    // Per-step decay of the past steps' weight: about 1 / (1 - kForget) = 50 steps of memory.
    static constexpr double kForget = 0.98;
    // Weight (about the number of steps) the fit needs before any figure is given.
    static constexpr double kMinWeight = 8.0;
    // Weight of the steps that prefilled (about how many) that 1 / b needs: one prefill among
    // decode-only steps fits b exactly whatever its time, and a first step slowed by warming up
    // (page faults on the weights) would be told as the pool's speed, with no trusted fit yet to
    // clip it.
    static constexpr double kMinPrefillWeight = 4.0;
    // Spread of prefill tokens, beyond what the other terms explain, that 1 / b needs (tokens,
    // weighted standard deviation).
    static constexpr double kMinPrefillSpread = 16.0;
    // Largest standard error of a figure (b; a decode step's predicted time), relative to it.
    static constexpr double kMaxRelativeError = 0.05;
    // Timing noise assumed at least, relative to the mean step time: a fit that matches exactly
    // (synthetic or coarse times) is no more certain than this.
    static constexpr double kMinNoise = 0.01;
    // An observed time beyond kClip times a trusted prediction (or below 1 / kClip) is clipped.
    static constexpr double kClip = 2.0;
    // Longest step time taken, seconds: beyond it, a clock that jumped, not a step.
    static constexpr double kMaxSeconds = 3600.0;
    // Largest speed given, tokens/s (as gossip carries at most: routing/membership/site_state.cc).
    static constexpr double kMaxTokensPerS = 1e9;

    // A step that computed `prefill_tokens` prompt tokens and `decode_tokens` generated ones in
    // `seconds`.
    void observe(int64_t prefill_tokens, int64_t decode_tokens, double seconds);

    // Prompt tokens/s at the marginal cost of a prompt token (1 / b); 0 while not known.
    double prefill_tokens_per_s() const { return prefill_tokens_per_s_; }
    // Tokens/s that a step decoding `sequences` sequences and prefilling nothing would give, all
    // sequences together (sequences / (a + c * sequences), a and c of the last fit trusted at the
    // batch it saw: meant for about that many sequences); 0 while not known.
    double decode_tokens_per_s(int64_t sequences) const;

    // The fit (seconds; seconds per token), for tests and logs; all 0 before the first step.
    double a() const { return theta_[0]; }
    double b() const { return theta_[1]; }
    double c() const { return theta_[2]; }

private:
    using Vec = std::array<double, 3>;
    using Mat = std::array<double, 9>;  // Row-major 3 x 3.

    // The least-squares fit under a, b, c >= 0, its residual variance, and the figures it tells
    // now (decode: at a step of the `decode_tokens` just observed).
    void refit(int64_t decode_tokens);
    // Step time predicted at x when its standard error is within kMaxRelativeError; 0 otherwise
    // (too few steps, or x beyond what the steps seen tell apart).
    double trusted_prediction(const Vec& x) const;

    Mat s_{};        // Weighted sum of x x^T, x = (1, prefill_tokens, decode_tokens).
    Vec r_{};        // Weighted sum of x * seconds.
    double yy_ = 0;  // Weighted sum of seconds^2.
    double prefill_weight_ = 0;  // Weighted count of the steps that prefilled.
    Vec theta_{};    // (a, b, c).
    // Inverse of the (regularized) normal matrix: the unconstrained fit's covariance over the
    // residual variance, an upper bound on the constrained one's.
    Mat inverse_{};
    double noise_ = 0;  // Residual variance (seconds^2), at least (kMinNoise * mean)^2.
    bool fitted_ = false;
    // The last trusted 1 / b, and a and c of the last fit that predicted a decode-only step of
    // the batch it saw to kMaxRelativeError: held while the fit cannot tell them, since how fast
    // the pool computes does not change with what it serves.
    double prefill_tokens_per_s_ = 0;
    double decode_a_ = 0;
    double decode_c_ = 0;
};

}  // namespace edge::engine::sched
