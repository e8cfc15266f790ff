#include "engine/shard/placement_planner.h"

#include <algorithm>
#include <vector>

namespace edge::engine::shard {

Result<ExpertPlacement> plan_placement(std::span<const int64_t> load, int32_t layers,
                                       int32_t experts, int32_t ranks, int32_t slots_per_rank) {
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
        // 1. Replica counts: each spare slot to the expert with the highest load per replica.
        std::vector<int32_t> copies(static_cast<size_t>(experts), 1);
        const int64_t spare = static_cast<int64_t>(ranks) * slots - experts;
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
        }
        // 2. Items (one per replica) heaviest first, each onto the least-loaded eligible rank.
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
        std::vector<double> rank_load(static_cast<size_t>(ranks), 0.0);
        for (const Item& it : items) {
            int32_t pick = -1;
            for (int32_t r = 0; r < ranks; ++r) {
                const auto& held = out[l][r];
                if (static_cast<int32_t>(held.size()) >= slots ||
                    std::find(held.begin(), held.end(), it.expert) != held.end()) {
                    continue;
                }
                if (pick < 0 || rank_load[r] < rank_load[pick] ||
                    (rank_load[r] == rank_load[pick] && held.size() < out[l][pick].size())) {
                    pick = r;
                }
            }
            if (pick < 0) {
                // Only possible for a replica whose every rank is full or already holds it; the
                // first copy always fits because slots * ranks >= experts.
                continue;
            }
            out[l][pick].push_back(it.expert);
            rank_load[pick] += it.load;
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
