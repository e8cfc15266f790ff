#include "routing/selection/selector.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace edge::routing::selection {

std::string_view rejection_name(Rejection r) {
    switch (r) {
        case Rejection::kNone:
            return "none";
        case Rejection::kNoPoolServesModel:
            return "no_pool_serves_model";
        case Rejection::kVersionPinUnmatched:
            return "version_pin_unmatched";
        case Rejection::kAllSaturated:
            return "all_saturated";
    }
    return "unknown";
}

std::string_view rejection_message(Rejection r) {
    switch (r) {
        case Rejection::kNone:
            return "";
        case Rejection::kNoPoolServesModel:
            return "no pool in the cluster serves this model";
        case Rejection::kVersionPinUnmatched:
            return "no serving pool has the pinned model version";
        case Rejection::kAllSaturated:
            return "every pool serving this model is saturated";
    }
    return "unknown";
}

std::string_view choice_reason_name(ChoiceReason r) {
    switch (r) {
        case ChoiceReason::kNone:
            return "none";
        case ChoiceReason::kOnlyCandidate:
            return "only_candidate_within_margin";
        case ChoiceReason::kLocalHysteresis:
            return "local_within_hysteresis";
        case ChoiceReason::kPowerOfTwo:
            return "power_of_two_choices";
    }
    return "unknown";
}

namespace {

// Uniform in [0, n) without division (Lemire's multiply-shift; bias is below 2^-50 here).
size_t pick(std::mt19937_64& rng, size_t n) {
    return static_cast<size_t>((static_cast<unsigned __int128>(rng()) * n) >> 64);
}

// Uniform in [0, 1) with the 53 bits a double holds.
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

bool usable(const RouteCandidate& c, std::string_view pin) {
    return c.state == membership::PoolState::kServing && c.reachable && !c.cost.saturated &&
           (pin.empty() || c.version_digest == pin);
}

double margin_threshold(double best, const SelectionConfig& config) {
    return best + std::max(config.margin_s, best * config.margin_fraction);
}

}  // namespace

RouteChoice choose(const RouteTable& table, const RouteRequest& request,
                   const SelectionConfig& config, std::mt19937_64& rng) {
    RouteChoice out;
    const ModelPools* pools = table.find(request.model);
    if (pools == nullptr) {
        out.rejection = Rejection::kNoPoolServesModel;
        return out;
    }
    const size_t n = pools->total_s.size();
    const double* total = pools->total_s.data();
    const uint8_t* flags = pools->flags.data();
    const uint32_t* version = pools->version.data();
    const bool pinned = !request.version_pin.empty();
    // A pin no pool advertises matches nothing; -1 never equals a stored index.
    const int64_t pin = pinned ? pools->find_version(request.version_pin) : -1;

    // The arrays are sorted by cost: the first usable pool is the best.
    bool any_serving = false;
    bool any_version = false;
    size_t first = 0;
    for (; first < n; ++first) {
        const uint8_t f = flags[first];
        if ((f & ModelPools::kServing) == 0) {
            continue;
        }
        any_serving = true;
        if (pinned && static_cast<int64_t>(version[first]) != pin) {
            continue;
        }
        any_version = true;
        if ((f & ModelPools::kSaturated) == 0) {
            break;
        }
    }
    if (!any_serving) {
        out.rejection = Rejection::kNoPoolServesModel;
        return out;
    }
    if (!any_version) {
        out.rejection = Rejection::kVersionPinUnmatched;
        return out;
    }
    if (first == n) {
        out.rejection = Rejection::kAllSaturated;
        double wait = std::numeric_limits<double>::infinity();
        for (const RouteCandidate& c : pools->candidates) {
            if (c.state == membership::PoolState::kServing && c.reachable &&
                (!pinned || c.version_digest == request.version_pin)) {
                wait = std::min(wait, c.cost.queue_s);
            }
        }
        out.retry_after_s = std::max(wait, 1.0);
        return out;
    }
    const double best = total[first];
    const double threshold = margin_threshold(best, config);
    const double local_limit = best + config.local_hysteresis_s;
    auto usable_at = [&](size_t i) {
        return (flags[i] & (ModelPools::kServing | ModelPools::kSaturated)) ==
                   ModelPools::kServing &&
               (!pinned || static_cast<int64_t>(version[i]) == pin);
    };
    // The cheapest usable local pool within the hysteresis (positions before `first` are not
    // usable by definition).
    for (const uint32_t p : pools->local_positions) {
        if (p < first) {
            continue;
        }
        if (total[p] > local_limit) {
            break;
        }
        if (usable_at(p)) {
            out.chosen = &pools->candidates[pools->index[p]];
            out.reason = ChoiceReason::kLocalHysteresis;
            return out;
        }
    }
    // [first, end) holds every pool within the margin; some may be unusable.
    const size_t end =
        static_cast<size_t>(std::upper_bound(total + first, total + n, threshold) - total);
    const size_t span = end - first;
    if (span == 1) {
        out.chosen = &pools->candidates[pools->index[first]];
        out.reason = ChoiceReason::kOnlyCandidate;
        return out;
    }
    // Two distinct usable pools uniformly at random by rejection sampling (cheap when most of
    // the span is usable); an exact count-and-pick scan when sampling keeps missing.
    constexpr int kTries = 16;
    size_t ia = n;
    size_t ib = n;
    for (int t = 0; t < kTries && ia == n; ++t) {
        const size_t i = first + pick(rng, span);
        if (usable_at(i)) {
            ia = i;
        }
    }
    for (int t = 0; t < kTries && ia != n && ib == n; ++t) {
        const size_t i = first + pick(rng, span);
        if (i != ia && usable_at(i)) {
            ib = i;
        }
    }
    if (ia == n || ib == n) {
        size_t count = 0;
        for (size_t i = first; i < end; ++i) {
            count += usable_at(i) ? 1 : 0;
        }
        size_t a = 0;
        size_t b = 0;
        if (count >= 2) {
            a = pick(rng, count);
            b = pick(rng, count - 1);
            if (b >= a) {
                ++b;
            }
        }
        ia = n;
        ib = n;
        for (size_t i = first, k = 0; i < end && (ia == n || ib == n); ++i) {
            if (!usable_at(i)) {
                continue;
            }
            if (k == a) {
                ia = i;
            }
            if (k == b) {
                ib = i;
            }
            ++k;
        }
        if (count == 1) {
            out.chosen = &pools->candidates[pools->index[ia]];
            out.reason = ChoiceReason::kOnlyCandidate;
            return out;
        }
    }
    // Of the two, each at random with a probability proportional to the other's cost (so
    // inversely to its own): the cheaper is favoured, not certain. The costs are stale:
    // the table is rebuilt every rebuild interval from load each site gossips at most once a
    // second (and only on a material change), so within the margin they differ by less than
    // their error. Taking the cheaper of the two every time sent every request to the cheaper of
    // two near-equal pools until its gossiped load caught up, then all of them to the other:
    // the herding two choices are meant to avoid. A live signal (this site's requests in flight
    // per pool, as Envoy's least-request compares) would settle it better, but the table holds
    // only gossip, and the planner hears of an attempt when it ends (report()), not when the
    // forwarder starts it on one of the plan's targets.
    const double ca = total[ia];
    const double cb = total[ib];
    // 1 / (1 + ca / cb) is cb / (ca + cb) without the overflow of the sum; equal costs (both 0
    // included) are a fair coin.
    const double p_a = ca == cb ? 0.5 : cb > 0.0 ? 1.0 / (1.0 + ca / cb) : 0.0;
    out.chosen = &pools->candidates[pools->index[uniform01(rng) < p_a ? ia : ib]];
    out.reason = ChoiceReason::kPowerOfTwo;
    return out;
}

namespace {

std::string ms(double s) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3f", s * 1000.0);
    return buf;
}

void append_json_string(std::string& out, std::string_view s) {
    out.push_back('"');
    for (char ch : s) {
        const auto u = static_cast<unsigned char>(ch);
        if (ch == '"' || ch == '\\') {
            out.push_back('\\');
            out.push_back(ch);
        } else if (u < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", u);
            out += buf;
        } else {
            out.push_back(ch);
        }
    }
    out.push_back('"');
}

void append_candidate(std::string& out, const RouteCandidate& c) {
    out += "{\"member\":";
    append_json_string(out, c.member);
    out += ",\"site\":";
    append_json_string(out, c.site_id);
    out += ",\"model\":";
    append_json_string(out, c.model);
    out += ",\"version\":";
    append_json_string(out, c.version_digest);
    out += ",\"state\":";
    append_json_string(out, membership::pool_state_name(c.state));
    out += ",\"member_state\":";
    append_json_string(out, membership::node_state_name(c.member_state));
    out += ",\"local\":";
    out += c.is_local ? "true" : "false";
    out += ",\"rtt_source\":";
    append_json_string(out, rtt_source_name(c.cost.rtt_source));
    out += ",\"rtt_ms\":" + ms(c.cost.rtt_s);
    out += ",\"queue_ms\":" + ms(c.cost.queue_s);
    out += ",\"prefill_ms\":" + ms(c.cost.prefill_s);
    out += ",\"kv_ms\":" + ms(c.cost.kv_s);
    out += ",\"penalty_ms\":" + ms(c.cost.penalty_s);
    out += ",\"total_ms\":" + ms(c.cost.total_s);
    out += ",\"saturated\":";
    out += c.cost.saturated ? "true" : "false";
    out += "}";
}

}  // namespace

RouteDecision explain(const RouteTable& table, const RouteRequest& request,
                      const SelectionConfig& config, std::mt19937_64& rng) {
    RouteDecision d;
    d.model = std::string(request.model);
    d.version_pin = std::string(request.version_pin);
    const RouteChoice choice = choose(table, request, config, rng);
    d.reason = choice.reason;
    d.rejection = choice.rejection;
    d.retry_after_s = choice.retry_after_s;

    const ModelPools* pools = table.find(request.model);
    const std::vector<RouteCandidate>* list = pools != nullptr ? &pools->candidates : nullptr;
    double best = std::numeric_limits<double>::infinity();
    if (list != nullptr) {
        for (const RouteCandidate& c : *list) {
            if (usable(c, request.version_pin)) {
                best = std::min(best, c.cost.total_s);
            }
        }
    }
    d.best_cost_s = best == std::numeric_limits<double>::infinity() ? 0.0 : best;
    const double threshold = margin_threshold(best, config);
    if (list != nullptr) {
        for (const RouteCandidate& c : *list) {
            CandidateReport r{c, ""};
            if (&c == choice.chosen) {
                r.verdict = "chosen";
            } else if (c.state != membership::PoolState::kServing) {
                r.verdict = "not serving (" + std::string(pool_state_name(c.state)) + ")";
            } else if (!c.reachable) {
                r.verdict = "unreachable (takes no forwarded requests)";
            } else if (!request.version_pin.empty() && c.version_digest != request.version_pin) {
                r.verdict = "version pin unmatched";
            } else if (c.cost.saturated) {
                r.verdict = "saturated";
            } else if (c.cost.total_s > threshold) {
                r.verdict = "outside margin";
            } else {
                r.verdict = "eligible";
            }
            d.candidates.push_back(std::move(r));
        }
    }
    if (choice.chosen != nullptr) {
        d.chosen = *choice.chosen;
        const RouteCandidate& c = *choice.chosen;
        std::string who = c.is_local ? "local pool" : "pool at site " + c.site_id;
        switch (choice.reason) {
            case ChoiceReason::kLocalHysteresis:
                d.reasons.push_back(who + " chosen: its cost " + ms(c.cost.total_s) +
                                    " ms is within the local hysteresis of the best " +
                                    ms(d.best_cost_s) + " ms");
                break;
            case ChoiceReason::kOnlyCandidate:
                d.reasons.push_back(who + " chosen: the only candidate within the margin of the " +
                                    "best cost (" + ms(c.cost.total_s) + " ms)");
                break;
            case ChoiceReason::kPowerOfTwo:
                d.reasons.push_back(who + " chosen: one of two picked at random among " +
                                    "candidates within the margin, weighted toward the cheaper (" +
                                    ms(c.cost.total_s) + " ms, best " + ms(d.best_cost_s) +
                                    " ms)");
                break;
            case ChoiceReason::kNone:
                break;
        }
    } else {
        d.reasons.push_back("rejected: " + std::string(rejection_message(choice.rejection)));
    }
    return d;
}

std::string route_decision_json(const RouteDecision& d) {
    std::string out = "{\"model\":";
    append_json_string(out, d.model);
    out += ",\"version_pin\":";
    append_json_string(out, d.version_pin);
    out += ",\"outcome\":";
    append_json_string(out, d.chosen ? (d.chosen->is_local ? "local" : "forward") : "rejected");
    out += ",\"reason\":";
    append_json_string(out, choice_reason_name(d.reason));
    out += ",\"rejection\":";
    append_json_string(out, rejection_name(d.rejection));
    out += ",\"best_cost_ms\":" + ms(d.best_cost_s);
    out += ",\"retry_after_ms\":" + ms(d.retry_after_s);
    out += ",\"chosen\":";
    if (d.chosen) {
        append_candidate(out, *d.chosen);
    } else {
        out += "null";
    }
    out += ",\"reasons\":[";
    for (size_t i = 0; i < d.reasons.size(); ++i) {
        if (i > 0) {
            out += ",";
        }
        append_json_string(out, d.reasons[i]);
    }
    out += "],\"candidates\":[";
    for (size_t i = 0; i < d.candidates.size(); ++i) {
        if (i > 0) {
            out += ",";
        }
        std::string c;
        append_candidate(c, d.candidates[i].candidate);
        c.pop_back();
        c += ",\"verdict\":";
        append_json_string(c, d.candidates[i].verdict);
        c += "}";
        out += c;
    }
    out += "]}";
    return out;
}

}  // namespace edge::routing::selection
