#include "engine/sampling/stop_matcher.h"

#include <doctest/doctest.h>

namespace edge::engine::sampling {
namespace {

TEST_CASE("stop matcher: a possible start is held until resolved") {
    StopMatcher m({"END"});
    CHECK(m.push("abcE") == "abc");
    CHECK(m.held_bytes() == 1);
    CHECK(m.push("N") == "");
    CHECK(m.push("X") == "ENX");
    CHECK_FALSE(m.stopped());
    CHECK(m.push("xxEND yy") == "xx");
    CHECK(m.stopped());
    CHECK(m.push("more") == "");
}

TEST_CASE("stop matcher: a stop string split over tokens is found") {
    StopMatcher m({"END"});
    CHECK(m.push("ok E") == "ok ");
    CHECK(m.push("N") == "");
    CHECK(m.push("D and more") == "");
    CHECK(m.stopped());
    CHECK(m.flush() == "");
}

TEST_CASE("stop matcher: the earliest of several stop strings wins") {
    StopMatcher m({"world", "lo"});
    CHECK(m.push("hello world") == "hel");
    CHECK(m.stopped());
}

TEST_CASE("stop matcher: flush returns the held tail, no stops passes through") {
    StopMatcher m({"\n\n"});
    CHECK(m.push("line\n") == "line");
    CHECK(m.flush() == "\n");
    StopMatcher none({});
    CHECK(none.push("anything") == "anything");
    CHECK(none.held_bytes() == 0);
}

TEST_CASE("stop matcher: multi-byte stop strings hold whole characters") {
    StopMatcher m({"\xC3\xA9!"});  // "é!"
    CHECK(m.push("caf\xC3\xA9") == "caf");
    CHECK(m.push("?") == "\xC3\xA9?");
    CHECK(m.push("\xC3\xA9!") == "");
    CHECK(m.stopped());
}

TEST_CASE("stop matcher: unarmed text (before min_tokens) is never cut, a stop ending after is") {
    StopMatcher m({"ab", "b"});
    // "ab" and "b" wholly in unarmed text pass; the tail "a" is held as a possible start.
    CHECK(m.push("xab", false) == "xab");
    CHECK(m.push("ya", false) == "y");
    CHECK(m.held_bytes() == 1);
    CHECK_FALSE(m.stopped());
    // Armed: the held "a" and the new "b" make "ab", found; the text before it shows.
    CHECK(m.push("bz") == "");
    CHECK(m.stopped());
    // Armed text finds no match wholly in what came unarmed.
    StopMatcher n({"abc", "b"});
    CHECK(n.push("ab", false) == "");  // "ab" may begin "abc": held, its "b" not a stop.
    CHECK(n.push("x") == "abx");
    CHECK_FALSE(n.stopped());
}

}  // namespace
}  // namespace edge::engine::sampling
