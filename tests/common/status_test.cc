#include "common/status.h"

#include <doctest/doctest.h>

#include <memory>

#include "common/log.h"
#include "common/result.h"

namespace edge {
namespace {

Result<int> parse_positive(int v) {
    if (v <= 0) {
        return invalid_argument_error("not positive: " + std::to_string(v));
    }
    return v;
}

Result<int> doubled(int v) {
    EDGE_ASSIGN_OR_RETURN(int x, parse_positive(v));
    return 2 * x;
}

Status check_both(int a, int b) {
    EDGE_RETURN_IF_ERROR(parse_positive(a).status());
    EDGE_RETURN_IF_ERROR(parse_positive(b).status().with_context("second"));
    return ok_status();
}

TEST_CASE("Status carries code, message and context") {
    Status s = data_loss_error("tensor x: offset past end");
    CHECK_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(s.to_string() == "DATA_LOSS: tensor x: offset past end");
    CHECK(s.with_context("model.safetensors").message() ==
          "model.safetensors: tensor x: offset past end");
    CHECK(ok_status().with_context("ignored").ok());
    CHECK(ok_status().to_string() == "OK");
}

TEST_CASE("Result propagates values and errors through the macros") {
    CHECK(doubled(4).value() == 8);
    Result<int> bad = doubled(-1);
    CHECK_FALSE(bad.ok());
    CHECK(bad.status().message() == "not positive: -1");
    CHECK(check_both(1, 2).ok());
    CHECK(check_both(1, -2).message() == "second: not positive: -2");
    Result<std::unique_ptr<int>> owned = std::make_unique<int>(7);
    REQUIRE(owned.ok());
    std::unique_ptr<int> taken = std::move(owned).value();
    CHECK(*taken == 7);
}

TEST_CASE("log lines are one JSON object with typed fields") {
    std::string line = log::format_line(log::Level::kWarn, "reload_failed",
                                        {{"file", "a\"b.pem"}, {"attempt", 3}, {"ok", false}});
    CHECK(line.find("\"level\":\"warn\"") != std::string::npos);
    CHECK(line.find("\"event\":\"reload_failed\"") != std::string::npos);
    CHECK(line.find("\"file\":\"a\\\"b.pem\"") != std::string::npos);
    CHECK(line.find("\"attempt\":3") != std::string::npos);
    CHECK(line.find("\"ok\":false") != std::string::npos);
}

}  // namespace
}  // namespace edge
