#pragma once

// The timer formulas of SWIM/Lifeguard as pure functions, so they can be table-tested against the
// values hashicorp/memberlist's own tests use. Stateless and thread-safe.

#include <cstddef>

#include "common/clock.h"

namespace edge::routing::membership {

// Minimum suspicion timeout: mult * max(1, log10(max(1, n))) * interval, with the scale rounded
// down to milliseconds of the interval as memberlist does.
Duration suspicion_timeout(int mult, size_t n, Duration interval);

// How many times a broadcast is sent: mult * ceil(log10(n + 1)).
int retransmit_limit(int mult, size_t n);

// Lifeguard: time left of a suspicion that started `elapsed` ago, given n of k wanted independent
// confirmations: the timeout falls from max toward min as log(n + 1) / log(k + 1), rounded down to
// milliseconds and never below min. May be negative (already expired).
Duration remaining_suspicion_time(int n, int k, Duration elapsed, Duration min, Duration max);

// The push-pull interval grows with the cluster above 32 members so its total bandwidth stays
// bounded: interval * (ceil(log2(n) - log2(32)) + 1).
Duration push_pull_scale(Duration interval, size_t n);

}  // namespace edge::routing::membership
