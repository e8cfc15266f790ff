#include "engine/model/expert_placement.h"

namespace edge::engine {

ExpertPlacement ExpertPlacement::single_rank(int32_t layers, int32_t experts) {
    ExpertPlacement p;
    p.experts_ = experts;
    p.rank_.assign(static_cast<size_t>(layers) * experts, 0);
    return p;
}

}  // namespace edge::engine
