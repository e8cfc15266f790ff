#pragma once

// The parts of JsonPrefix (json_prefix.h) that its files share, for their use only. The
// automaton's code is in json_prefix.cc (copies, readings, the head and the tail, values begun,
// the keys written), json_prefix_pairs.cc (argument pairs), json_prefix_containers.cc (objects
// and arrays) and json_prefix_scalars.cc (strings, numbers and literals).

#include "engine/sampling/json_schema.h"

namespace edge::engine::sampling {

using Kind = JsonSchema::Kind;

inline bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace edge::engine::sampling
