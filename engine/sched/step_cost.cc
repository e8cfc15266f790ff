#include "engine/sched/step_cost.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace edge::engine::sched {
namespace {

using Vec = std::array<double, 3>;
using Mat = std::array<double, 9>;

// Added to the normal matrix's diagonal, relative to it (and, for a term that was always 0,
// relative to the weight): keeps the inverse finite when the inputs do not vary, where a term's
// spread comes out tiny (and its figures untrusted) instead of undefined.
constexpr double kRidge = 1e-9;

constexpr unsigned kAllTerms = 0b111;

double dot(const Vec& u, const Vec& v) { return u[0] * v[0] + u[1] * v[1] + u[2] * v[2]; }

Vec times(const Mat& m, const Vec& v) {
    return {m[0] * v[0] + m[1] * v[1] + m[2] * v[2], m[3] * v[0] + m[4] * v[1] + m[5] * v[2],
            m[6] * v[0] + m[7] * v[1] + m[8] * v[2]};
}

// The inverse of the regularized normal matrix restricted to the terms in `mask` (bit i: term i
// is free), zero in the rows and columns of the others; false when singular.
bool invert(const Mat& s, unsigned mask, Mat* inverse) {
    Mat m{};
    Mat inv{};
    for (int i = 0; i < 3; ++i) {
        inv[i * 3 + i] = 1.0;
        if ((mask >> i & 1u) == 0) {
            m[i * 3 + i] = 1.0;  // A held term: an identity block, dropped below.
            continue;
        }
        for (int j = 0; j < 3; ++j) {
            if ((mask >> j & 1u) != 0) {
                m[i * 3 + j] = s[i * 3 + j];
            }
        }
        m[i * 3 + i] += kRidge * std::max(s[i * 3 + i], s[0]);
    }
    // Gauss-Jordan with partial pivoting.
    for (int col = 0; col < 3; ++col) {
        int pivot = col;
        for (int row = col + 1; row < 3; ++row) {
            if (std::abs(m[row * 3 + col]) > std::abs(m[pivot * 3 + col])) {
                pivot = row;
            }
        }
        const double p = m[pivot * 3 + col];
        if (!(std::abs(p) > 0.0) || !std::isfinite(p)) {
            return false;
        }
        if (pivot != col) {
            for (int j = 0; j < 3; ++j) {
                std::swap(m[pivot * 3 + j], m[col * 3 + j]);
                std::swap(inv[pivot * 3 + j], inv[col * 3 + j]);
            }
        }
        for (int j = 0; j < 3; ++j) {
            m[col * 3 + j] /= p;
            inv[col * 3 + j] /= p;
        }
        for (int row = 0; row < 3; ++row) {
            const double f = m[row * 3 + col];
            if (row == col || f == 0.0) {
                continue;
            }
            for (int j = 0; j < 3; ++j) {
                m[row * 3 + j] -= f * m[col * 3 + j];
                inv[row * 3 + j] -= f * inv[col * 3 + j];
            }
        }
    }
    for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
            if ((mask >> i & 1u) == 0 || (mask >> j & 1u) == 0) {
                inv[i * 3 + j] = 0.0;
            }
        }
    }
    for (double v : inv) {
        if (!std::isfinite(v)) {
            return false;
        }
    }
    *inverse = inv;
    return true;
}

}  // namespace

void StepCost::observe(int64_t prefill_tokens, int64_t decode_tokens, double seconds) {
    if (!(seconds > 0.0) || !(seconds <= kMaxSeconds) || prefill_tokens < 0 || decode_tokens < 0 ||
        prefill_tokens + decode_tokens == 0) {
        return;
    }
    const Vec x{1.0, static_cast<double>(prefill_tokens), static_cast<double>(decode_tokens)};
    // A stall (a page fault storm, a first step that warms up, another process on the device)
    // would otherwise pull the fit for as long as it is remembered; a real change of speed still
    // moves it, kClip at a time, and once the fit no longer predicts well, whole.
    const double predicted = trusted_prediction(x);
    if (predicted > 0.0) {
        seconds = std::clamp(seconds, predicted / kClip, predicted * kClip);
    }
    for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
            s_[i * 3 + j] = kForget * s_[i * 3 + j] + x[i] * x[j];
        }
        r_[i] = kForget * r_[i] + x[i] * seconds;
    }
    yy_ = kForget * yy_ + seconds * seconds;
    prefill_weight_ = kForget * prefill_weight_ + (prefill_tokens > 0 ? 1.0 : 0.0);
    refit(decode_tokens);
}

void StepCost::refit(int64_t decode_tokens) {
    const double weight = s_[0];
    fitted_ = invert(s_, kAllTerms, &inverse_);
    if (!fitted_) {
        return;
    }
    // The weighted squared error of a fit, from the sums (no step is kept).
    auto squared_error = [&](const Vec& t) {
        return std::max(yy_ - 2.0 * dot(t, r_) + dot(t, times(s_, t)), 0.0);
    };
    theta_ = times(inverse_, r_);
    if (theta_[0] < 0.0 || theta_[1] < 0.0 || theta_[2] < 0.0) {
        // A term fitted below 0 (collinear inputs, noise): the best fit with some terms held at
        // 0, of the seven ways to hold them. The intercept alone is always one (times are > 0).
        double best = std::numeric_limits<double>::infinity();
        Vec chosen{};
        for (unsigned mask = 1; mask < kAllTerms; ++mask) {
            Mat inv;
            if (!invert(s_, mask, &inv)) {
                continue;
            }
            const Vec t = times(inv, r_);
            if (t[0] < 0.0 || t[1] < 0.0 || t[2] < 0.0) {
                continue;
            }
            const double e = squared_error(t);
            if (e < best) {
                best = e;
                chosen = t;
            }
        }
        theta_ = chosen;
    }
    const double mean = r_[0] / weight;
    noise_ = std::max(squared_error(theta_) / weight, kMinNoise * kMinNoise * mean * mean);
    // 1 / b once b is told apart: enough steps, several of them prefilling, prefill tokens that
    // vary beyond what the intercept and the decode tokens explain (the inverse's diagonal is
    // 1 / (weight x that variance)), and a standard error within bounds.
    const double b = theta_[1];
    const double spread = inverse_[4] > 0.0 ? 1.0 / (weight * inverse_[4]) : 0.0;
    if (weight >= kMinWeight && prefill_weight_ >= kMinPrefillWeight && b > 0.0 &&
        spread >= kMinPrefillSpread * kMinPrefillSpread &&
        std::sqrt(noise_ * inverse_[4]) <= kMaxRelativeError * b) {
        prefill_tokens_per_s_ = std::min(1.0 / b, kMaxTokensPerS);
    }
    // A decode-only step of this batch is predicted well: a and c hold for it. (Each alone may
    // not be known, when the batch never changes; at that batch their sum is.)
    if (decode_tokens > 0 &&
        trusted_prediction({1.0, 0.0, static_cast<double>(decode_tokens)}) > 0.0) {
        decode_a_ = theta_[0];
        decode_c_ = theta_[2];
    }
}

double StepCost::trusted_prediction(const Vec& x) const {
    if (!fitted_ || s_[0] < kMinWeight) {
        return 0.0;
    }
    const double seconds = dot(theta_, x);
    // The unconstrained fit's variance there: a point the steps seen do not reach (a decode-only
    // step when every step prefilled as much as it decoded less) has a huge one.
    const double variance = noise_ * dot(x, times(inverse_, x));
    if (!(seconds > 0.0) || !std::isfinite(seconds) || !(variance >= 0.0) ||
        std::sqrt(variance) > kMaxRelativeError * seconds) {
        return 0.0;
    }
    return seconds;
}

double StepCost::decode_tokens_per_s(int64_t sequences) const {
    const double seconds = decode_a_ + decode_c_ * static_cast<double>(sequences);
    if (sequences <= 0 || !(seconds > 0.0)) {
        return 0.0;
    }
    return std::min(static_cast<double>(sequences) / seconds, kMaxTokensPerS);
}

}  // namespace edge::engine::sched
