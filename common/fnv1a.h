#pragma once

// 64-bit FNV-1a, the hash the JSON readers keep an object's keys by (sampling::JsonPrefix while
// a model writes, chat::JsonStream while a tool call streams): one definition, so a key one of
// them takes the other takes too. Not for anything an attacker's collisions could hurt.

#include <cstdint>
#include <string_view>

namespace edge {

inline constexpr uint64_t kFnv1aSeed = 0xcbf29ce484222325ULL;

// The hash `h` of some bytes, extended by `byte`.
constexpr uint64_t fnv1a_step(uint64_t h, unsigned char byte) {
    return (h ^ byte) * 0x100000001b3ULL;
}

constexpr uint64_t fnv1a(std::string_view bytes) {
    uint64_t h = kFnv1aSeed;
    for (const char b : bytes) {
        h = fnv1a_step(h, static_cast<unsigned char>(b));
    }
    return h;
}

}  // namespace edge
