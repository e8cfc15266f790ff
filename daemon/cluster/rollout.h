#pragma once

// RolloutBook holds the cluster's target version per model: the newest rollout intent by Lamport
// time. An intent is a small gossip user event (name kRolloutEvent, payload "model\nversion")
// sent by `edgeserve rollout --model M --version V` through any site's admin listener; every
// site applies the one with the highest Lamport time (ties: the larger version string, so all
// sites agree). A site sends one only once a push-pull has brought its Lamport clock up to
// another member's (Cluster refuses it before: stamped lower, it would lose everywhere). Config
// `routing.target_versions` seeds intents at Lamport time 0. Thread-safe: every method takes an
// internal mutex.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace edge::daemon::cluster {

inline constexpr std::string_view kRolloutEvent = "rollout";

struct RolloutIntent {
    std::string model;
    std::string version;  // Version digest the cluster should serve.
    uint64_t ltime = 0;   // Lamport time of the intent (0: from the config).
};

// The payload of a rollout user event, and its untrusted-input parser (bounded, no newlines in
// either field, both non-empty, at most 255 bytes each).
std::vector<uint8_t> encode_rollout(std::string_view model, std::string_view version);
Result<RolloutIntent> decode_rollout(std::span<const uint8_t> payload, uint64_t ltime);

// The book as anti-entropy state, carried by every full-state push-pull (Memberlist's
// set_local_state): an intent event reaches the members up when it is sent, and push-pull hands on
// only the newest user_event_buffer events, so a site that joins or restarts after later intents
// for other models would never learn this model's target. Only intents with a Lamport time are
// sent, not the config's (time 0): each site's own config stands until an intent overrides it.
std::vector<uint8_t> encode_rollout_state(std::span<const RolloutIntent> intents);
// Untrusted input from a peer whose event clock is `sender_ltime`: at most RolloutBook::kMaxModels
// intents, each as decode_rollout bounds it, its time in 1..sender_ltime (below
// kMaxEventLtime). Any violation refuses the whole state (an honest peer sends none).
Result<std::vector<RolloutIntent>> decode_rollout_state(std::span<const uint8_t> state,
                                                        uint64_t sender_ltime);

class RolloutBook {
public:
  // Models the book holds at most: an intent for another model once it is full is refused, so
  // events naming ever new models cannot grow it without bound; intents for the models it
  // holds still apply.
  static constexpr size_t kMaxModels = 4096;

  enum class Applied {
      kTarget,  // It became the model's target (newer than the one held).
      kStale,   // The target held is as new or newer.
      kFull,    // A model the book does not hold, and it holds kMaxModels.
  };
  Applied apply(const RolloutIntent& intent);
  // The model's target version, if any intent names one.
  std::optional<RolloutIntent> target(std::string_view model) const;
  std::vector<RolloutIntent> all() const;

private:
    mutable std::mutex mu_;
    std::map<std::string, RolloutIntent, std::less<>> by_model_;
};

}  // namespace edge::daemon::cluster
