#include "engine/sampling/sampler.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>

namespace edge::engine::sampling {
namespace {

SamplingParams greedy() {
    SamplingParams p;
    p.temperature = 0.0f;
    return p;
}

TokenId pick(Sampler& s, std::vector<float> logits) { return s.sample(logits).id; }

TEST_CASE("sampler: greedy takes the highest logit, ties to the lowest id") {
    Sampler s(greedy(), 1);
    CHECK(pick(s, {1.0f, 3.0f, 3.0f, 2.0f}) == 1);
    CHECK(pick(s, {5.0f, 5.0f}) == 0);
    CHECK(pick(s, {-1.0f, -0.5f, -3.0f}) == 1);
}

TEST_CASE("sampler: a vanishing temperature is greedy, not an overflow") {
    // 1/T of these overflows float: scaled logits of inf and NaN probabilities would pick the
    // last id.
    for (float t : {1e-40f, 1e-38f, 1e-30f, 1e-6f}) {
        SamplingParams p;
        p.temperature = t;
        Sampler s(p, 7);
        CHECK(pick(s, {1.0f, 3.0f, 2.0f, -1.0f}) == 1);
        CHECK(pick(s, {100.0f, -50.0f, 99.0f}) == 0);
    }
}

TEST_CASE("sampler: an infinite logit is drawn, under every cut, not read past the candidates") {
    // Softmax's limit: all the mass on the infinite one (the scheduler refuses such logits from
    // a model; this keeps the sampler itself safe).
    std::vector<float> logits(64, 0.5f);
    logits[7] = std::numeric_limits<float>::infinity();
    for (int variant = 0; variant < 4; ++variant) {
        SamplingParams p;
        p.temperature = 1.0f;
        p.top_p = variant == 1 ? 0.9f : 1.0f;
        p.top_k = variant == 2 ? 5 : 0;
        p.min_p = variant == 3 ? 0.1f : 0.0f;
        Sampler s(p, 3);
        for (int i = 0; i < 20; ++i) {
            CHECK(pick(s, logits) == 7);
        }
    }
}

TEST_CASE("sampler: logit_bias shifts the logits it names, not the logprobs") {
    SamplingParams p = greedy();
    p.logit_bias = {{1, -100.0f}, {3, 1.5f}};
    p.logprobs = true;
    Sampler s(p, 1);
    std::vector<float> logits = {1.0f, 3.0f, 2.0f, 1.0f};
    const SampledToken t = s.sample(logits);
    CHECK(t.id == 3);  // 1 + 1.5 beats 2; id 1 is banned.
    std::vector<float> lp;
    log_softmax(std::vector<float>{1.0f, 3.0f, 2.0f, 1.0f}, &lp);
    CHECK(t.logprob == doctest::Approx(lp[3]));

    SamplingParams bad = greedy();
    bad.logit_bias = {{2, 150.0f}};
    CHECK(validate_sampling_params(bad).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("sampler: presence penalty is subtracted once per generated token") {
    SamplingParams p = greedy();
    p.presence_penalty = 0.5f;
    Sampler s(p, 1);
    CHECK(pick(s, {0.0f, 1.0f, 0.9f}) == 1);  // 1.0 vs 0.9
    CHECK(pick(s, {0.0f, 1.0f, 0.9f}) == 2);  // 0.5 vs 0.9
    CHECK(pick(s, {0.0f, 1.0f, 0.9f}) == 1);  // 0.5 vs 0.4
    CHECK(pick(s, {0.0f, 1.0f, 0.9f}) == 1);  // still 0.5 vs 0.4: presence does not grow
}

TEST_CASE("sampler: frequency penalty grows with each occurrence") {
    SamplingParams p = greedy();
    p.frequency_penalty = 0.5f;
    Sampler s(p, 1);
    CHECK(pick(s, {0.0f, 2.0f, 1.2f}) == 1);  // 2.0 vs 1.2
    CHECK(pick(s, {0.0f, 2.0f, 1.2f}) == 1);  // 1.5 vs 1.2
    CHECK(pick(s, {0.0f, 2.0f, 1.2f}) == 2);  // 1.0 vs 1.2
    CHECK(pick(s, {0.0f, 2.0f, 1.2f}) == 1);  // 1.0 vs 0.7
}

std::vector<int> histogram(const SamplingParams& p, uint64_t seed, std::vector<float> logits,
                           int draws) {
    Sampler s(p, seed);
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < draws; ++i) {
        ++counts[pick(s, logits)];
    }
    return counts;
}

const std::vector<float> kProbs532 = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};

TEST_CASE("sampler: temperature 1 draws in proportion to the softmax") {
    SamplingParams p;
    const auto counts = histogram(p, 42, kProbs532, 20000);
    CHECK(counts[0] / 20000.0 == doctest::Approx(0.5).epsilon(0.04));
    CHECK(counts[1] / 20000.0 == doctest::Approx(0.3).epsilon(0.06));
    CHECK(counts[2] / 20000.0 == doctest::Approx(0.2).epsilon(0.08));
}

TEST_CASE("sampler: temperature sharpens or flattens the distribution") {
    SamplingParams cold;
    cold.temperature = 0.25f;  // probs ∝ p^4: 0.0625 : 0.0081 : 0.0016 -> 0.8727 share for id 0
    const auto c = histogram(cold, 7, kProbs532, 20000);
    CHECK(c[0] / 20000.0 == doctest::Approx(0.8727).epsilon(0.02));
    SamplingParams hot;
    hot.temperature = 2.0f;  // probs ∝ sqrt(p): 0.7071 : 0.5477 : 0.4472 -> 0.4155 for id 0
    const auto h = histogram(hot, 7, kProbs532, 20000);
    CHECK(h[0] / 20000.0 == doctest::Approx(0.4155).epsilon(0.04));
}

TEST_CASE("sampler: top-k keeps only the k best") {
    SamplingParams p;
    p.top_k = 2;
    const auto counts = histogram(p, 3, kProbs532, 5000);
    CHECK(counts[2] == 0);
    CHECK(counts[0] / 5000.0 == doctest::Approx(0.625).epsilon(0.06));  // 0.5 / 0.8
    p.top_k = 1;
    CHECK(histogram(p, 3, kProbs532, 100)[0] == 100);
}

TEST_CASE("sampler: top-p keeps the smallest set reaching the mass") {
    SamplingParams p;
    p.top_p = 0.5f;  // 0.5 alone reaches it
    CHECK(histogram(p, 5, kProbs532, 200)[0] == 200);
    p.top_p = 0.6f;  // needs 0.5 + 0.3
    const auto counts = histogram(p, 5, kProbs532, 5000);
    CHECK(counts[2] == 0);
    CHECK(counts[1] > 1000);
}

TEST_CASE("sampler: min-p drops tokens below min_p times the likeliest, before top-p") {
    SamplingParams p;
    p.min_p = 0.5f;  // 0.5 * 0.5 = 0.25: id 2 (0.2) is out; ids 0 and 1 keep 5 : 3.
    auto counts = histogram(p, 9, kProbs532, 8000);
    CHECK(counts[2] == 0);
    CHECK(counts[0] / 8000.0 == doctest::Approx(0.625).epsilon(0.05));
    p.min_p = 0.7f;  // 0.35: id 0 alone.
    CHECK(histogram(p, 9, kProbs532, 300)[0] == 300);
    p.min_p = 1.0f;  // The likeliest always stays.
    CHECK(histogram(p, 9, kProbs532, 300)[0] == 300);
    // Top-p then measures the mass of what min-p left: 0.5 / 0.8 = 0.625 >= 0.6 keeps id 0
    // alone (over the whole distribution, 0.5 < 0.6 would keep id 1 too).
    p.min_p = 0.5f;
    p.top_p = 0.6f;
    CHECK(histogram(p, 9, kProbs532, 300)[0] == 300);
    // After temperature: at 2.0 the probabilities are 0.4155 : 0.3218 : 0.2627, and min_p 0.7
    // (0.2909) keeps ids 0 and 1.
    SamplingParams hot;
    hot.temperature = 2.0f;
    hot.min_p = 0.7f;
    counts = histogram(hot, 9, kProbs532, 4000);
    CHECK(counts[2] == 0);
    CHECK(counts[1] > 1000);
}

TEST_CASE("sampler: repetition penalty divides the prompt's and the output's positive logits") {
    SamplingParams p = greedy();
    p.repetition_penalty = 2.0f;
    Sampler s(p, 1);
    const std::vector<TokenId> prompt = {0, 1};
    s.set_context(prompt, {});
    // Id 0 (in the prompt): 2.0 / 2 = 1.0 loses to id 2 (1.5); id 1: -1.0 * 2 = -2.0.
    CHECK(pick(s, {2.0f, -1.0f, 1.5f, 0.5f}) == 2);
    // Id 2 is generated now: 1.5 / 2 = 0.75 loses to id 3 (1.1) and id 0 (1.0).
    CHECK(pick(s, {2.0f, -1.0f, 1.5f, 1.1f}) == 3);
    // Once per distinct token, however often it occurred: 1.9 / 2 = 0.95 beats 0.9 / 2.
    CHECK(pick(s, {1.9f, -1.0f, 0.1f, 0.9f}) == 0);
    // 1 (the default) changes nothing.
    SamplingParams off = greedy();
    Sampler o(off, 1);
    o.set_context(prompt, {});
    CHECK(pick(o, {2.0f, -1.0f, 1.5f, 0.5f}) == 0);
}

TEST_CASE("sampler: min_tokens bans the end-of-sequence tokens until that many are generated") {
    SamplingParams p = greedy();
    p.min_tokens = 2;
    Sampler s(p, 1);
    const std::vector<TokenId> eos = {3, 4};
    s.set_context({}, eos);
    const std::vector<float> logits = {0.0f, 1.0f, 0.5f, 9.0f, 8.0f};
    CHECK(pick(s, logits) == 1);
    CHECK(pick(s, logits) == 1);
    CHECK(pick(s, logits) == 3);  // Two generated: the end may come.
    // The request's stop token ids are held off the same way.
    SamplingParams stops = greedy();
    stops.min_tokens = 1;
    stops.stop_token_ids = {2};
    Sampler t(stops, 1);
    t.set_context({}, eos);
    CHECK(pick(t, {0.0f, 1.0f, 5.0f, 0.0f, 0.0f}) == 1);
    CHECK(pick(t, {0.0f, 1.0f, 5.0f, 0.0f, 0.0f}) == 2);
    // Sampled rather than greedy: never an end token before min_tokens either.
    SamplingParams hot;
    hot.min_tokens = 50;
    Sampler h(hot, 5);
    h.set_context({}, eos);
    for (int i = 0; i < 50; ++i) {
        const TokenId id = pick(h, logits);
        CHECK(id != 3);
        CHECK(id != 4);
    }
}

TEST_CASE("sampler: a filter's refused tokens are never chosen, greedy or drawn") {
    // Ids 0..9 refused; the model wants them most.
    const TokenFilter even_above_nine = [](TokenId id) { return id >= 10 && id % 2 == 0; };
    std::vector<float> logits(64, 0.0f);
    for (int i = 0; i < 10; ++i) {
        logits[static_cast<size_t>(i)] = 10.0f - static_cast<float>(i);
    }
    logits[13] = 3.0f;  // Odd: refused too.
    logits[12] = 2.0f;
    Sampler g(greedy(), 1);
    std::vector<float> l = logits;
    CHECK(g.sample(l, &even_above_nine).id == 12);  // The best allowed.
    SamplingParams hot;
    Sampler h(hot, 3);
    std::map<TokenId, int> seen;
    for (int i = 0; i < 400; ++i) {
        l = logits;
        const TokenId id = h.sample(l, &even_above_nine).id;
        CHECK(even_above_nine(id));
        ++seen[id];
    }
    CHECK(seen[12] > 20);  // e^2 against e^0 for each of the other 26 allowed ids.
    // Logprobs stay the model's own, of the chosen token.
    SamplingParams lp = greedy();
    lp.logprobs = true;
    Sampler w(lp, 1);
    l = logits;
    std::vector<float> model;
    log_softmax(logits, &model);
    CHECK(w.sample(l, &even_above_nine).logprob == doctest::Approx(model[12]));
    // Nothing allowed: -1, drawn or not.
    const TokenFilter none = [](TokenId) { return false; };
    l = logits;
    CHECK(g.sample(l, &none).id == -1);
    l = logits;
    CHECK(h.sample(l, &none).id == -1);
}

TEST_CASE("sampler: every logit at -inf gives -1 and leaves the sampler as it was") {
    // Without a filter as with one: the -1 is not counted as a generated token (for the
    // penalties and min_tokens), nor looked up in the logprobs (before their first element).
    SamplingParams p;
    p.logprobs = true;
    p.top_logprobs = 2;
    p.presence_penalty = 1.0f;
    p.frequency_penalty = 0.5f;
    p.min_tokens = 1;
    const std::vector<TokenId> eos = {3};
    const std::vector<float> logits = {0.0f, 1.0f, 0.5f, 6.0f, 0.2f, -0.3f, 0.8f, 0.1f};
    constexpr uint64_t kSeed = 19;
    Sampler s(p, kSeed);
    s.set_context({}, eos);
    std::vector<float> out(8, -std::numeric_limits<float>::infinity());
    const SampledToken none = s.sample(out);
    CHECK(none.id == -1);
    CHECK(none.top.empty());
    // From then on, token for token what a fresh sampler of the same seed draws: the end token
    // (e^6, nearly all the mass) still held off for the first real token, the penalties those
    // of the real tokens alone.
    Sampler fresh(p, kSeed);
    fresh.set_context({}, eos);
    for (int i = 0; i < 16; ++i) {
        std::vector<float> a = logits, b = logits;
        const SampledToken got = s.sample(a);
        const SampledToken want = fresh.sample(b);
        CAPTURE(i);
        CHECK(got.id == want.id);
        CHECK(got.logprob == want.logprob);
    }
    // Greedy, the same -1.
    SamplingParams g = greedy();
    g.logprobs = true;
    Sampler gs(g, 1);
    std::fill(out.begin(), out.end(), -std::numeric_limits<float>::infinity());
    const SampledToken greedy_none = gs.sample(out);
    CHECK(greedy_none.id == -1);
    CHECK(greedy_none.top.empty());
}

TEST_CASE("sampler: a dominated distribution's least likely ids are drawn too, up to the last") {
    // One id at logit 0 and 151935 at ln(5.5e-8): each of those below half an f32 ulp of 1, so
    // an f32 running total of the probabilities drops the ones after the 1 in its lane, and a
    // draw scaled by that total never reached the last ids. The last 5% of the ids hold 4.1e-4
    // of the mass: found by chance they would take ~10^6 draws of 151936 ids. Instead the seeds
    // are chosen whose draw lands in the last 0.08% of the mass (by the 53-bit uniform the
    // default walk scales by the total, as FullSortNucleus::draw takes it), and each draw is
    // checked against the id an exact walk reaches: about half of them are in the tail.
    constexpr int32_t kVocab = 151936;
    const float small = std::log(5.5e-8f);
    std::vector<float> logits(kVocab, small);
    logits[0] = 0.0f;
    const double q = std::exp(static_cast<double>(small));
    const double total = 1.0 + (kVocab - 1) * q;
    constexpr int32_t kTail = kVocab - kVocab / 20;
    const double tail_share = (kVocab - kTail) * q / total;
    // The first id whose cumulative mass passes u * total.
    auto exact = [&](double u) {
        const double target = u * total;
        if (target < 1.0) {
            return 0;
        }
        return std::min(kVocab - 1, 1 + static_cast<int32_t>((target - 1.0) / q));
    };
    SamplingParams p;
    constexpr int kChosen = 100;
    int chosen = 0, in_tail = 0, want_in_tail = 0;
    for (uint64_t seed = 1; chosen < kChosen && seed < 4'000'000; ++seed) {
        std::mt19937_64 rng(seed);
        const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
        if (u < 1.0 - 2.0 * tail_share) {
            continue;
        }
        ++chosen;
        Sampler s(p, seed);
        const TokenId id = pick(s, logits);
        const int32_t want = exact(u);
        CAPTURE(seed);
        CHECK(std::abs(id - want) <= 2);  // The f32 exp's rounding: 0.03 ids here.
        in_tail += id >= kTail ? 1 : 0;
        want_in_tail += want >= kTail ? 1 : 0;
    }
    REQUIRE(chosen == kChosen);
    CHECK(want_in_tail > kChosen / 4);
    CHECK(std::abs(in_tail - want_in_tail) <= 2);
}

TEST_CASE("sampler: min-p is measured against the best token a filter allows") {
    // The model wants refused ids most; min_p 0.5 against the best of them would leave nothing
    // allowed. Against the best allowed (id 12, e^2) it keeps id 12 alone (e^0 < e^2 / 2).
    const TokenFilter even_above_nine = [](TokenId id) { return id >= 10 && id % 2 == 0; };
    std::vector<float> logits(64, 0.0f);
    for (int i = 0; i < 10; ++i) {
        logits[static_cast<size_t>(i)] = 10.0f - static_cast<float>(i);
    }
    logits[12] = 2.0f;
    SamplingParams p;
    p.min_p = 0.5f;
    Sampler s(p, 5);
    for (int i = 0; i < 50; ++i) {
        std::vector<float> l = logits;
        CHECK(s.sample(l, &even_above_nine).id == 12);
    }
}

TEST_CASE("sampler: top-k, top-p and min-p cut among the tokens a filter allows, masked first") {
    // Id 0 refused, the likeliest. As vLLM masks before it cuts, each cut is made over ids 1..3
    // alone. Redrawing after a refusal drew from the cut of every id first, and kept that draw
    // when it was allowed: top_k 2 over 0.5 (refused), 0.3, 0.2 gave the 0.3 three times in four.
    const TokenFilter not_zero = [](TokenId id) { return id != 0; };
    struct Case {
        std::string name;
        SamplingParams params;
        std::vector<double> probs;  // By id; the logits are their logs.
        std::vector<double> want;   // Mask first, then cut.
    };
    SamplingParams top_k;
    top_k.top_k = 2;
    SamplingParams top_p;
    top_p.top_p = 0.6f;  // Of ids 1..3 (0.5, 1/3, 1/6): 0.5 then 0.83 reaches it.
    SamplingParams min_p;
    min_p.min_p = 0.5f;           // Against 0.3, the best allowed: 0.2 stays, 0.1 does not.
    SamplingParams kept_allowed;  // The k best are allowed: the first draw stands.
    kept_allowed.top_k = 2;
    SamplingParams top_k_top_p;  // Top-p within the k best allowed.
    top_k_top_p.top_k = 3;
    top_k_top_p.top_p = 0.6f;
    SamplingParams top_p_zero;
    top_p_zero.top_p = std::numeric_limits<float>::min();  // top_p 0 as a request gives it.
    const std::vector<Case> cases = {
        {"top_k", top_k, {0.5, 0.3, 0.2, 0.0}, {0.0, 0.6, 0.4, 0.0}},
        {"top_p", top_p, {0.4, 0.3, 0.2, 0.1}, {0.0, 0.6, 0.4, 0.0}},
        {"min_p", min_p, {0.5, 0.3, 0.2, 0.1}, {0.0, 0.6, 0.4, 0.0}},
        {"top_k, the k best allowed", kept_allowed, {0.1, 0.5, 0.3, 0.1}, {0.0, 0.625, 0.375, 0.0}},
        // A refused id the draw never lands on changes the cut all the same: among ids 1..3 the
        // k best hold 0.8, and 0.5 reaches 0.6 of it alone; with the refused 0.15 they held 0.85.
        {"top_k and top_p", top_k_top_p, {0.15, 0.5, 0.2, 0.1}, {0.0, 1.0, 0.0, 0.0}},
        {"top_k and top_p, the k best allowed",
         top_k_top_p,
         {0.1, 0.5, 0.25, 0.15},
         {0.0, 2.0 / 3, 1.0 / 3, 0.0}},
        // 0.5 of 0.8 allowed reaches 0.6; of the 1.0 in all it did not.
        {"top_p, the refused one outside the nucleus",
         top_p,
         {0.2, 0.5, 0.3, 0.0},
         {0.0, 1.0, 0.0, 0.0}},
        {"top_p 0", top_p_zero, {0.5, 0.3, 0.2, 0.0}, {0.0, 1.0, 0.0, 0.0}},
    };
    constexpr int kDraws = 20000;  // One standard deviation of a frequency: 0.0035 at most.
    for (const Case& c : cases) {
        CAPTURE(c.name);
        std::vector<float> logits;
        for (double p : c.probs) {
            logits.push_back(p > 0.0 ? static_cast<float>(std::log(p))
                                     : -std::numeric_limits<float>::infinity());
        }
        Sampler s(c.params, 11);
        std::vector<int> seen(logits.size(), 0);
        for (int i = 0; i < kDraws; ++i) {
            std::vector<float> l = logits;
            const TokenId id = s.sample(l, &not_zero).id;
            REQUIRE(id >= 1);
            ++seen[static_cast<size_t>(id)];
        }
        for (size_t id = 0; id < logits.size(); ++id) {
            CAPTURE(id);
            CHECK(std::abs(static_cast<double>(seen[id]) / kDraws - c.want[id]) < 0.015);
        }
    }
}

// Top-p as a full sort of the vocabulary computes it: ids by value (ties to the lower id),
// e^(x - max) in double, the smallest prefix reaching top_p of the whole mass.
struct FullSortNucleus {
    std::vector<int32_t> order;
    std::vector<double> probs;
    size_t kept = 0;
    double mass = 0.0;

    FullSortNucleus(const std::vector<float>& logits, float top_p) : order(logits.size()) {
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
        });
        double total = 0.0;
        for (int32_t id : order) {
            probs.push_back(std::exp(static_cast<double>(logits[id]) - logits[order[0]]));
            total += probs.back();
        }
        while (kept < probs.size() && mass < top_p * total) {
            mass += probs[kept++];
        }
    }

    // The sampler's walk from the same 53-bit uniform.
    TokenId draw(std::mt19937_64& rng) const {
        double target = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0) * mass;
        for (size_t i = 0; i < kept; ++i) {
            target -= probs[i];
            if (target < 0.0) {
                return order[i];
            }
        }
        return order[kept - 1];
    }
};

TEST_CASE("sampler: top-p over a large vocabulary draws as a full sort would") {
    // 40000 ids in a shuffled order. Steep: the id of rank r at logit -r / 1000, so top_p 0.2,
    // 0.5 and 0.99 keep 224, 694 and 4606 ids, all above the first cut of the candidates (6932
    // of them, among which the nucleus is selected by radix). Heavy tail: one id at 0 and the rest
    // from -8 down by 1e-5 a rank (each below 1/1024 of the best, together 13x its mass): the
    // nucleus needs the second cut, and a near-flat order.
    constexpr int32_t kVocab = 40000;
    std::vector<int32_t> rank(kVocab);
    std::iota(rank.begin(), rank.end(), 0);
    std::shuffle(rank.begin(), rank.end(), std::mt19937(11));
    std::vector<float> steep(kVocab), tail(kVocab);
    for (size_t id = 0; id < kVocab; ++id) {
        const auto r = static_cast<float>(rank[id]);
        steep[id] = -r / 1000;
        tail[id] = rank[id] == 0 ? 0.0f : -8.0f - r * 1e-5f;
    }
    struct Case {
        const std::vector<float>* logits;
        float top_p;
        bool walked_sorted;  // At most kSortedNucleus ids: walked in value order.
    };
    for (const Case& c :
         {Case{&steep, 0.2f, true}, Case{&steep, 0.5f, true}, Case{&steep, 0.99f, false},
          Case{&tail, 0.5f, false}, Case{&tail, 0.95f, false}}) {
        const FullSortNucleus want(*c.logits, c.top_p);
        CAPTURE(c.top_p);
        CAPTURE(want.kept);
        // The mean and spread of the rank a draw from the nucleus has.
        double mean = 0.0, square = 0.0;
        for (size_t i = 0; i < want.kept; ++i) {
            mean += static_cast<double>(i) * want.probs[i] / want.mass;
            square += static_cast<double>(i * i) * want.probs[i] / want.mass;
        }
        const double spread = std::sqrt(square - mean * mean);
        SamplingParams p;
        p.top_p = c.top_p;
        constexpr uint64_t kSeed = 21;
        Sampler s(p, kSeed);
        std::mt19937_64 rng(kSeed);
        int same = 0;
        size_t deepest = 0;
        double sum = 0.0;
        constexpr int kDraws = 3000;
        for (int i = 0; i < kDraws; ++i) {
            const TokenId id = pick(s, *c.logits);
            REQUIRE(id >= 0);
            const auto at = static_cast<size_t>(
                std::find(want.order.begin(), want.order.end(), id) - want.order.begin());
            CHECK(at < want.kept);
            deepest = std::max(deepest, at);
            sum += static_cast<double>(at);
            same += id == want.draw(rng) ? 1 : 0;
        }
        CHECK(deepest > want.kept * 9 / 10);  // The tail of the nucleus is drawn too.
        CHECK(std::fabs(sum / kDraws - mean) < 5 * spread / std::sqrt(kDraws) + 1);
        if (c.walked_sorted) {
            // The same draws but where the f32 exp and sum round a uniform to the next id.
            CHECK(same >= kDraws - 10);
        }
    }
    // Top-k from the candidates: the 300 best ids of the steep order, the last of them drawn too
    // (each about e^-0.3 as likely as the best).
    SamplingParams k;
    k.top_k = 300;
    Sampler s(k, 4);
    int32_t deepest = 0;
    for (int i = 0; i < 3000; ++i) {
        const int32_t r = rank[static_cast<size_t>(pick(s, steep))];
        CHECK(r < 300);
        deepest = std::max(deepest, r);
    }
    CHECK(deepest >= 290);
}

TEST_CASE("sampler: the same seed gives the same tokens, another seed others") {
    SamplingParams p;
    std::vector<float> flat(64, 0.0f);
    auto run = [&](uint64_t seed) {
        Sampler s(p, seed);
        std::vector<TokenId> out;
        for (int i = 0; i < 32; ++i) {
            out.push_back(pick(s, flat));
        }
        return out;
    };
    CHECK(run(11) == run(11));
    CHECK(run(11) != run(12));
}

TEST_CASE("sampler: logprobs are the model's log-softmax, whatever temperature and penalties") {
    SamplingParams p = greedy();
    p.logprobs = true;
    p.top_logprobs = 2;
    Sampler s(p, 1);
    std::vector<float> logits = {0.0f, std::log(2.0f), 0.0f};  // probs 0.25, 0.5, 0.25
    const SampledToken t = s.sample(logits);
    CHECK(t.id == 1);
    CHECK(t.logprob == doctest::Approx(std::log(0.5)));
    REQUIRE(t.top.size() == 2);
    CHECK(t.top[0].first == 1);
    CHECK(t.top[1].first == 0);  // tie with id 2 goes to the lower id
    CHECK(t.top[1].second == doctest::Approx(std::log(0.25)));

    // Temperature 2 would make these 1/4, 3/4, a frequency penalty lower id 1 after its first
    // draw: the reported values stay the model's 1/10, 9/10 on every draw.
    SamplingParams hot;
    hot.temperature = 2.0f;
    hot.frequency_penalty = 2.0f;
    hot.logprobs = true;
    hot.top_logprobs = 2;
    Sampler h(hot, 1);
    for (int i = 0; i < 4; ++i) {
        std::vector<float> l2 = {0.0f, 2.0f * std::log(3.0f)};
        const SampledToken u = h.sample(l2);
        CHECK(u.logprob == doctest::Approx(u.id == 1 ? std::log(0.9) : std::log(0.1)));
        REQUIRE(u.top.size() == 2);
        CHECK(u.top[0].first == 1);
        CHECK(u.top[0].second == doctest::Approx(std::log(0.9)));
    }
}

TEST_CASE("sampler: bad values are rejected naming the field") {
    struct Case {
        void (*set)(SamplingParams&);
        const char* field;
    };
    const std::vector<Case> cases = {
        {[](SamplingParams& p) { p.temperature = -1.0f; }, "temperature"},
        {[](SamplingParams& p) { p.temperature = NAN; }, "temperature"},
        {[](SamplingParams& p) { p.top_p = 0.0f; }, "top_p"},
        {[](SamplingParams& p) { p.top_k = -1; }, "top_k"},
        {[](SamplingParams& p) { p.presence_penalty = 3.0f; }, "presence_penalty"},
        {[](SamplingParams& p) { p.frequency_penalty = -2.5f; }, "frequency_penalty"},
        {[](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens"},
        {[](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty"},
        {[](SamplingParams& p) { p.repetition_penalty = 2.5f; }, "repetition_penalty"},
        {[](SamplingParams& p) { p.min_p = 1.5f; }, "min_p"},
        {[](SamplingParams& p) { p.min_p = -0.1f; }, "min_p"},
        {[](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens"},
        {[](SamplingParams& p) { p.stop_token_ids = {-3}; }, "stop_token_ids"},
        {[](SamplingParams& p) { p.stop_token_ids = std::vector<TokenId>(65, 1); },
         "stop_token_ids"},
        {[](SamplingParams& p) {
             p.max_tokens = 8;
             p.min_tokens = 9;
         },
         "min_tokens"},
        {[](SamplingParams& p) { p.top_logprobs = 21; }, "top_logprobs"},
        {[](SamplingParams& p) {
             p.stop = {"ok", ""};
         },
         "stop[1]"},
        {[](SamplingParams& p) { p.stop = {"\xFF"}; }, "stop[0]"},
    };
    CHECK(validate_sampling_params(SamplingParams{}).ok());
    for (const Case& c : cases) {
        SamplingParams p;
        c.set(p);
        const Status st = validate_sampling_params(p);
        CHECK(st.code() == StatusCode::kInvalidArgument);
        CHECK(st.message().find(c.field) == 0);
    }
}

}  // namespace
}  // namespace edge::engine::sampling
