#pragma once

// Choosing a pool for one request from a RouteTable: filter the model's candidates (state
// serving, the pinned version digest if any, not saturated), keep those whose cost is within a
// margin of the best, prefer the local pool when it is within the hysteresis of the best, and
// otherwise pick two at random and take one of them, weighted toward the cheaper (power of two
// choices, so one best pool is not stampeded while the gossiped costs lag). choose() is the allocation-free request path; explain() gives the same choice
// for the same RNG state plus every candidate with its cost terms and why it was or was not
// taken (for /admin/route). Both are pure functions of their arguments; the caller owns the RNG
// (seeded, not shared between threads).

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "routing/selection/route_table.h"

namespace edge::routing::selection {

struct SelectionConfig {
    // Candidates whose cost is within max(margin_s, best * margin_fraction) of the best are
    // interchangeable, seconds and dimensionless.
    double margin_s = 0.005;
    double margin_fraction = 0.1;
    // The local pool is chosen while its cost is within this of the best, seconds.
    double local_hysteresis_s = 0.010;

    bool operator==(const SelectionConfig&) const = default;
};

struct RouteRequest {
    std::string_view model;
    // Version digest pinned by the client (X-Model-Version); empty when unpinned.
    std::string_view version_pin;
};

enum class Rejection : uint8_t { kNone, kNoPoolServesModel, kVersionPinUnmatched, kAllSaturated };
std::string_view rejection_name(Rejection r);
std::string_view rejection_message(Rejection r);

enum class ChoiceReason : uint8_t { kNone, kOnlyCandidate, kLocalHysteresis, kPowerOfTwo };
std::string_view choice_reason_name(ChoiceReason r);

struct RouteChoice {
    // The chosen candidate (into the model's list in the table), or null when rejected.
    const RouteCandidate* chosen = nullptr;
    ChoiceReason reason = ChoiceReason::kNone;
    Rejection rejection = Rejection::kNone;
    // When rejected because all are saturated: the smallest queue wait among them, seconds
    // (the Retry-After hint).
    double retry_after_s = 0.0;
};

RouteChoice choose(const RouteTable& table, const RouteRequest& request,
                   const SelectionConfig& config, std::mt19937_64& rng);

struct CandidateReport {
    RouteCandidate candidate;
    // "chosen", "eligible", or why it was filtered: "not serving", "unreachable", "version pin
    // unmatched", "saturated", "outside margin".
    std::string verdict;
};

struct RouteDecision {
    std::string model;
    std::string version_pin;
    std::vector<CandidateReport> candidates;
    std::optional<RouteCandidate> chosen;
    ChoiceReason reason = ChoiceReason::kNone;
    Rejection rejection = Rejection::kNone;
    double best_cost_s = 0.0;
    double retry_after_s = 0.0;
    // Human-readable sentences: the choice and why.
    std::vector<std::string> reasons;
};

RouteDecision explain(const RouteTable& table, const RouteRequest& request,
                      const SelectionConfig& config, std::mt19937_64& rng);

// The decision as a JSON object (costs in milliseconds).
std::string route_decision_json(const RouteDecision& d);

}  // namespace edge::routing::selection
