#include "engine/model/expert_placement.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <vector>

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

// Longest spec quoted whole in an error, and longest item quoted: a long plan (hundreds of ranges
// for a 384-expert model) would otherwise be copied into every log line that reports it.
constexpr size_t kQuoteSpec = 64;
constexpr size_t kQuoteItem = 32;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// `s` without leading and trailing whitespace; `pos` (s's offset in the spec) moves with it.
std::string_view trim(std::string_view s, size_t* pos) {
    while (!s.empty() && is_space(s.front())) {
        s.remove_prefix(1);
        ++*pos;
    }
    while (!s.empty() && is_space(s.back())) {
        s.remove_suffix(1);
    }
    return s;
}

std::string quote(std::string_view s, size_t limit) {
    return s.size() <= limit ? "'" + std::string(s) + "'"
                             : "'" + std::string(s.substr(0, limit)) + "...' (" +
                                   std::to_string(s.size()) + " characters)";
}

// A whole decimal number in [0, experts), else -1.
int32_t parse_id(std::string_view s, int32_t experts) {
    int32_t v = -1;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || v < 0 ||
        v >= experts) {
        return -1;
    }
    return v;
}

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
    if (ranks < 1 || experts < 1) {
        return invalid_argument_error("expert placement: ranks and experts must be positive");
    }
    const std::string where = "static plan " + quote(spec, kQuoteSpec);
    // Errors name the rank and the 1-based character where its problem starts.
    auto error = [&](size_t rank, size_t pos, const std::string& what) {
        return invalid_argument_error(where + ": rank " + std::to_string(rank) + ", character " +
                                      std::to_string(pos + 1) + ": " + what);
    };
    std::vector<std::vector<int32_t>> per_rank;
    // Duplicates are refused as they are read, so no rank ever lists more than `experts` ids
    // however long the spec (a range repeated a million times must not allocate gigabytes).
    std::vector<uint8_t> seen(static_cast<size_t>(experts));
    size_t start = 0;
    while (true) {
        const size_t semi = std::min(spec.find(';', start), spec.size());
        const size_t rank = per_rank.size();
        if (rank == static_cast<size_t>(ranks)) {
            // `start` is just past the ';' that opens one rank too many (1-based: the ';').
            return invalid_argument_error(where + ": character " + std::to_string(start) +
                                          ": a ';' opens rank " + std::to_string(rank) +
                                          ", beyond the " + std::to_string(ranks) +
                                          " ranks the configuration has");
        }
        size_t part_pos = start;
        const std::string_view part = trim(spec.substr(start, semi - start), &part_pos);
        if (part.empty()) {
            return error(rank, part_pos, "lists no experts (every rank needs at least one)");
        }
        std::fill(seen.begin(), seen.end(), 0);
        std::vector<int32_t> ids;
        for (size_t p = 0; p <= part.size();) {
            const size_t comma = std::min(part.find(',', p), part.size());
            size_t item_pos = part_pos + p;
            const std::string_view item = trim(part.substr(p, comma - p), &item_pos);
            if (item.empty()) {
                return error(rank, item_pos, "empty item between commas");
            }
            const size_t dash = item.find('-');
            size_t unused = 0;
            const int32_t lo = parse_id(trim(item.substr(0, dash), &unused), experts);
            const int32_t hi = dash == std::string_view::npos
                                   ? lo
                                   : parse_id(trim(item.substr(dash + 1), &unused), experts);
            if (lo < 0 || hi < lo) {
                return error(rank, item_pos,
                             quote(item, kQuoteItem) + " is not an expert id or range in [0, " +
                                 std::to_string(experts) + ")");
            }
            for (int32_t e = lo; e <= hi; ++e) {
                if (seen[static_cast<size_t>(e)] != 0) {
                    return error(rank, item_pos,
                                 quote(item, kQuoteItem) + " lists expert " + std::to_string(e) +
                                     " twice on this rank");
                }
                seen[static_cast<size_t>(e)] = 1;
                ids.push_back(e);
            }
            p = comma + 1;
        }
        per_rank.push_back(std::move(ids));
        if (semi == spec.size()) {
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
