#include "engine/shard/placement_planner.h"

#include <algorithm>
#include <vector>

namespace edge::engine::shard {

namespace {

// Packs copies[e] replicas of each expert (load w[e] split evenly) heaviest first onto the
// least-loaded rank that has a free slot and does not hold the expert yet. Returns the busiest
// rank's load; `out` gets the experts per rank.
double pack_layer(const int64_t* w, const std::vector<int32_t>& copies, int32_t experts,
                  int32_t ranks, int32_t slots, std::vector<std::vector<int32_t>>* out) {
    struct Item {
        double load;
        int32_t expert;
    };
    std::vector<Item> items;
    for (int32_t e = 0; e < experts; ++e) {
        for (int32_t c = 0; c < copies[e]; ++c) {
            items.push_back({static_cast<double>(w[e]) / copies[e], e});
        }
    }
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
        return a.load > b.load || (a.load == b.load && a.expert < b.expert);
    });
    out->assign(static_cast<size_t>(ranks), {});
    std::vector<double> rank_load(static_cast<size_t>(ranks), 0.0);
    for (const Item& it : items) {
        int32_t pick = -1;
        for (int32_t r = 0; r < ranks; ++r) {
            const auto& held = (*out)[r];
            if (static_cast<int32_t>(held.size()) >= slots ||
                std::find(held.begin(), held.end(), it.expert) != held.end()) {
                continue;
            }
            if (pick < 0 || rank_load[r] < rank_load[pick] ||
                (rank_load[r] == rank_load[pick] && held.size() < (*out)[pick].size())) {
                pick = r;
            }
        }
        if (pick < 0) {
            // Only a replica can find every free slot on a rank that holds its expert; the first
            // copy always fits because slots * ranks >= experts. Its share then goes unused, so
            // count it on the rank holding the expert's first copy.
            for (int32_t r = 0; r < ranks; ++r) {
                const auto& held = (*out)[r];
                if (std::find(held.begin(), held.end(), it.expert) != held.end()) {
                    rank_load[r] += it.load;
                    break;
                }
            }
            continue;
        }
        (*out)[pick].push_back(it.expert);
        rank_load[pick] += it.load;
    }
    return *std::max_element(rank_load.begin(), rank_load.end());
}

}  // namespace

Result<ExpertPlacement> plan_placement(std::span<const int64_t> load, int32_t layers,
                                       int32_t experts, int32_t ranks, int32_t slots_per_rank,
                                       bool replicas) {
    EDGE_ASSIGN_OR_RETURN(ExpertPlacement base,
                          ExpertPlacement::contiguous(layers, experts, ranks, slots_per_rank));
    if (load.size() != static_cast<size_t>(layers) * static_cast<size_t>(experts)) {
        return invalid_argument_error("placement planner: " + std::to_string(load.size()) +
                                      " load entries for " + std::to_string(layers) +
                                      " layers x " + std::to_string(experts) + " experts");
    }
    const int32_t slots = base.slots_per_rank();
    std::vector<std::vector<std::vector<int32_t>>> out(static_cast<size_t>(layers));
    for (int32_t l = 0; l < layers; ++l) {
        const int64_t* w = load.data() + static_cast<size_t>(l) * experts;
        int64_t total = 0;
        for (int32_t e = 0; e < experts; ++e) {
            if (w[e] < 0) {
                return invalid_argument_error("placement planner: layer " + std::to_string(l) +
                                              " expert " + std::to_string(e) +
                                              " has a negative load");
            }
            total += w[e];
        }
        out[l].resize(static_cast<size_t>(ranks));
        if (total == 0) {
            for (int32_t r = 0; r < ranks; ++r) {
                std::span<const int32_t> ex = base.experts_on(l, r);
                out[l][r].assign(ex.begin(), ex.end());
            }
            continue;
        }
        // 1. Replica counts: each spare slot to the expert with the highest load per replica,
        //    recording the order; 2. pack each prefix of that order and keep the best (a replica
        //    that does not pack well can make things worse, e.g. 3 copies each of 2 hot experts
        //    on 4 ranks).
        std::vector<int32_t> copies(static_cast<size_t>(experts), 1);
        std::vector<int32_t> order;
        const int64_t spare = replicas ? static_cast<int64_t>(ranks) * slots - experts : 0;
        for (int64_t s = 0; s < spare; ++s) {
            int32_t best = -1;
            for (int32_t e = 0; e < experts; ++e) {
                if (copies[e] >= ranks) {
                    continue;  // At most one replica per rank.
                }
                // w[e] / copies[e] > w[best] / copies[best], compared without division.
                if (best < 0 || static_cast<__int128>(w[e]) * copies[best] >
                                    static_cast<__int128>(w[best]) * copies[e]) {
                    best = e;
                }
            }
            if (best < 0 || w[best] == 0) {
                break;  // Nothing left worth replicating; spare slots stay empty.
            }
            ++copies[best];
            order.push_back(best);
        }
        // Candidate replica counts: all prefixes when cheap, else 17 evenly spaced ones.
        std::vector<size_t> candidates;
        const size_t used = order.size();
        const double work = static_cast<double>(used + 1) * (experts + used) * ranks;
        const size_t stride = work > 2e7 ? std::max<size_t>(1, used / 16) : 1;
        for (size_t k = 0; k <= used; k += stride) {
            candidates.push_back(k);
        }
        if (candidates.back() != used) {
            candidates.push_back(used);
        }
        double best_max = -1.0;
        for (size_t k : candidates) {
            std::vector<int32_t> c(static_cast<size_t>(experts), 1);
            for (size_t i = 0; i < k; ++i) {
                ++c[order[i]];
            }
            std::vector<std::vector<int32_t>> packed;
            const double mx = pack_layer(w, c, experts, ranks, slots, &packed);
            // Strictly better only: among equals, fewer replicas (less to move).
            if (best_max < 0.0 || mx < best_max * (1.0 - 1e-12)) {
                best_max = mx;
                out[l] = std::move(packed);
            }
        }
    }
    return ExpertPlacement::from_slots(layers, experts, ranks, slots, out);
}

std::vector<double> rank_loads(const ExpertPlacement& plan, std::span<const int64_t> load) {
    const int32_t L = plan.layers();
    const int32_t E = plan.experts();
    const int32_t R = plan.ranks();
    std::vector<double> out(static_cast<size_t>(L) * R, 0.0);
    if (load.size() != static_cast<size_t>(L) * static_cast<size_t>(E)) {
        return out;
    }
    for (int32_t l = 0; l < L; ++l) {
        for (int32_t e = 0; e < E; ++e) {
            std::span<const int32_t> reps = plan.replicas(l, e);
            const double share = static_cast<double>(load[static_cast<size_t>(l) * E + e]) /
                                 static_cast<double>(reps.size());
            for (int32_t r : reps) {
                out[static_cast<size_t>(l) * R + r] += share;
            }
        }
    }
    return out;
}

double imbalance(const ExpertPlacement& plan, std::span<const int64_t> load) {
    const std::vector<double> rl = rank_loads(plan, load);
    const int32_t R = plan.ranks();
    double max_sum = 0.0;
    double mean_sum = 0.0;
    for (int32_t l = 0; l < plan.layers(); ++l) {
        double mx = 0.0;
        double sum = 0.0;
        for (int32_t r = 0; r < R; ++r) {
            mx = std::max(mx, rl[static_cast<size_t>(l) * R + r]);
            sum += rl[static_cast<size_t>(l) * R + r];
        }
        max_sum += mx;
        mean_sum += sum / R;
    }
    return mean_sum > 0.0 ? max_sum / mean_sum : 1.0;
}

}  // namespace edge::engine::shard
