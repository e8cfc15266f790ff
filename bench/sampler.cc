// Sampling cost per token: Sampler::sample() over the vocabulary sizes of the served
// architectures (the bench preset's 32000, Qwen3-MoE 151936, GLM-4.5 151552, DeepSeek-V3 and
// Kimi K2 163840), for greedy, temperature, top-p, top-k with top-p, min-p and 5 logprobs. The
// scheduler samples each sequence of a step in turn, so at 64 sequences a millisecond here is
// 64 ms of every step. Logits are normal with sigma 3 ("peaked", as a language model's: a few
// hundred ids hold 95% of the mass) or 0.5 ("flat": top-p keeps most of the vocabulary, the
// worst case). Each figure is the median of --samples calls, in milliseconds and as a ratio to
// one pass over the logits (std::max_element) measured in the same run; top-p also against a
// full sort of the vocabulary, the way it used to be drawn (15 ms at 150k ids).
// A second table times response_format's filter (JsonTokenCheck over JsonPrefix) asking about
// every token once, what the sampler does when the model's likeliest tokens are refused: over a
// synthetic 151936-token vocabulary (words with and without a leading space, digits, JSON
// punctuation), at points of a json_schema document and of a json_object one, against the same
// pass without the first-byte shortcut and against the pass over the logits; and in keys of an
// object listing 1024 properties (the most one may), which the filter looks through by name.
//   bench_sampler [--samples N]            # tables, then one JSON line

#include "engine/sampling/sampler.h"

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_cli.h"
#include "engine/sampling/json_prefix.h"
#include "engine/sampling/json_schema.h"

using edge::engine::SamplingParams;
using edge::engine::TokenId;
using edge::engine::sampling::ArgumentPairs;
using edge::engine::sampling::JsonPrefix;
using edge::engine::sampling::JsonReply;
using edge::engine::sampling::JsonSchema;
using edge::engine::sampling::JsonTokenCheck;
using edge::engine::sampling::Sampler;

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <typename Fn>
double median_ms(int samples, Fn&& fn) {
    std::vector<double> ms;
    for (int i = 0; i < samples; ++i) {
        const auto start = std::chrono::steady_clock::now();
        fn();
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
    }
    return median(std::move(ms));
}

// Top-p by sorting every id (value descending, ties to the lower id), exp in float, the prefix
// reaching the mass: the sampler's former method, for comparison (its last id is returned; the
// draw's walk over the prefix, the same in both methods, is left out).
TokenId full_sort_top_p(const std::vector<float>& logits, float top_p, std::vector<int32_t>& order,
                        std::vector<float>& probs) {
    order.resize(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    probs.resize(logits.size());
    double total = 0.0;
    for (size_t i = 0; i < order.size(); ++i) {
        probs[i] = std::exp(logits[order[i]] - logits[order[0]]);
        total += probs[i];
    }
    double mass = 0.0;
    size_t kept = 0;
    while (kept < probs.size() && mass < top_p * total) {
        mass += probs[kept++];
    }
    return order[kept - 1];
}

struct Mode {
    const char* name;
    float temperature;
    float top_p;
    int32_t top_k;
    float min_p;
    int32_t top_logprobs;  // > 0: logprobs with this many alternatives.
};

constexpr Mode kModes[] = {
    {"greedy", 0.0f, 1.0f, 0, 0.0f, 0}, {"temperature", 0.7f, 1.0f, 0, 0.0f, 0},
    {"top_p", 0.6f, 0.95f, 0, 0.0f, 0}, {"top_k+top_p", 0.6f, 0.95f, 20, 0.0f, 0},
    {"min_p", 0.7f, 1.0f, 0, 0.05f, 0}, {"logprobs_5", 0.7f, 1.0f, 0, 0.0f, 5},
};

SamplingParams params_of(const Mode& m) {
    SamplingParams p;
    p.temperature = m.temperature;
    p.top_p = m.top_p;
    p.top_k = m.top_k;
    p.min_p = m.min_p;
    p.logprobs = m.top_logprobs > 0;
    p.top_logprobs = m.top_logprobs;
    return p;
}

// Token texts shaped like a byte-level BPE vocabulary's: words, often after a space, digit runs,
// JSON punctuation runs.
std::vector<std::string> synthetic_vocabulary(size_t n, std::mt19937& gen) {
    const std::string letters = "etaoinshrdlucmfwypvbgkqjxz";
    const std::string punctuation = "\",:{}[] .-\n";
    std::vector<std::string> vocab(n);
    for (std::string& t : vocab) {
        const uint32_t kind = gen() % 10;
        const size_t len = 1 + gen() % 7;
        if (kind < 7) {
            if (kind < 4) {
                t += ' ';
            }
            for (size_t i = 0; i < len; ++i) {
                t += letters[gen() % 8 == 0 ? gen() % letters.size() : gen() % 10];
            }
        } else if (kind < 8) {
            for (size_t i = 0; i < len; ++i) {
                t += static_cast<char>('0' + gen() % 10);
            }
        } else {
            for (size_t i = 0; i < (len + 1) / 2; ++i) {
                t += punctuation[gen() % punctuation.size()];
            }
        }
    }
    return vocab;
}

// What a filter point's text is held to.
enum class Form {
    kObject,    // Any object (json_object).
    kSchema,    // The schema below.
    kPairs,     // The schema below, as GLM-4.5's argument pairs ("name" and "note" raw strings).
    kWide,      // wide_schema(): as many optional properties as one object may list.
    kReading,   // readings_schema(1): a string property.
    kReadings,  // readings_schema(16): the same as an anyOf the prefix reads 16 ways.
};

struct FilterPoint {
    const char* name;
    Form form;
    const char* prefix;  // The text so far.
};

constexpr const char* kFilterSchema =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":40},)"
    R"("tags":{"type":"array","items":{"enum":["red","green","blue"]}},)"
    R"("age":{"type":"integer","minimum":0,"maximum":150},"note":{"type":"string"}},)"
    R"("required":["name","tags","age"],"additionalProperties":false})";

constexpr FilterPoint kFilterPoints[] = {
    {"schema_string", Form::kSchema, R"({"name":"Ada)"},
    {"schema_key", Form::kSchema, R"({"name":"Ada",)"},
    {"schema_enum", Form::kSchema, R"({"name":"Ada","tags":[)"},
    {"schema_integer", Form::kSchema, R"({"name":"Ada","tags":[],"age":1)"},
    {"object_string", Form::kObject, R"({"name":"Ada)"},
    {"object_value", Form::kObject, R"({"name":)"},
    {"pairs_string", Form::kPairs, "<arg_key>name</arg_key>\n<arg_value>Ada"},
    {"pairs_key", Form::kPairs, "<arg_key>name</arg_key>\n<arg_value>Ada</arg_value>\n<arg_key>"},
    {"pairs_enum", Form::kPairs,
     "<arg_key>name</arg_key>\n<arg_value>Ada</arg_value>\n<arg_key>tags</arg_key>\n"
     "<arg_value>["},
    // Keys of wide_schema(): the first key's first byte, its second, and a key after the 1000th
    // property (only the last 23 may still come).
    {"wide_key", Form::kWide, R"({")"},
    {"wide_key_mid", Form::kWide, R"({"ta)"},
    {"wide_key_late", Form::kWide, R"({"teee":1,")"},
    // In a string that one reading follows, and that JsonPrefix::kMaxReadings do.
    {"reading_string", Form::kReading, R"({"note":"Ada)"},
    {"readings_string", Form::kReadings, R"({"note":"Ada)"},
};

// The letters of wide_schema()'s names, those synthetic_vocabulary() draws most (a name is its
// index written with them as digits, so names share prefixes as a vocabulary's words do).
constexpr std::string_view kWideLetters = "etaoinshrd";

// An object of JsonSchema::kMaxObjectProperties optional integer properties named "eee",
// "eet", ..., "ddd", then "teee", "teet", ...: the most a filter walks through inside a key.
std::string wide_schema() {
    std::string s = R"({"type":"object","properties":{)";
    for (size_t i = 0; i < JsonSchema::kMaxObjectProperties; ++i) {
        std::string name;
        for (size_t v = i, digits = 0; digits < 3 || v > 0; v /= 10, ++digits) {
            name.insert(name.begin(), kWideLetters[v % 10]);
        }
        s += (i == 0 ? "\"" : ",\"") + name + R"(":{"type":"integer"})";
    }
    return s + R"(},"additionalProperties":false})";
}

// An object whose one property is a string under an anyOf of `n` alternatives that differ in
// their maxLength only: until the string is 40 characters long every one of them reads it.
std::string readings_schema(size_t n) {
    std::string s = R"({"type":"object","properties":{"note":{"anyOf":[)";
    for (size_t i = 0; i < n; ++i) {
        s += (i == 0 ? "" : ",") + std::string(R"({"type":"string","maxLength":)") +
             std::to_string(40 + i) + "}";
    }
    return s + R"(]}},"required":["note"],"additionalProperties":false})";
}

}  // namespace

int main(int argc, char** argv) {
    int samples = 101;
    edge::bench::parse_flags(
        argc, argv, {edge::bench::Flag::integer("--samples", &samples, 5, "calls per figure")},
        "bench_sampler: milliseconds per sampled token against one pass over the logits");
    std::printf("%8s %7s %-12s %10s %10s %12s %10s\n", "vocab", "dist", "mode", "ms", "x_pass",
                "full_sort_ms", "speedup");
    std::string json =
        "{\"bench\":\"sampler\",\"samples\":" + std::to_string(samples) + ",\"rows\":[";
    bool first = true;
    std::mt19937 gen(20261203);
    std::vector<float> logits, work;
    std::vector<int32_t> order;
    std::vector<float> probs;
    for (int vocab : {32000, 151552, 151936, 163840}) {
        for (const auto& [dist, sigma] : {std::pair{"peaked", 3.0f}, {"flat", 0.5f}}) {
            std::normal_distribution<float> normal(0.0f, sigma);
            logits.resize(static_cast<size_t>(vocab));
            for (float& x : logits) {
                x = normal(gen);
            }
            volatile float sink = 0.0f;
            const double pass_ms =
                median_ms(samples, [&] { sink = *std::max_element(logits.begin(), logits.end()); });
            for (const Mode& m : kModes) {
                Sampler s(params_of(m), 7);
                std::vector<double> ms;
                for (int i = 0; i < samples; ++i) {
                    work = logits;  // sample() overwrites them; not timed.
                    const auto start = std::chrono::steady_clock::now();
                    sink = static_cast<float>(s.sample(work).id);
                    ms.push_back(std::chrono::duration<double, std::milli>(
                                     std::chrono::steady_clock::now() - start)
                                     .count());
                }
                const double got = median(std::move(ms));
                double sorted_ms = 0.0;
                if (std::string(m.name) == "top_p") {
                    std::vector<float> scaled = logits;
                    for (float& x : scaled) {
                        x /= m.temperature;
                    }
                    sorted_ms = median_ms(samples, [&] {
                        sink = static_cast<float>(full_sort_top_p(scaled, m.top_p, order, probs));
                    });
                }
                std::printf("%8d %7s %-12s %10.4f %10.2f", vocab, dist, m.name, got, got / pass_ms);
                if (sorted_ms > 0.0) {
                    std::printf(" %12.4f %10.1f\n", sorted_ms, sorted_ms / got);
                } else {
                    std::printf(" %12s %10s\n", "-", "-");
                }
                char buf[320];
                std::snprintf(buf, sizeof(buf),
                              "%s{\"vocab\":%d,\"dist\":\"%s\",\"mode\":\"%s\",\"ms\":%.5f,"
                              "\"pass_ms\":%.5f,\"over_pass\":%.3f%s",
                              first ? "" : ",", vocab, dist, m.name, got, pass_ms, got / pass_ms,
                              sorted_ms > 0.0 ? "," : "}");
                json += buf;
                if (sorted_ms > 0.0) {
                    std::snprintf(buf, sizeof(buf), "\"full_sort_ms\":%.5f,\"speedup\":%.2f}",
                                  sorted_ms, sorted_ms / got);
                    json += buf;
                }
                first = false;
            }
        }
    }
    json += "],\"json_filter\":[";

    // response_format's filter over every token once.
    const std::vector<std::string> vocab = synthetic_vocabulary(151936, gen);
    const auto schema = JsonSchema::compile(boost::json::parse(kFilterSchema));
    const auto wide = JsonSchema::compile(boost::json::parse(wide_schema()));
    const auto reading = JsonSchema::compile(boost::json::parse(readings_schema(1)));
    const auto readings =
        JsonSchema::compile(boost::json::parse(readings_schema(JsonPrefix::kMaxReadings)));
    for (const auto* compiled : {&schema, &wide, &reading, &readings}) {
        if (!compiled->ok()) {
            std::fprintf(stderr, "bench_sampler: %s\n", compiled->status().to_string().c_str());
            return 1;
        }
    }
    std::printf("\nresponse_format filter, every token of a %zu-token synthetic vocabulary once\n",
                vocab.size());
    std::printf("%-16s %10s %10s %12s %10s\n", "point", "accepted", "ms", "no_first_ms", "x_pass");
    {
        std::normal_distribution<float> normal(0.0f, 3.0f);
        logits.resize(vocab.size());
        for (float& x : logits) {
            x = normal(gen);
        }
    }
    volatile float sink = 0.0f;
    const double pass_ms =
        median_ms(samples, [&] { sink = *std::max_element(logits.begin(), logits.end()); });
    first = true;
    for (const FilterPoint& point : kFilterPoints) {
        JsonReply reply;
        reply.schema = point.form == Form::kObject     ? JsonSchema::any_object()
                       : point.form == Form::kWide     ? *wide
                       : point.form == Form::kReading  ? *reading
                       : point.form == Form::kReadings ? *readings
                                                       : *schema;
        if (point.form == Form::kPairs) {
            reply.pairs = std::make_shared<const ArgumentPairs>(ArgumentPairs{{"name", "note"}});
            reply.tail = "</tool_call>";
        }
        JsonPrefix prefix(reply);
        if (!prefix.feed(point.prefix)) {
            std::fprintf(stderr, "bench_sampler: %s refused\n", point.prefix);
            return 1;
        }
        int accepted = 0;
        const double ms = median_ms(samples, [&] {
            JsonTokenCheck check(prefix);
            accepted = 0;
            for (const std::string& t : vocab) {
                accepted += check(t) ? 1 : 0;
            }
        });
        const double plain_ms = median_ms(samples, [&] {
            int n = 0;
            for (const std::string& t : vocab) {
                n += prefix.accepts(t) ? 1 : 0;
            }
            sink = static_cast<float>(n);
        });
        std::printf("%-16s %10d %10.3f %12.3f %10.1f\n", point.name, accepted, ms, plain_ms,
                    ms / pass_ms);
        char buf[256];
        std::snprintf(buf, sizeof(buf),
                      "%s{\"point\":\"%s\",\"accepted\":%d,\"ms\":%.4f,\"no_first_byte_ms\":%.4f,"
                      "\"pass_ms\":%.5f,\"over_pass\":%.2f}",
                      first ? "" : ",", point.name, accepted, ms, plain_ms, pass_ms, ms / pass_ms);
        json += buf;
        first = false;
    }
    json += "]}";
    std::printf("%s\n", json.c_str());
    return 0;
}
