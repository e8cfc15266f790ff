// JsonSchema::compile's work budgets (json_schema.h): a request's schema is compiled on the I/O
// thread that read it, so no shape a request body can carry may buy seconds of work there, or
// per token in JsonPrefix afterwards. Each shape that was slow is refused with the limit and the
// part of the schema that reached it, counted in work, not timed; schemas at the limits still
// compile and are followed.

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <string>

#include "engine/sampling/json_prefix.h"
#include "engine/sampling/json_schema.h"

namespace edge::engine::sampling {
namespace {

namespace json = boost::json;

// `count` properties "k0", "k1", ... each with the schema `value`, the first `required` of them
// required: an object schema's text.
std::string object_of(size_t count, const std::string& value, size_t required = 0) {
    std::string text = R"({"type":"object","properties":{)";
    for (size_t i = 0; i < count; ++i) {
        text += (i == 0 ? "\"k" : ",\"k") + std::to_string(i) + "\":" + value;
    }
    text += R"(},"required":[)";
    for (size_t i = 0; i < required; ++i) {
        text += (i == 0 ? "\"k" : ",\"k") + std::to_string(i) + "\"";
    }
    return text + "]}";
}

// The message compiling `text` is refused with (CHECKed to be refused).
std::string refusal(const std::string& text) {
    auto s = JsonSchema::compile(json::parse(text));
    CHECK_FALSE(s.ok());
    return s.ok() ? std::string() : s.status().message();
}

bool has(const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
}

TEST_CASE("json schema budget: one object lists at most kMaxObjectProperties properties") {
    // JsonPrefix looks through an object's properties at each byte of a key, for each token a
    // sampler asks about (8000 took 80 ms a pass over a vocabulary); listing `required` through
    // 100000 of them took 15 s to compile.
    const std::string too_many = R"({"type":"object","properties":{"a":)" +
                                 object_of(JsonSchema::kMaxObjectProperties + 1, "true") + "}}";
    const std::string message = refusal(too_many);
    CAPTURE(message);
    CHECK(has(message,
              "schema at '#/properties/a': 'properties' lists 1025 properties; at most "
              "1024 are supported in one object"));
    // At the limit, every one required: compiled, and a document with all of them is followed.
    const size_t n = JsonSchema::kMaxObjectProperties;
    auto full = JsonSchema::compile(json::parse(object_of(n, R"({"type":"integer"})", n)));
    REQUIRE_MESSAGE(full.ok(), full.status().to_string());
    JsonPrefix p(**full);
    std::string doc = "{";
    for (size_t i = 0; i < n; ++i) {
        doc += (i == 0 ? "\"k" : ",\"k") + std::to_string(i) + "\":" + std::to_string(i);
    }
    REQUIRE(p.feed(doc));
    CHECK_FALSE(p.complete());
    REQUIRE(p.feed("}"));
    CHECK(p.complete());
}

TEST_CASE("json schema budget: constants are merged only where a union needs it") {
    // A union's constants are merged into one enum, copying them, within a budget for the
    // schema. Optional fields of a large enum (its values, then null: they begin apart) gain
    // nothing from a copy, and spent the budget before a later anyOf of 17 constants, which
    // was then refused.
    std::string e = R"({"enum":[)";
    for (int i = 0; i < 1000; ++i) {
        e += (i == 0 ? "\"" : ",\"") + std::to_string(i) + std::string(56, 'x') + "\"";
    }
    e += "]}";
    std::string text = R"({"$defs":{"E":)" + e + R"(},"type":"object","properties":{)";
    for (int i = 0; i < 12; ++i) {
        text += "\"f" + std::to_string(i) +
                R"(":{"anyOf":[{"$ref":"#/$defs/E"},{"type":"null"}]},)";
    }
    text += R"("z":{"anyOf":[)";
    for (int i = 0; i < 17; ++i) {
        text += (i == 0 ? "" : ",") + std::string(R"({"const":"s)") + std::to_string(i) + "\"}";
    }
    text += R"(]}},"required":["z"]})";
    auto s = JsonSchema::compile(json::parse(text));
    REQUIRE_MESSAGE(s.ok(), s.status().to_string());
    JsonPrefix p(**s);
    REQUIRE(p.feed(R"({"z":"s16"})"));
    CHECK(p.complete());
}

TEST_CASE("json schema budget: listed properties count as parts, $refs to one schema included") {
    // Properties whose schema is one $ref add no node, yet each is compiled and looked through:
    // nine objects of 1000 are 9000 parts.
    std::string text = R"({"$defs":{"s":{"type":"string"}},"type":"object","properties":{)";
    for (int i = 0; i < 9; ++i) {
        text += (i == 0 ? "\"o" : ",\"o") + std::to_string(i) +
                "\":" + object_of(1000, R"({"$ref":"#/$defs/s"})");
    }
    text += "}}";
    const std::string message = refusal(text);
    CAPTURE(message);
    CHECK(has(message, "the schema has more than 8192 parts (schemas and listed properties)"));
    CHECK(has(message, "schema at '#/properties/o8'"));
    // Eight of them are 8000 parts, and compile.
    text = R"({"$defs":{"s":{"type":"string"}},"type":"object","properties":{)";
    for (int i = 0; i < 8; ++i) {
        text += (i == 0 ? "\"o" : ",\"o") + std::to_string(i) +
                "\":" + object_of(1000, R"({"$ref":"#/$defs/s"})");
    }
    text += "}}";
    auto eight = JsonSchema::compile(json::parse(text));
    CHECK_MESSAGE(eight.ok(), eight.status().to_string());
}

TEST_CASE("json schema budget: the JSON pointers built are at most kMaxPathBytes") {
    // A long property name costs its length at every part below it (each keeps its pointer): a
    // 1 MB name over 2000 properties took 10 s and 2 GB. Here 100 kB over 30 properties.
    const std::string name(100000, 'n');
    const std::string text = R"({"type":"object","properties":{")" + name +
                             "\":" + object_of(30, R"({"type":"string"})") + "}}";
    const std::string message = refusal(text);
    CAPTURE(message.substr(0, 400));
    CHECK(has(message, "the JSON pointers to the schema's parts come to over 2097152 bytes"));
    // The pointer shown is cut: the message goes back to the client.
    CHECK(has(message, "schema at '#/properties/nnn"));
    CHECK(message.size() < 1000);
    // The same properties under a name of 1000 bytes compile.
    auto short_name = JsonSchema::compile(
        json::parse(R"({"type":"object","properties":{")" + std::string(1000, 'n') +
                    "\":" + object_of(30, R"({"type":"string"})") + "}}"));
    CHECK_MESSAGE(short_name.ok(), short_name.status().to_string());
}

// A union of 64 alternatives (U) and `refs` schemas that each refer to it by a name of its own.
// U's are 16 strings, arrays, objects and integers: no more begin alike than are followed at
// once (JsonSchema::kMaxReadings).
std::string union_referred(int refs) {
    std::string text = R"({"$defs":{"U":{"anyOf":[)";
    for (int i = 0; i < 16; ++i) {
        const std::string n = std::to_string(i);
        text += (i == 0 ? "" : ",") + std::string(R"({"type":"string","maxLength":)") + n +
                R"(},{"type":"array","maxItems":)" + n +
                R"(},{"type":"object","properties":{"k)" + n +
                R"(":{"type":"null"}},"required":["k)" + n + R"("]},)" +
                R"({"type":"integer","minimum":)" + std::to_string(i * 10) +
                R"(,"maximum":)" + std::to_string(i * 10 + 9) + "}";
    }
    text += "]}";
    for (int i = 0; i < refs; ++i) {
        text += ",\"V" + std::to_string(i) + R"(":{"$ref":"#/$defs/U"})";
    }
    text += R"(},"type":"object","properties":{)";
    for (int i = 0; i < refs; ++i) {
        text += (i == 0 ? "\"p" : ",\"p") + std::to_string(i) + R"(":{"$ref":"#/$defs/V)" +
                std::to_string(i) + "\"}";
    }
    return text + "}}";
}

TEST_CASE("json schema budget: unions gather at most kMaxFlattenedAlternatives alternatives") {
    // Each $ref to a union holds all of its alternatives once flattened, and every pass over the
    // graph looks through them: 7000 refs to a union of 256 took 380 ms. 300 refs to one of 64
    // are refused.
    const std::string message = refusal(union_referred(300));
    CAPTURE(message);
    CHECK(has(message, "the schema's unions gather over 16384 alternatives in all"));
    CHECK(has(message, "schema at '#/$defs/V"));
    // 250 refs gather 16000, and compile.
    auto many = JsonSchema::compile(json::parse(union_referred(250)));
    CHECK_MESSAGE(many.ok(), many.status().to_string());
}

TEST_CASE("json schema budget: an enum value's bytes count toward the steps of checking it") {
    // A value is checked against every alternative of an anyOf beside it, each literal
    // alternative writing it out anew (a 3 MB value under 256 enums took 1.8 s): its bytes are
    // steps, and those past the longest literal are not written.
    std::string text = R"({"type":"object","properties":{"a":{"type":"array","items":{"anyOf":[)";
    for (int i = 0; i < 255; ++i) {
        text += (i == 0 ? "" : ",") + std::string(R"({"enum":[)") + std::to_string(i) + "]}";
    }
    text += R"(,{"type":"string"}]},"enum":[[")" + std::string(60000, 'z') + R"("]]}}})";
    const std::string message = refusal(text);
    CAPTURE(message);
    CHECK(has(message,
              "schema at '#/properties/a': checking the values of 'enum'/'const' "
              "against the keywords beside them takes over 1048576 steps"));
    // A short value is checked against the same anyOf, and kept.
    text = text.substr(0, text.find(R"("enum":[[")")) + R"("enum":[["z"]]}}})";
    auto short_value = JsonSchema::compile(json::parse(text));
    CHECK_MESSAGE(short_value.ok(), short_value.status().to_string());
}

TEST_CASE("json schema budget: properties count toward the comparisons that show oneOf apart") {
    // Two objects of 1000 required properties, told apart by the last: each pair looked up each
    // property of one among all of the other's (a million key comparisons a pair, for each of
    // the oneOfs that refer to them). Now each property looked through is a comparison: 150
    // oneOfs of them are past those allowed, 20 are not.
    auto model = [](int tag) {
        std::string text = R"({"type":"object","properties":{)";
        std::string required;
        for (int i = 0; i < 999; ++i) {
            text += "\"k" + std::to_string(i) + R"(":{"type":"string"},)";
            required += "\"k" + std::to_string(i) + "\",";
        }
        return text + R"("d":{"const":)" + std::to_string(tag) + R"(}},"required":[)" + required +
               R"("d"]})";
    };
    auto one_ofs = [&](int count) {
        std::string text = R"({"$defs":{"A":)" + model(1) + R"(,"B":)" + model(2) +
                           R"(},"type":"object","properties":{)";
        for (int i = 0; i < count; ++i) {
            text += (i == 0 ? "\"p" : ",\"p") + std::to_string(i) +
                    R"(":{"oneOf":[{"$ref":"#/$defs/A"},{"$ref":"#/$defs/B"}]})";
        }
        return text + "}}";
    };
    const std::string message = refusal(one_ofs(150));
    CAPTURE(message);
    CHECK(has(message,
              "'oneOf' has too many alternatives to show apart (over 262144 "
              "comparisons of them, their properties and values)"));
    auto few = JsonSchema::compile(json::parse(one_ofs(20)));
    CHECK_MESSAGE(few.ok(), few.status().to_string());
}

}  // namespace
}  // namespace edge::engine::sampling
