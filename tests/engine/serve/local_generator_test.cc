#include "engine/sched/local_generator.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "tests/engine/serve/collecting_sink.h"
#include "tests/engine/serve/fake_causal_lm.h"

namespace edge::engine::sched {
namespace {

using testing::CollectingSink;
using testing::FakeCausalLM;
using testing::FakeOptions;

const std::string kMicro = EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe";

ServedModel fake_model(const std::string& name, FakeOptions opts,
                       std::shared_ptr<testing::FakeLog> log = nullptr) {
    ServedModel m;
    m.config.name = name;
    m.model = std::make_unique<FakeCausalLM>(opts, std::move(log));
    auto tok = tokenizer::Tokenizer::load_file(kMicro + "/tokenizer.json");
    REQUIRE(tok.ok());
    m.tokenizer = std::move(tok).value();
    auto cfg = tokenizer::load_tokenizer_config(kMicro);
    REQUIRE(cfg.ok());
    m.tokenizer_config = *cfg;
    m.created_unix = 1700000000;
    return m;
}

std::unique_ptr<LocalGenerator> make_generator(FakeOptions opts = {}, EngineConfig config = {},
                                               std::shared_ptr<testing::FakeLog> log = nullptr) {
    std::vector<ServedModel> models;
    models.push_back(fake_model("micro", opts, std::move(log)));
    auto gen = LocalGenerator::create(std::move(models), config, 42);
    REQUIRE_MESSAGE(gen.ok(), gen.status().to_string());
    return std::move(gen).value();
}

GenerateRequest request(std::vector<TokenId> prompt, int max_tokens) {
    GenerateRequest r;
    r.model = "micro";
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    return r;
}

TEST_CASE("local generator: models() describes each served model") {
    auto gen = make_generator();
    const auto infos = gen->models();
    REQUIRE(infos.size() == 1);
    CHECK(infos[0].name == "micro");
    CHECK(infos[0].architecture == "FakeForCausalLM");
    CHECK(infos[0].context_length == 256);
    CHECK(infos[0].created_unix == 1700000000);
    CHECK_FALSE(infos[0].thinks);  // No <think> in its vocabulary.
    CHECK(gen->ready());
}

TEST_CASE("local generator: submit validates the request and names the field") {
    auto gen = make_generator();
    auto sink = std::make_shared<CollectingSink>();
    struct Case {
        GenerateRequest req;
        StatusCode code;
        const char* prefix;
    };
    std::vector<Case> cases;
    {
        GenerateRequest r = request({1}, 4);
        r.model = "nope";
        cases.push_back({r, StatusCode::kNotFound, "model"});
    }
    cases.push_back({request({}, 4), StatusCode::kInvalidArgument, "prompt: empty"});
    {
        GenerateRequest r = request({1}, 4);
        r.prompt = std::string();
        cases.push_back({r, StatusCode::kInvalidArgument, "prompt: empty"});
    }
    {
        GenerateRequest r = request({1}, 4);
        r.prompt = std::string("bad \xC3(");
        cases.push_back({r, StatusCode::kInvalidArgument, "prompt: text is not valid UTF-8"});
    }
    cases.push_back({request({1, 512}, 4), StatusCode::kInvalidArgument, "prompt[1]"});
    cases.push_back({request({1, -1}, 4), StatusCode::kInvalidArgument, "prompt[1]"});
    cases.push_back({request({1, 2}, 255), StatusCode::kOutOfRange, "prompt: the prompt (2"});
    {
        // A default max_tokens is lowered to fit, but a prompt that fills the context is refused.
        GenerateRequest r = request(std::vector<TokenId>(256, 1), 4);
        r.max_tokens_is_default = true;
        cases.push_back({r, StatusCode::kOutOfRange, "prompt: the prompt (256"});
    }
    {
        // A default max_tokens lowered below min_tokens: the minimum cannot be generated.
        GenerateRequest r = request(std::vector<TokenId>(200, 1), 100000);
        r.max_tokens_is_default = true;
        r.sampling.min_tokens = 57;
        cases.push_back({r, StatusCode::kInvalidArgument, "min_tokens: 57 is more than the 56"});
    }
    {
        GenerateRequest r = request({1}, 300);
        ChatMessage hi;
        hi.role = "user";
        hi.content = "hi";
        r.prompt = std::vector<ChatMessage>{hi};
        cases.push_back({r, StatusCode::kOutOfRange, "messages: the prompt"});
    }
    {
        GenerateRequest r = request({1}, 4);
        r.sampling.temperature = 5.0f;
        cases.push_back({r, StatusCode::kInvalidArgument, "temperature"});
    }
    {
        GenerateRequest r = request({1}, 4);
        r.prompt = std::vector<ChatMessage>{};
        cases.push_back({r, StatusCode::kInvalidArgument, "messages"});
    }
    for (Case& c : cases) {
        auto handle = gen->submit(c.req, sink);
        REQUIRE_FALSE(handle.ok());
        CAPTURE(handle.status().to_string());
        CHECK(handle.status().code() == c.code);
        CHECK(handle.status().message().find(c.prefix) == 0);
    }
    // Exactly at the context limit is fine.
    auto ok = gen->submit(request({1, 2}, 254), sink);
    CHECK(ok.ok());
}

TEST_CASE("local generator: text and chat prompts are tokenized with the model's tokenizer") {
    FakeOptions opts;
    std::vector<std::vector<TokenId>> seen;
    std::mutex mu;
    opts.next = [&](std::span<const TokenId> history) -> TokenId {
        std::lock_guard<std::mutex> lock(mu);
        seen.emplace_back(history.begin(), history.end());
        return 509;  // EOS at once.
    };
    auto gen = make_generator(opts);
    GenerateRequest text = request({}, 4);
    text.prompt = std::string("Hello, world!");
    auto sink = std::make_shared<CollectingSink>();
    REQUIRE(gen->submit(text, sink).ok());
    REQUIRE(sink->wait());
    CHECK(sink->wait()->usage.prompt_tokens == 11);

    GenerateRequest chat = request({}, 4);
    chat.prompt = std::vector<ChatMessage>{{"user", "hi", ""}};
    auto chat_sink = std::make_shared<CollectingSink>();
    REQUIRE(gen->submit(chat, chat_sink).ok());
    REQUIRE(chat_sink->wait());
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(seen.size() == 2);
    CHECK(seen[0] == std::vector<TokenId>{72, 397, 108, 111, 44, 278, 111, 114, 108, 100, 33});
    // <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n
    const auto tail = std::vector<TokenId>(seen[1].begin(), seen[1].begin() + 7);
    CHECK(tail == std::vector<TokenId>{510, 117, 115, 403, 10, 472, 511});
    CHECK(seen[1][7] == 10);
    CHECK(seen[1][8] == 510);
    CHECK(seen[1].back() == 10);
}

TEST_CASE("local generator: prompt_token_ids are what submit runs, BOS included, and run alike") {
    // A model whose tokenizer_config adds a BOS (generation_config's 509): the ids measured
    // before submitting hold it, and submitted in place of the text they run as it does.
    FakeOptions opts;
    opts.prefix_cache = false;  // The second request computes its prompt as the first did.
    ServedModel m = fake_model("micro", opts);
    m.tokenizer_config.add_bos_token = true;
    m.tokenizer_config.generation_bos_id = 509;
    std::vector<ServedModel> models;
    models.push_back(std::move(m));
    auto created = LocalGenerator::create(std::move(models), EngineConfig{}, 1);
    REQUIRE_MESSAGE(created.ok(), created.status().to_string());
    LocalGenerator& gen = **created;
    GenerateRequest text = request({}, 3);
    text.prompt = std::string("Hello, world!");
    text.echo_prompt = true;
    text.sampling.logprobs = true;
    text.sampling.top_logprobs = 2;
    auto ids = gen.prompt_token_ids(text);
    REQUIRE_MESSAGE(ids.ok(), ids.status().to_string());
    CHECK(*ids == std::vector<TokenId>{509, 72, 397, 108, 111, 44, 278, 111, 114, 108, 100, 33});
    GenerateRequest as_ids = text;
    as_ids.prompt = *ids;
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (const GenerateRequest& r : {text, as_ids}) {
        sinks.push_back(std::make_shared<CollectingSink>());
        REQUIRE(gen.submit(r, sinks.back()).ok());
        REQUIRE(sinks.back()->wait());
    }
    CHECK(sinks[0]->wait()->usage.prompt_tokens == 12);
    CHECK(sinks[1]->wait()->usage.prompt_tokens == 12);
    CHECK(sinks[0]->ids() == sinks[1]->ids());
    CHECK(sinks[0]->text() == sinks[1]->text());
    const std::vector<TokenLogprob> echoed[] = {sinks[0]->prompt(), sinks[1]->prompt()};
    REQUIRE(echoed[0].size() == 12);
    REQUIRE(echoed[1].size() == 12);
    for (size_t i = 0; i < 12; ++i) {
        CAPTURE(i);
        CHECK(echoed[0][i].id == (*ids)[i]);
        CHECK(echoed[1][i].id == (*ids)[i]);
        CHECK(echoed[0][i].token == echoed[1][i].token);
        CHECK(echoed[0][i].text_offset == echoed[1][i].text_offset);
        CHECK(echoed[0][i].top.size() == echoed[1][i].top.size());
        CHECK((std::isnan(echoed[0][i].logprob) ? std::isnan(echoed[1][i].logprob)
                                                : echoed[0][i].logprob == echoed[1][i].logprob));
    }
    // Errors as submit's, naming the request's field.
    GenerateRequest empty = text;
    empty.prompt = std::string();
    empty.prompt_field = "prompt[2]";
    CHECK(gen.prompt_token_ids(empty).status().message() == "prompt[2]: empty");
    GenerateRequest unknown = text;
    unknown.model = "nope";
    CHECK(gen.prompt_token_ids(unknown).status().code() == StatusCode::kNotFound);
}

TEST_CASE("local generator: a thinking model's markers reach the text, and an opened thought") {
    // The micro tokenizer with <think> and </think> as special tokens 512 and 513.
    std::ifstream in(kMicro + "/tokenizer.json");
    std::stringstream text;
    text << in.rdbuf();
    boost::json::object tj = boost::json::parse(text.str()).as_object();
    for (auto [id, content] : {std::pair<int, const char*>{512, "<think>"}, {513, "</think>"}}) {
        tj["added_tokens"].as_array().push_back(
            {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
             {"rstrip", false}, {"normalized", false}, {"special", true}});
    }
    FakeOptions opts;
    opts.vocab_size = 520;
    // After the prompt's last "\n": <think> H </think>, then EOS.
    auto last_history = std::make_shared<std::vector<TokenId>>();
    opts.next = [last_history](std::span<const TokenId> history) -> TokenId {
        last_history->assign(history.begin(), history.end());
        switch (history.back()) {
            case 10: return 512;
            case 512: return 72;
            case 72: return 513;
            default: return 509;
        }
    };
    std::vector<ServedModel> models;
    for (const char* format : {"auto", "chatml_thinking"}) {
        ServedModel m = fake_model(std::string("micro") + (format[0] == 'a' ? "" : "-thinking"),
                                   opts);
        auto tok = tokenizer::Tokenizer::from_json(boost::json::serialize(tj));
        REQUIRE(tok.ok());
        m.tokenizer = std::move(tok).value();
        m.config.chat_template = format;
        models.push_back(std::move(m));
    }
    auto gen = LocalGenerator::create(std::move(models), EngineConfig{}, 42);
    REQUIRE(gen.ok());
    CHECK((*gen)->models()[0].thinks);
    {
        // A thinking-only template (Qwen3-Thinking-2507) opens the thought in the prompt.
        GenerateRequest opened_by_template = request({}, 8);
        opened_by_template.model = "micro-thinking";
        opened_by_template.prompt = std::vector<ChatMessage>{{"user", "hi", ""}};
        auto sink = std::make_shared<CollectingSink>();
        REQUIRE((*gen)->submit(opened_by_template, sink).ok());
        REQUIRE(sink->wait());
        CHECK(sink->thought_opened());
    }

    GenerateRequest chat = request({}, 8);
    chat.prompt = std::vector<ChatMessage>{{"user", "hi", ""}};
    auto sink = std::make_shared<CollectingSink>();
    REQUIRE((*gen)->submit(chat, sink).ok());
    REQUIRE(sink->wait());
    CHECK(sink->text() == "<think>H</think>");  // Special, yet kept for the reasoning parser.
    CHECK_FALSE(sink->thought_opened());

    // An assistant prefix that opens the thought: the sink is told before any token.
    chat.assistant_prefix = "<think>\n";
    auto opened = std::make_shared<CollectingSink>();
    REQUIRE((*gen)->submit(chat, opened).ok());
    REQUIRE(opened->wait());
    CHECK(opened->thought_opened());
    // A json_object answer cannot start inside a thought: refused before anything runs.
    GenerateRequest json_chat = chat;
    json_chat.sampling.json.schema = sampling::JsonSchema::any_object();
    auto json_sink = std::make_shared<CollectingSink>();
    auto refused = (*gen)->submit(json_chat, json_sink);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().message().find("response_format: ") == 0);
    CHECK_FALSE(json_sink->thought_opened());

    // A forced reply (a tool call's opening) renders the turn with thinking off: an empty
    // thought, closed, before the prefix; the output does not start in a thought.
    chat.assistant_prefix = "call(";
    auto forced = std::make_shared<CollectingSink>();
    REQUIRE((*gen)->submit(chat, forced).ok());
    REQUIRE(forced->wait());
    CHECK_FALSE(forced->thought_opened());
    const std::vector<TokenId>& prompt = *last_history;  // EOS at once: the prompt alone.
    CHECK(std::count(prompt.begin(), prompt.end(), 512) == 1);
    CHECK(std::count(prompt.begin(), prompt.end(), 513) == 1);

    // Completions are raw text: no markers kept, nothing opened.
    GenerateRequest raw = request({72, 512, 10}, 8);
    auto raw_sink = std::make_shared<CollectingSink>();
    REQUIRE((*gen)->submit(raw, raw_sink).ok());
    REQUIRE(raw_sink->wait());
    CHECK(raw_sink->text() == "H");
    CHECK_FALSE(raw_sink->thought_opened());
}

TEST_CASE("local generator: concurrent submitters each get their own exact tokens") {
    FakeOptions opts;
    EngineConfig config;
    config.max_batch_sequences = 4;
    auto gen = make_generator(opts, config);
    constexpr int kThreads = 6;
    constexpr int kPerThread = 4;
    std::vector<std::vector<std::shared_ptr<CollectingSink>>> sinks(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            for (int i = 0; i < kPerThread; ++i) {
                auto sink = std::make_shared<CollectingSink>();
                auto h = gen->submit(
                    request({static_cast<TokenId>(t + 1), static_cast<TokenId>(i + 1)}, 5 + i),
                    sink);
                if (h.ok()) {
                    sinks[t].push_back(sink);
                }
            }
        });
    }
    for (auto& th : threads) {
        th.join();
    }
    for (int t = 0; t < kThreads; ++t) {
        REQUIRE(sinks[t].size() == kPerThread);
        for (int i = 0; i < kPerThread; ++i) {
            auto finish = sinks[t][i]->wait();
            REQUIRE(finish);
            CHECK(finish->reason == FinishReason::kLength);
            CHECK(sinks[t][i]->ids() ==
                  FakeCausalLM::expected(
                      opts, {static_cast<TokenId>(t + 1), static_cast<TokenId>(i + 1)}, 5 + i));
        }
    }
}

TEST_CASE("local generator: the engine's batch limits reach the scheduler") {
    // Four requests running together under max_decode_sequences = 2: no step decodes more than
    // two of them (the scheduler's rule, tested in decode_share_test.cc; here, that the engine
    // config is what the scheduler got). The first forward waits until all four are queued, so
    // they run together.
    FakeOptions opts;
    std::atomic<bool> all_queued{false};
    opts.on_forward = [&] {
        while (!all_queued.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    };
    EngineConfig config;
    config.max_batch_sequences = 4;
    config.max_decode_sequences = 2;
    auto log = std::make_shared<testing::FakeLog>();
    auto gen = make_generator(opts, config, log);
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (TokenId i = 1; i <= 4; ++i) {
        sinks.push_back(std::make_shared<CollectingSink>());
        REQUIRE(gen->submit(request({i, 7, 9}, 8), sinks.back()).ok());
    }
    all_queued = true;
    for (TokenId i = 1; i <= 4; ++i) {
        REQUIRE(sinks[i - 1]->wait());
        CHECK(sinks[i - 1]->ids() == FakeCausalLM::expected(opts, {i, 7, 9}, 8));
    }
    size_t most_decoding = 0, most_sequences = 0;
    for (const testing::ForwardCall& call : log->snapshot()) {
        const auto decoding = static_cast<size_t>(std::count_if(
            call.chunks.begin(), call.chunks.end(), [](const auto& c) { return c.second == 1; }));
        most_decoding = std::max(most_decoding, decoding);
        most_sequences = std::max(most_sequences, call.chunks.size());
    }
    CHECK(most_decoding == 2);
    CHECK(most_sequences <= 4);
}

TEST_CASE("local generator: models() reports the queue bound one request's choices must fit") {
    EngineConfig config;
    config.max_queue = 8;
    config.max_queue_per_tenant = 3;
    CHECK(make_generator({}, config)->models()[0].max_request_sequences == 3);
    config.max_queue_per_tenant = 0;  // Only the model's queue bounds it.
    CHECK(make_generator({}, config)->models()[0].max_request_sequences == 8);
}

TEST_CASE("local generator: the same seed gives the same sampled text") {
    auto gen = make_generator();
    auto run = [&](uint64_t seed) {
        GenerateRequest r = request({3, 4}, 12);
        r.sampling.temperature = 2.0f;  // Flat enough that the noise logits get picked.
        r.sampling.seed = seed;
        auto sink = std::make_shared<CollectingSink>();
        REQUIRE(gen->submit(r, sink).ok());
        REQUIRE(sink->wait());
        return sink->ids();
    };
    CHECK(run(5) == run(5));
}

TEST_CASE("local generator: stop_token_ids end the reply with the token's text") {
    FakeOptions opts;
    // "hi!" then the end of sequence, one token at a time.
    opts.next = [](std::span<const TokenId> history) -> TokenId {
        static const TokenId kReply[] = {104, 105, 33, 509};
        const size_t at = std::min<size_t>(history.size() - 2, 3);
        return kReply[at];
    };
    auto gen = make_generator(opts);
    auto run = [&](std::vector<TokenId> stop_ids, int32_t min_tokens = 0) {
        GenerateRequest r = request({3, 4}, 8);
        r.sampling.stop_token_ids = std::move(stop_ids);
        r.sampling.min_tokens = min_tokens;
        auto sink = std::make_shared<CollectingSink>();
        REQUIRE(gen->submit(r, sink).ok());
        auto finish = sink->wait();
        REQUIRE(finish);
        CHECK(finish->reason == FinishReason::kStop);
        return std::pair(sink->text(), sink->ids());
    };
    CHECK(run({}).first == "hi!");
    const auto [text, ids] = run({105});
    CHECK(text == "hi");  // The stop token's own text stays, as vLLM returns it.
    CHECK(ids == std::vector<TokenId>{104, 105});
    // A special token (the end of sequence named again) has no text.
    CHECK(run({509}).first == "hi!");
    // A special stop token id (the end of sequence, past ignore_eos) ends the reply without
    // text and, as the end of sequence, without a logprob: the tokens join to the text.
    GenerateRequest special = request({3, 4}, 8);
    special.sampling.stop_token_ids = {509};
    special.sampling.ignore_eos = true;
    special.sampling.logprobs = true;
    auto with_lp = std::make_shared<CollectingSink>();
    REQUIRE(gen->submit(special, with_lp).ok());
    REQUIRE(with_lp->wait());
    CHECK(with_lp->text() == "hi!");
    std::string joined;
    for (const TokenLogprob& lp : with_lp->logprobs()) {
        joined += lp.token;
    }
    CHECK(joined == "hi!");
    CHECK(with_lp->logprobs().size() == 3);
    // Stop strings count from the token after min_tokens, as vLLM's: "i" in the second token
    // does not stop a reply of at least two, "!" in the third does.
    GenerateRequest at_least = request({3, 4}, 8);
    at_least.sampling.stop = {"i", "!"};
    at_least.sampling.min_tokens = 2;
    auto sink = std::make_shared<CollectingSink>();
    REQUIRE(gen->submit(at_least, sink).ok());
    REQUIRE(sink->wait());
    CHECK(sink->wait()->reason == FinishReason::kStop);
    CHECK(sink->text() == "hi");
    // Out of the vocabulary: refused naming the field.
    GenerateRequest bad = request({3, 4}, 8);
    bad.sampling.stop_token_ids = {512};
    auto refused = gen->submit(bad, std::make_shared<CollectingSink>());
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().message().find("stop_token_ids") == 0);
}

TEST_CASE("local generator: destruction cancels what is running") {
    FakeOptions opts;
    opts.max_context = 100000;
    opts.kv_tokens = 100000;
    auto gen = make_generator(opts);
    auto sink = std::make_shared<CollectingSink>();
    REQUIRE(gen->submit(request({1}, 90000), sink).ok());
    gen.reset();
    auto finish = sink->wait();
    REQUIRE(finish);
    CHECK(finish->reason == FinishReason::kCancelled);
    CHECK_FALSE(sink->protocol_violated());
}

TEST_CASE("local generator: an unknown chat template name is rejected at creation") {
    std::vector<ServedModel> models;
    models.push_back(fake_model("micro", {}));
    models[0].config.chat_template = "llama9";
    auto gen = LocalGenerator::create(std::move(models), EngineConfig{}, 1);
    CHECK(gen.status().code() == StatusCode::kInvalidArgument);
    CHECK(gen.status().message().find("chat_template") != std::string::npos);
}

TEST_CASE("local generator: a BOS it must add but cannot is refused at creation, an unusable "
          "EOS is logged") {
    ServedModel bos = fake_model("micro", {});
    bos.tokenizer_config.add_bos_token = true;
    bos.tokenizer_config.generation_bos_id = 99999;  // generation_config.json's.
    std::vector<ServedModel> models;
    models.push_back(std::move(bos));
    auto gen = LocalGenerator::create(std::move(models), EngineConfig{}, 1);
    CHECK(gen.status().code() == StatusCode::kInvalidArgument);
    CHECK(gen.status().message().find("BOS token id 99999") != std::string::npos);
    CHECK(gen.status().message().find("outside the vocabulary of 512") != std::string::npos);

    ServedModel eos = fake_model("micro", {});
    eos.tokenizer_config.generation_eos_ids = {99999};
    eos.tokenizer_config.eos_token = "<|nope|>";
    std::string lines;
    log::set_sink([&](std::string_view line) { lines += std::string(line) + "\n"; });
    models.clear();
    models.push_back(std::move(eos));
    auto created = LocalGenerator::create(std::move(models), EngineConfig{}, 1);
    log::set_sink(nullptr);
    REQUIRE(created.ok());
    CHECK(lines.find("\"eos_token_id\":99999") != std::string::npos);
    CHECK(lines.find("\"eos_token\":\"<|nope|>\"") != std::string::npos);
}

// The micro tokenizer with its ChatML markers renamed, so its vocabulary names no chat format.
std::unique_ptr<tokenizer::Tokenizer> tokenizer_without_chat_markers() {
    std::ifstream in(kMicro + "/tokenizer.json");
    std::stringstream ss;
    ss << in.rdbuf();
    boost::json::value root = boost::json::parse(ss.str());
    for (boost::json::value& t : root.at("added_tokens").as_array()) {
        boost::json::object& o = t.as_object();
        if (o.at("content") == "<|im_start|>" || o.at("content") == "<|im_end|>") {
            o["content"] = "<|x" + std::to_string(o.at("id").as_int64()) + "|>";
        }
    }
    auto tok = tokenizer::Tokenizer::from_json(boost::json::serialize(root));
    REQUIRE_MESSAGE(tok.ok(), tok.status().to_string());
    return std::move(tok).value();
}

// Creates a generator for `m` and submits a one-message chat; returns the submit status and the
// log lines written while the generator was created.
std::pair<Status, std::string> chat_with(ServedModel m) {
    std::string lines;
    log::set_sink([&](std::string_view line) { lines += std::string(line) + "\n"; });
    std::vector<ServedModel> models;
    models.push_back(std::move(m));
    auto gen = LocalGenerator::create(std::move(models), EngineConfig{}, 1);
    log::set_sink(nullptr);
    REQUIRE_MESSAGE(gen.ok(), gen.status().to_string());
    GenerateRequest chat = request({}, 4);
    chat.prompt = std::vector<ChatMessage>{{"user", "hi", ""}};
    auto submitted = (*gen)->submit(chat, std::make_shared<CollectingSink>());
    return {submitted.ok() ? ok_status() : submitted.status(), lines};
}

TEST_CASE("local generator: a chat template in no known format is logged and named in the 400") {
    ServedModel m = fake_model("micro", {});
    m.config.path = "/models/llama";
    m.tokenizer_config.chat_template =
        "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}";
    m.tokenizer_config.chat_template_file = "chat_template.jinja";
    auto [status, lines] = chat_with(std::move(m));
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK(status.message().find("messages: the chat template of model \"micro\" "
                                "(chat_template.jinja)") == 0);
    CHECK(status.message().find("is not recognised") != std::string::npos);
    CHECK(status.message().find("models[].chat_template") != std::string::npos);
    CHECK(status.message().find("deepseek_v3") != std::string::npos);
    CHECK(lines.find("\"level\":\"warn\"") != std::string::npos);
    CHECK(lines.find("\"event\":\"chat_template_unrecognised\"") != std::string::npos);
    CHECK(lines.find("\"model\":\"micro\"") != std::string::npos);
    CHECK(lines.find("\"path\":\"/models/llama\"") != std::string::npos);
    CHECK(lines.find("chatml, chatml_thinking, glm4_5, kimi_k2, deepseek_v3") !=
          std::string::npos);
}

TEST_CASE("local generator: a model with no chat template at all keeps its plain 400") {
    ServedModel m = fake_model("micro", {});
    m.tokenizer = tokenizer_without_chat_markers();
    m.tokenizer_config.chat_template.clear();
    auto [status, lines] = chat_with(std::move(m));
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK(status.message() == "messages: model \"micro\" has no chat template");
    CHECK(lines.find("chat_template_unrecognised") == std::string::npos);
}

TEST_CASE("local generator: errors about the prompt name the request's prompt_field") {
    // The API's name for the prompt (the third of a client's list): an error about the prompt
    // names it, one about its token j names field[j], as the client's request spells them.
    auto gen = make_generator();
    auto sink = std::make_shared<CollectingSink>();
    auto refusal = [&](GenerateRequest r) {
        r.prompt_field = "prompt[2]";
        auto handle = gen->submit(std::move(r), sink);
        REQUIRE_FALSE(handle.ok());
        return handle.status().message();
    };
    CHECK(refusal(request({1, 512}, 4)) == "prompt[2][1]: token id 512 is out of range [0, 512)");
    CHECK(refusal(request({}, 4)) == "prompt[2]: empty");
    GenerateRequest text = request({1}, 4);
    text.prompt = std::string("bad \xC3(");
    CHECK(refusal(text).rfind("prompt[2]: text is not valid UTF-8", 0) == 0);
    CHECK(refusal(request({1, 2}, 255))
              .rfind("prompt[2]: the prompt (2 tokens) plus max_tokens", 0) == 0);
    GenerateRequest over = request({1, 2, 3}, 4);
    over.max_prompt_tokens = 2;
    CHECK(refusal(over) ==
          "prompt[2]: the prompt (3 tokens) exceeds this tenant's input_tokens_per_minute of 2");
}

TEST_CASE("local generator: a tenant's max_context_tokens caps prompt + max_tokens") {
    auto gen = make_generator();
    auto sink = std::make_shared<CollectingSink>();
    GenerateRequest over = request({1, 2, 3}, 8);
    over.max_context_tokens = 10;
    auto rejected = gen->submit(over, sink);
    REQUIRE_FALSE(rejected.ok());
    CHECK(rejected.status().code() == StatusCode::kOutOfRange);
    CHECK(rejected.status().message().find("prompt:") == 0);
    CHECK(rejected.status().message().find("tenant's limit of 10") != std::string::npos);
    // The same request without a max_tokens of its own runs, to the tenant's limit.
    GenerateRequest lowered = request({1, 2, 3}, 1 << 20);
    lowered.max_tokens_is_default = true;
    lowered.sampling.ignore_eos = true;
    lowered.max_context_tokens = 10;
    auto lowered_sink = std::make_shared<CollectingSink>();
    REQUIRE(gen->submit(lowered, lowered_sink).ok());
    auto lowered_finish = lowered_sink->wait();
    REQUIRE(lowered_finish.has_value());
    CHECK(lowered_finish->reason == FinishReason::kLength);
    CHECK(lowered_finish->usage.completion_tokens == 7);
    GenerateRequest fits = request({1, 2, 3}, 7);
    fits.max_context_tokens = 10;
    fits.tenant = "acme";
    fits.tenant_weight = 2;
    auto ok = gen->submit(fits, sink);
    REQUIRE(ok.ok());
    auto finish = sink->wait();
    REQUIRE(finish.has_value());
    CHECK(finish->usage.completion_tokens > 0);
}

TEST_CASE("local generator: a prompt longer than the tenant's input budget is refused") {
    auto gen = make_generator();
    auto sink = std::make_shared<CollectingSink>();
    GenerateRequest over = request({1, 2, 3, 4}, 2);
    over.max_prompt_tokens = 3;
    auto rejected = gen->submit(over, sink);
    REQUIRE_FALSE(rejected.ok());
    CHECK(rejected.status().code() == StatusCode::kInvalidArgument);
    CHECK(rejected.status().message() ==
          "prompt: the prompt (4 tokens) exceeds this tenant's input_tokens_per_minute of 3");
    GenerateRequest fits = request({1, 2, 3}, 2);
    fits.max_prompt_tokens = 3;
    REQUIRE(gen->submit(fits, sink).ok());
    REQUIRE(sink->wait().has_value());
}

TEST_CASE("local generator: a request the KV cache could never hold is refused up front") {
    // The context allows 256 positions but the cache holds 32: a longer sequence would fail
    // midway however long it waited, so it is out of range (not "busy") before it starts.
    FakeOptions opts;
    opts.kv_tokens = 32;
    auto gen = make_generator(opts);
    CHECK(gen->models()[0].context_length == 256);
    auto sink = std::make_shared<CollectingSink>();
    auto rejected = gen->submit(request({1, 2, 3}, 40), sink);
    REQUIRE_FALSE(rejected.ok());
    CHECK(rejected.status().code() == StatusCode::kOutOfRange);
    CHECK(rejected.status().message().find("KV cache capacity of 32") != std::string::npos);
    auto long_prompt = gen->submit(request(std::vector<TokenId>(40, 7), 1), sink);
    CHECK(long_prompt.status().code() == StatusCode::kOutOfRange);

    // Without a max_tokens of its own, the request runs to the cache's capacity.
    GenerateRequest lowered = request({1, 2, 3}, 1 << 20);
    lowered.max_tokens_is_default = true;
    lowered.sampling.ignore_eos = true;
    REQUIRE(gen->submit(lowered, sink).ok());
    auto finish = sink->wait();
    REQUIRE(finish.has_value());
    CHECK(finish->reason == FinishReason::kLength);
    CHECK(finish->usage.completion_tokens == 29);
}

}  // namespace
}  // namespace edge::engine::sched
