#include "engine/model/expert_placement.h"

#include <algorithm>
#include <charconv>

namespace edge::engine {
namespace {

Status check_dims(int32_t layers, int32_t experts, int32_t ranks, int32_t slots) {
    if (layers < 0 || experts < 1 || ranks < 1 || slots < 1) {
        return invalid_argument_error("expert placement: layers " + std::to_string(layers) +
                                      ", experts " + std::to_string(experts) + ", ranks " +
                                      std::to_string(ranks) + ", slots_per_rank " +
                                      std::to_string(slots) + " are not all positive");
    }
    if (slots > experts) {
        return invalid_argument_error("expert placement: slots_per_rank " + std::to_string(slots) +
                                      " exceeds the " + std::to_string(experts) +
                                      " experts of a layer");
    }
    if (static_cast<int64_t>(ranks) * slots < experts) {
        return invalid_argument_error(
            "expert placement: " + std::to_string(ranks) + " ranks x " + std::to_string(slots) +
            " slots cannot hold " + std::to_string(experts) + " experts per layer");
    }
    return ok_status();
}

int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

}  // namespace

ExpertPlacement ExpertPlacement::single_rank(int32_t layers, int32_t experts) {
    auto p = contiguous(layers, std::max(experts, 1), 1, 0);
    return std::move(p).value();
}

Result<ExpertPlacement> ExpertPlacement::contiguous(int32_t layers, int32_t experts,
                                                    int32_t ranks, int32_t slots_per_rank) {
    if (ranks < 1 || experts < 1) {
        return invalid_argument_error("expert placement: ranks and experts must be positive");
    }
    const int32_t slots = slots_per_rank == 0 ? ceil_div(experts, ranks) : slots_per_rank;
    EDGE_RETURN_IF_ERROR(check_dims(layers, experts, ranks, slots));
    std::vector<std::vector<std::vector<int32_t>>> s(
        static_cast<size_t>(layers), std::vector<std::vector<int32_t>>(static_cast<size_t>(ranks)));
    for (int32_t l = 0; l < layers; ++l) {
        for (int32_t r = 0; r < ranks; ++r) {
            const int32_t b = static_cast<int32_t>(static_cast<int64_t>(r) * experts / ranks);
            const int32_t e = static_cast<int32_t>(static_cast<int64_t>(r + 1) * experts / ranks);
            for (int32_t x = b; x < e; ++x) {
                s[l][r].push_back(x);
            }
        }
    }
    return from_slots(layers, experts, ranks, slots, s);
}

Result<ExpertPlacement> ExpertPlacement::from_slots(
    int32_t layers, int32_t experts, int32_t ranks, int32_t slots_per_rank,
    const std::vector<std::vector<std::vector<int32_t>>>& slots) {
    EDGE_RETURN_IF_ERROR(check_dims(layers, experts, ranks, slots_per_rank));
    if (slots.size() != static_cast<size_t>(layers)) {
        return invalid_argument_error("expert placement: " + std::to_string(slots.size()) +
                                      " layers given, " + std::to_string(layers) + " expected");
    }
    ExpertPlacement p;
    p.layers_ = layers;
    p.experts_ = experts;
    p.ranks_ = ranks;
    p.slots_per_rank_ = slots_per_rank;
    p.replicas_.resize(static_cast<size_t>(layers) * experts);
    p.on_rank_.resize(static_cast<size_t>(layers) * ranks);
    for (int32_t l = 0; l < layers; ++l) {
        const std::string where = "expert placement: layer " + std::to_string(l);
        if (slots[l].size() != static_cast<size_t>(ranks)) {
            return invalid_argument_error(where + ": " + std::to_string(slots[l].size()) +
                                          " ranks given, " + std::to_string(ranks) + " expected");
        }
        for (int32_t r = 0; r < ranks; ++r) {
            std::vector<int32_t> held = slots[l][r];
            std::sort(held.begin(), held.end());
            if (held.size() > static_cast<size_t>(slots_per_rank)) {
                return invalid_argument_error(where + ": rank " + std::to_string(r) + " holds " +
                                              std::to_string(held.size()) + " experts in " +
                                              std::to_string(slots_per_rank) + " slots");
            }
            for (size_t i = 0; i < held.size(); ++i) {
                const int32_t e = held[i];
                if (e < 0 || e >= experts) {
                    return invalid_argument_error(where + ": rank " + std::to_string(r) +
                                                  ": expert " + std::to_string(e) +
                                                  " is outside [0, " + std::to_string(experts) +
                                                  ")");
                }
                if (i > 0 && held[i - 1] == e) {
                    return invalid_argument_error(where + ": rank " + std::to_string(r) +
                                                  " holds expert " + std::to_string(e) + " twice");
                }
                p.replicas_[static_cast<size_t>(l) * experts + e].push_back(r);
            }
            p.on_rank_[static_cast<size_t>(l) * ranks + r] = std::move(held);
        }
        for (int32_t e = 0; e < experts; ++e) {
            if (p.replicas_[static_cast<size_t>(l) * experts + e].empty()) {
                return invalid_argument_error(where + ": expert " + std::to_string(e) +
                                              " is held by no rank");
            }
        }
    }
    return p;
}

Result<ExpertPlacement> ExpertPlacement::parse(std::string_view spec, int32_t layers,
                                               int32_t experts, int32_t ranks,
                                               int32_t slots_per_rank) {
    const std::string where = "static plan '" + std::string(spec) + "'";
    std::vector<std::vector<int32_t>> per_rank;
    size_t start = 0;
    while (true) {
        const size_t semi = spec.find(';', start);
        std::string_view part = spec.substr(start, semi == std::string_view::npos
                                                       ? std::string_view::npos
                                                       : semi - start);
        std::vector<int32_t> ids;
        size_t p = 0;
        while (p < part.size()) {
            size_t comma = part.find(',', p);
            if (comma == std::string_view::npos) {
                comma = part.size();
            }
            std::string_view item = part.substr(p, comma - p);
            while (!item.empty() && item.front() == ' ') {
                item.remove_prefix(1);
            }
            while (!item.empty() && item.back() == ' ') {
                item.remove_suffix(1);
            }
            const size_t dash = item.find('-');
            std::string_view a = item.substr(0, dash);
            std::string_view b = dash == std::string_view::npos ? a : item.substr(dash + 1);
            int32_t lo = -1;
            int32_t hi = -1;
            auto ra = std::from_chars(a.data(), a.data() + a.size(), lo);
            auto rb = std::from_chars(b.data(), b.data() + b.size(), hi);
            if (item.empty() || ra.ec != std::errc() || ra.ptr != a.data() + a.size() ||
                rb.ec != std::errc() || rb.ptr != b.data() + b.size() || lo < 0 || hi < lo ||
                hi >= experts) {
                return invalid_argument_error(where + ": rank " +
                                              std::to_string(per_rank.size()) + ": '" +
                                              std::string(item) +
                                              "' is not an expert id or range in [0, " +
                                              std::to_string(experts) + ")");
            }
            for (int32_t e = lo; e <= hi; ++e) {
                ids.push_back(e);
            }
            p = comma + 1;
        }
        per_rank.push_back(std::move(ids));
        if (semi == std::string_view::npos) {
            break;
        }
        start = semi + 1;
    }
    if (per_rank.size() != static_cast<size_t>(ranks)) {
        return invalid_argument_error(where + ": lists " + std::to_string(per_rank.size()) +
                                      " ranks, the configuration has " + std::to_string(ranks));
    }
    const int32_t slots = slots_per_rank == 0 ? ceil_div(experts, ranks) : slots_per_rank;
    int32_t widest = 0;
    for (const auto& r : per_rank) {
        widest = std::max(widest, static_cast<int32_t>(r.size()));
    }
    // With slots_per_rank 0 the plan itself says how many slots a rank needs.
    const int32_t use_slots = slots_per_rank == 0 ? std::max(slots, widest) : slots;
    std::vector<std::vector<std::vector<int32_t>>> s(static_cast<size_t>(layers), per_rank);
    auto plan = from_slots(layers, experts, ranks, std::min(use_slots, experts), s);
    if (!plan.ok()) {
        return plan.status().with_context(where);
    }
    return plan;
}

bool ExpertPlacement::holds(int32_t layer, int32_t expert, int32_t rank) const {
    for (int32_t r : replicas(layer, expert)) {
        if (r == rank) {
            return true;
        }
    }
    return false;
}

int64_t ExpertPlacement::extra_replicas() const {
    int64_t n = 0;
    for (const auto& r : replicas_) {
        n += static_cast<int64_t>(r.size()) - 1;
    }
    return n;
}

std::string ExpertPlacement::describe() const {
    std::string out;
    for (int32_t l = 0; l < layers_; ++l) {
        out += "layer " + std::to_string(l) + ":";
        for (int32_t r = 0; r < ranks_; ++r) {
            out += r == 0 ? " " : " | ";
            std::span<const int32_t> ex = experts_on(l, r);
            for (size_t i = 0; i < ex.size();) {
                size_t j = i;
                while (j + 1 < ex.size() && ex[j + 1] == ex[j] + 1) {
                    ++j;
                }
                out += (i == 0 ? "" : ",") + std::to_string(ex[i]);
                if (j > i) {
                    out += "-" + std::to_string(ex[j]);
                }
                i = j + 1;
            }
        }
        out += "\n";
    }
    return out;
}

}  // namespace edge::engine
