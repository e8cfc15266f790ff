// Tool calls through the engine's LocalGenerator: a Kimi K2-format model (fake weights, the real
// tokenizer with Kimi's special markers) whose tool-call markers reach the decoded text only when
// tools are offered; a forced call's prefix rendered as marker ids after the prompt; each
// family's forced prefix read back by its parser; the model's tool-call format in models().

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "engine/chat/tool_call_parser.h"
#include "engine/sampling/json_prefix.h"
#include "engine/sched/local_generator.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/incremental_decoder.h"
#include "tests/engine/chat/marker_tokenizer.h"
#include "tests/engine/serve/collecting_sink.h"
#include "tests/engine/serve/fake_causal_lm.h"

namespace edge::engine {
namespace {

TokenId id_of(const tokenizer::Tokenizer& tok, std::string_view s) {
    const TokenId id = tok.token_id(s);
    REQUIRE(id >= 0);
    return id;
}

// The reply a Kimi K2 model writes: a call to f with {"a": 1}, in tokens.
std::vector<TokenId> kimi_call_tokens(const tokenizer::Tokenizer& tok) {
    std::vector<TokenId> ids = {id_of(tok, "<|tool_calls_section_begin|>"),
                                id_of(tok, "<|tool_call_begin|>")};
    auto text = [&](std::string_view s) {
        auto e = tok.encode(s, /*parse_special=*/false);
        REQUIRE(e.ok());
        ids.insert(ids.end(), e->begin(), e->end());
    };
    text("functions.f:0");
    ids.push_back(id_of(tok, "<|tool_call_argument_begin|>"));
    text("{\"a\": 1}");
    ids.push_back(id_of(tok, "<|tool_call_end|>"));
    ids.push_back(id_of(tok, "<|tool_calls_section_end|>"));
    return ids;
}

// A Kimi K2 reply with two calls in one section: f with {"a": 1}, then f with {"a": 2}.
std::vector<TokenId> kimi_two_calls_tokens(const tokenizer::Tokenizer& tok) {
    std::vector<TokenId> ids = {id_of(tok, "<|tool_calls_section_begin|>")};
    auto text = [&](std::string_view s) {
        auto e = tok.encode(s, /*parse_special=*/false);
        REQUIRE(e.ok());
        ids.insert(ids.end(), e->begin(), e->end());
    };
    for (const char* call : {"0", "1"}) {
        ids.push_back(id_of(tok, "<|tool_call_begin|>"));
        text(std::string("functions.f:") + call);
        ids.push_back(id_of(tok, "<|tool_call_argument_begin|>"));
        text(std::string("{\"a\": ") + (call[0] == '0' ? "1" : "2") + "}");
        ids.push_back(id_of(tok, "<|tool_call_end|>"));
    }
    ids.push_back(id_of(tok, "<|tool_calls_section_end|>"));
    return ids;
}

// The reply a GLM-4.5 model writes: a call to f with city "Paris, France" and days 99, in
// tokens, its markers as their ids.
std::vector<TokenId> glm_call_tokens(const tokenizer::Tokenizer& tok) {
    std::vector<TokenId> ids;
    auto text = [&](std::string_view s) {
        auto e = tok.encode(s, /*parse_special=*/false);
        REQUIRE(e.ok());
        ids.insert(ids.end(), e->begin(), e->end());
    };
    ids.push_back(id_of(tok, "<tool_call>"));
    text("f\n");
    for (const auto& [key, value] : {std::pair{"city", "Paris, France"}, {"days", "99"}}) {
        ids.push_back(id_of(tok, "<arg_key>"));
        text(key);
        ids.push_back(id_of(tok, "</arg_key>"));
        text("\n");
        ids.push_back(id_of(tok, "<arg_value>"));
        text(value);
        ids.push_back(id_of(tok, "</arg_value>"));
        text("\n");
    }
    ids.push_back(id_of(tok, "</tool_call>"));
    return ids;
}

// A model of `chat_template` that writes `script` (kimi_call_tokens by default) again and again.
struct KimiServer {
    explicit KimiServer(
        std::string name = "kimi", std::string chat_template = "kimi_k2",
        std::vector<TokenId> (*script_of)(const tokenizer::Tokenizer&) = kimi_call_tokens)
        : name(std::move(name)) {
        testing::FakeOptions opts;
        opts.vocab_size = 600;
        opts.max_context = 1024;  // GLM-4.5's prompt lists the tools after a long preamble.
        opts.next = [this](std::span<const TokenId> history) -> TokenId {
            std::lock_guard<std::mutex> lock(mu);
            prompts.emplace_back(history.begin(), history.end());
            const size_t i = replies++ % script.size();
            return script[i];
        };
        sched::ServedModel m;
        m.config.name = this->name;
        m.config.chat_template = std::move(chat_template);
        m.model = std::make_unique<testing::FakeCausalLM>(opts);
        m.tokenizer = tokenizer::tokenizer_with_markers();
        script = script_of(*m.tokenizer);
        tok = m.tokenizer.get();
        std::vector<sched::ServedModel> models;
        models.push_back(std::move(m));
        auto g = sched::LocalGenerator::create(std::move(models), EngineConfig{}, 1);
        REQUIRE_MESSAGE(g.ok(), g.status().to_string());
        gen = std::move(g).value();
    }

    // Runs one request to max_tokens = the script's length; the decoded text.
    std::string run(GenerateRequest r) { return run_to_finish(std::move(r))->text(); }

    // Runs one request (max_tokens: the script's length unless set); its sink once finished.
    std::shared_ptr<testing::CollectingSink> run_to_finish(GenerateRequest r,
                                                           int32_t max_tokens = 0) {
        {
            std::lock_guard<std::mutex> lock(mu);
            replies = 0;
            prompts.clear();
        }
        r.model = name;
        r.prompt = std::vector<ChatMessage>{{"user", "call f", ""}};
        r.sampling.temperature = 0.0f;
        r.sampling.max_tokens = max_tokens > 0 ? max_tokens : static_cast<int32_t>(script.size());
        r.sampling.ignore_eos = true;
        auto sink = std::make_shared<testing::CollectingSink>();
        auto handle = gen->submit(std::move(r), sink);
        REQUIRE_MESSAGE(handle.ok(), handle.status().to_string());
        REQUIRE(sink->wait());
        return sink;
    }

    // Runs one request that must end with finish reason stop; its sink.
    std::shared_ptr<testing::CollectingSink> run_to_stop(GenerateRequest r, int32_t max_tokens) {
        auto sink = run_to_finish(std::move(r), max_tokens);
        const std::optional<Finish> finish = sink->wait();
        REQUIRE(finish);
        CHECK(finish->reason == FinishReason::kStop);
        return sink;
    }

    std::string name;
    std::mutex mu;
    std::vector<TokenId> script;
    size_t replies = 0;
    std::vector<std::vector<TokenId>> prompts;
    const tokenizer::Tokenizer* tok = nullptr;
    std::unique_ptr<sched::LocalGenerator> gen;
};

const std::vector<ToolSpec> kTools = {{"f", "", "{\"type\": \"object\"}", nullptr}};

// Reads a forced Kimi K2 reply (`prefix`, then the model's `text`) as the response's parser does:
// it must be one well-formed call and nothing else. Its name and arguments.
std::pair<std::string, std::string> read_one_call(std::string_view prefix, std::string_view text) {
    auto parser = chat::create_tool_call_parser(chat::ToolCallFormat::kKimiK2, "call_", kTools);
    chat::ParsedDelta all = parser->feed(prefix);
    chat::ParsedDelta rest = parser->feed(text);
    chat::ParsedDelta end = parser->finish();
    CHECK(all.content.empty());
    CHECK(rest.content.empty());
    CHECK(end.content.empty());
    CHECK(parser->completed_calls() == 1);
    CHECK_FALSE(parser->malformed());
    all.tool_calls.insert(all.tool_calls.end(), rest.tool_calls.begin(), rest.tool_calls.end());
    REQUIRE(!all.tool_calls.empty());
    std::string args;
    for (const chat::ToolCallDelta& d : all.tool_calls) {
        args += d.arguments;
    }
    return {all.tool_calls[0].name, args};
}

// A request whose Kimi K2 calls (tool_choice "auto") are held to f's strict `schema`, a in
// 5..7; with `parallel`, the section may go on with more calls, and the reply after it.
GenerateRequest held_kimi_calls(bool parallel) {
    auto schema = sampling::JsonSchema::compile(boost::json::parse(
        R"({"type":"object","properties":{"a":{"type":"integer","minimum":5,"maximum":7}},)"
        R"("required":["a"],"additionalProperties":false})"));
    REQUIRE(schema.ok());
    const chat::ToolCallFormat format = chat::ToolCallFormat::kKimiK2;
    GenerateRequest request;
    request.tools = kTools;
    request.tools[0].strict_schema = *schema;
    const chat::CallHead head = chat::held_call_head(format, "f");
    request.sampling.json.heads.push_back({head.text, *schema, nullptr, head.number_at});
    request.sampling.json.tail = chat::forced_call_tail(format);
    if (parallel) {
        const chat::NextCall next = chat::next_call_in_section(format);
        request.sampling.json.next_at = next.at;
        request.sampling.json.next = next.text;
    }
    request.sampling.json.trigger = chat::forced_call_prefix(format, "");
    request.sampling.json.again = parallel;
    return request;
}

}  // namespace

TEST_CASE(
    "tool serving: Kimi K2 markers are kept in the decoded text only when tools are offered") {
    KimiServer s;
    REQUIRE(s.gen->models().size() == 1);
    CHECK(s.gen->models()[0].tool_call_format == "kimi_k2");

    GenerateRequest plain;
    const std::string without = s.run(plain);
    CHECK(without == "functions.f:0{\"a\": 1}");  // Special tokens dropped as usual.

    GenerateRequest with_tools;
    with_tools.tools = kTools;
    const std::string with = s.run(with_tools);
    CHECK(with ==
          "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
          "<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|>");
    auto parser = chat::create_tool_call_parser(chat::ToolCallFormat::kKimiK2, "call_");
    chat::ParsedDelta d = parser->feed(with);
    chat::ParsedDelta end = parser->finish();
    CHECK(d.content.empty());
    CHECK(end.content.empty());
    REQUIRE(d.tool_calls.size() == 1);
    CHECK(d.tool_calls[0].name == "f");
    CHECK(d.tool_calls[0].arguments == "{\"a\": 1}");
    CHECK(parser->completed_calls() == 1);
}

TEST_CASE("tool serving: a forced call's prefix follows the prompt as marker ids") {
    KimiServer s;
    GenerateRequest forced;
    forced.tools = kTools;
    forced.assistant_prefix = chat::forced_call_prefix(chat::ToolCallFormat::kKimiK2, "f");
    s.run(forced);
    std::vector<TokenId> prompt;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        REQUIRE(!s.prompts.empty());
        prompt = s.prompts.front();
    }
    // ... <|im_assistant|>assistant<|im_middle|> then the prefix's ids.
    const std::vector<TokenId> expected_prefix = [&] {
        std::vector<TokenId> ids(s.script.begin(), s.script.end());
        const auto arg_begin =
            std::find(ids.begin(), ids.end(), id_of(*s.tok, "<|tool_call_argument_begin|>"));
        return std::vector<TokenId>(ids.begin(), arg_begin + 1);
    }();
    REQUIRE(prompt.size() > expected_prefix.size());
    CHECK(std::vector<TokenId>(prompt.end() - static_cast<ptrdiff_t>(expected_prefix.size()),
                               prompt.end()) == expected_prefix);
    CHECK(prompt[prompt.size() - expected_prefix.size() - 1] == id_of(*s.tok, "<|im_middle|>"));
}

TEST_CASE("tool serving: a call forced to a strict tool follows its parameters, then closes") {
    // The scripted model wants to open a call of its own (markers first, then {"a": 1}); forced
    // to f, whose strict parameters want {"n": 0..9, "tag": "x" or "y"}, the filter leads it to
    // such arguments, then the call's end spelled by Kimi's marker tokens, and the reply ends.
    KimiServer s;
    auto schema = sampling::JsonSchema::compile(boost::json::parse(
        R"({"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":9},)"
        R"("tag":{"enum":["x","y"]}},"required":["n","tag"],"additionalProperties":false})"));
    REQUIRE(schema.ok());
    GenerateRequest forced;
    forced.tools = kTools;
    forced.tools[0].strict_schema = *schema;
    forced.assistant_prefix = chat::forced_call_prefix(chat::ToolCallFormat::kKimiK2, "f");
    forced.sampling.json.schema = *schema;
    const std::string tail = chat::forced_call_tail(chat::ToolCallFormat::kKimiK2);
    forced.sampling.json.tail = tail;
    // The markers made the likeliest tokens: refused inside the document, chosen for the tail.
    const TokenId call_end = id_of(*s.tok, "<|tool_call_end|>");
    const TokenId section_end = id_of(*s.tok, "<|tool_calls_section_end|>");
    forced.sampling.logit_bias = {{call_end, 100.0f}, {section_end, 100.0f}};
    auto sink = s.run_to_stop(forced, 80);
    const std::string text = sink->text();
    CAPTURE(text);
    REQUIRE(text.size() > tail.size());
    REQUIRE(text.ends_with(tail));
    const boost::json::value args = boost::json::parse(text.substr(0, text.size() - tail.size()));
    const boost::json::object& o = args.as_object();
    REQUIRE(o.size() == 2);
    CHECK(o.at("n").as_int64() >= 0);
    CHECK(o.at("n").as_int64() <= 9);
    CHECK((o.at("tag") == "x" || o.at("tag") == "y"));
    const std::vector<TokenId> ids = sink->ids();
    REQUIRE(ids.size() > 2);
    CHECK(std::count(ids.begin(), ids.end(), call_end) == 1);
    CHECK(ids[ids.size() - 2] == call_end);
    CHECK(ids.back() == section_end);
    // The response's parser reads one well-formed call to f, with those arguments.
    const auto [name, read_args] = read_one_call(forced.assistant_prefix, text);
    CHECK(name == "f");
    CHECK(boost::json::parse(read_args) == args);
}

TEST_CASE("tool serving: required with strict tools: the model names one and follows it") {
    // Two strict tools of different parameters; the model picks a name after the forced
    // opening, and the arguments follow that tool's parameters.
    KimiServer s;
    auto schema = [](const char* text) {
        auto compiled = sampling::JsonSchema::compile(boost::json::parse(text));
        REQUIRE(compiled.ok());
        return *compiled;
    };
    GenerateRequest forced;
    forced.tools = {
        {"f", "", "",
         schema(R"({"type":"object","properties":{"a":{"type":"boolean"}},)"
                R"("required":["a"],"additionalProperties":false})")},
        {"g", "", "",
         schema(R"({"type":"object","properties":{"b":{"enum":[1,2]}},)"
                R"("required":["b"],"additionalProperties":false})")},
    };
    const std::string opening = chat::forced_call_prefix(chat::ToolCallFormat::kKimiK2, "");
    forced.assistant_prefix = opening;
    for (const ToolSpec& t : forced.tools) {
        const chat::CallHead head = chat::held_call_head(chat::ToolCallFormat::kKimiK2, t.name);
        forced.sampling.json.heads.push_back({head.text, t.strict_schema, nullptr, head.number_at});
    }
    forced.sampling.json.tail = chat::forced_call_tail(chat::ToolCallFormat::kKimiK2);
    const TokenId arg_begin = id_of(*s.tok, "<|tool_call_argument_begin|>");
    // The markers chosen where the head and tail allow them.
    forced.sampling.logit_bias = {{arg_begin, 100.0f},
                                  {id_of(*s.tok, "<|tool_call_end|>"), 100.0f},
                                  {id_of(*s.tok, "<|tool_calls_section_end|>"), 100.0f}};
    auto sink = s.run_to_stop(forced, 60);
    const std::string text = sink->text();
    CAPTURE(text);
    const std::vector<TokenId> ids = sink->ids();
    CHECK(std::count(ids.begin(), ids.end(), arg_begin) == 1);
    const auto [name, args] = read_one_call(opening, text);
    const boost::json::object o = boost::json::parse(args).as_object();
    REQUIRE(o.size() == 1);
    if (name == "f") {
        CHECK(o.at("a").is_bool());
    } else {
        CHECK(name == "g");
        CHECK((o.at("b") == 1 || o.at("b") == 2));
    }
}

TEST_CASE("tool serving: auto with a strict tool: calls the model opens follow its parameters") {
    // The scripted model opens a call of its own (Kimi's markers), wanting {"a": 1}; the strict
    // parameters want a between 5 and 7. From the opening (the trigger) to the call's end the
    // reply is held; after it the reply goes on with parallel calls (no stop at the first call),
    // and ends there without them.
    KimiServer s;
    for (const bool parallel : {true, false}) {
        CAPTURE(parallel);
        GenerateRequest request = held_kimi_calls(parallel);
        const std::string& opening = request.sampling.json.trigger;
        const int32_t max_tokens = 2 * static_cast<int32_t>(s.script.size()) + 8;
        auto sink = s.run_to_finish(request, max_tokens);
        const std::optional<Finish> finish = sink->wait();
        REQUIRE(finish);
        // Not ended by the first call's end, or ended there.
        CHECK(finish->reason == (parallel ? FinishReason::kLength : FinishReason::kStop));
        const std::string text = sink->text();
        CAPTURE(text);
        CHECK(text.starts_with(opening));  // The model opened the call itself.
        auto parser = chat::create_tool_call_parser(chat::ToolCallFormat::kKimiK2, "call_", kTools);
        chat::ParsedDelta d = parser->feed(text);
        parser->finish();
        CHECK(parser->completed_calls() >= 1);
        if (!parallel) {
            CHECK(parser->completed_calls() == 1);
            CHECK(text.ends_with(request.sampling.json.tail));
        }
        std::map<int32_t, std::string> args;
        for (const chat::ToolCallDelta& call : d.tool_calls) {
            args[call.index] += call.arguments;
        }
        for (int32_t i = 0; i < parser->completed_calls(); ++i) {
            CAPTURE(args[i]);
            const boost::json::value a = boost::json::parse(args[i]).as_object().at("a");
            CHECK(a.as_int64() >= 5);
            CHECK(a.as_int64() <= 7);
        }
    }
}

TEST_CASE("tool serving: Kimi K2's parallel calls stay in one section, each held") {
    // The scripted model opens a section with two calls to f ({"a": 1}, {"a": 2}); f's strict
    // parameters want a in 5..7. With parallel calls the held section takes both, each call's
    // arguments held and its index the model's own; without, the first call closes the section
    // and the reply.
    KimiServer s("kimi", "kimi_k2", kimi_two_calls_tokens);
    const chat::ToolCallFormat format = chat::ToolCallFormat::kKimiK2;
    for (const bool parallel : {true, false}) {
        CAPTURE(parallel);
        GenerateRequest request = held_kimi_calls(parallel);
        // The markers above the model's other choices where they may come.
        for (const char* marker : {"<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                                   "<|tool_call_end|>", "<|tool_calls_section_end|>"}) {
            request.sampling.logit_bias.emplace_back(id_of(*s.tok, marker), 5.0f);
        }
        auto sink = s.run_to_finish(request, static_cast<int32_t>(s.script.size()));
        const std::string text = sink->text();
        CAPTURE(text);
        const std::vector<TokenId> ids = sink->ids();
        const TokenId section_end = id_of(*s.tok, "<|tool_calls_section_end|>");
        CHECK(std::count(ids.begin(), ids.end(), section_end) == 1);
        auto parser = chat::create_tool_call_parser(format, "call_", kTools);
        chat::ParsedDelta d = parser->feed(text);
        parser->finish();
        CHECK_FALSE(parser->malformed());
        REQUIRE(parser->completed_calls() == (parallel ? 2 : 1));
        std::map<int32_t, std::string> args, id;
        for (const chat::ToolCallDelta& c : d.tool_calls) {
            args[c.index] += c.arguments;
            id[c.index] += c.id;
        }
        CHECK(id[0] == "functions.f:0");
        if (parallel) {
            CHECK(id[1] == "functions.f:1");
            const auto section = std::find(ids.begin(), ids.end(), section_end);
            CHECK(section == ids.end() - 1);  // Both calls inside the one section.
        }
        for (const auto& [index, a] : args) {
            CAPTURE(a);
            const int64_t v = boost::json::parse(a).as_object().at("a").as_int64();
            CHECK(v >= 5);
            CHECK(v <= 7);
        }
    }
}

TEST_CASE("tool serving: GLM-4.5 calls the model opens follow a strict tool's parameters") {
    // The scripted model opens a call to f and writes city "Paris, France" and days 99; the
    // strict parameters want a city of at most 5 characters (raw text: a declared string) and
    // days 1..9. The pairs are held as the object they stand for, their markers written as
    // GLM's marker tokens, and the response's parser reads one valid call.
    KimiServer s("glm", "glm4_5", glm_call_tokens);
    const chat::ToolCallFormat format = chat::ToolCallFormat::kGlm45;
    ToolSpec tool{"f", "",
                  R"({"type":"object","properties":{"city":{"type":"string","maxLength":5},)"
                  R"("days":{"type":"integer","minimum":1,"maximum":9}},)"
                  R"("required":["city","days"],"additionalProperties":false})",
                  nullptr};
    auto schema = sampling::JsonSchema::compile(boost::json::parse(tool.parameters_json));
    REQUIRE(schema.ok());
    tool.strict_schema = *schema;
    GenerateRequest request;
    request.tools = {tool};
    const std::string opening = chat::forced_call_prefix(format, "");
    request.sampling.json.heads.push_back(
        {chat::forced_call_prefix(format, "f").substr(opening.size()), *schema,
         std::make_shared<const sampling::ArgumentPairs>(
             sampling::ArgumentPairs{chat::glm45_string_arguments(tool)})});
    request.sampling.json.tail = chat::forced_call_tail(format);
    request.sampling.json.trigger = opening;
    // The markers above the model's other choices, below what it means to write (once its
    // script is off course, the text between markers is whatever the filter lets through).
    for (const char* marker :
         {"<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "</tool_call>"}) {
        request.sampling.logit_bias.emplace_back(id_of(*s.tok, marker), 5.0f);
    }
    auto sink = s.run_to_stop(request, 120);
    const std::string text = sink->text();
    CAPTURE(text);
    CHECK(text.starts_with(opening));
    CHECK(text.ends_with("</tool_call>"));
    const std::vector<TokenId> ids = sink->ids();
    for (const char* marker : {"<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"}) {
        CHECK(std::count(ids.begin(), ids.end(), id_of(*s.tok, marker)) == 2);
    }
    auto parser = chat::create_tool_call_parser(format, "call_", request.tools);
    chat::ParsedDelta d = parser->feed(text);
    chat::ParsedDelta end = parser->finish();
    CHECK(d.content.empty());
    CHECK(end.content.empty());
    REQUIRE(parser->completed_calls() == 1);
    std::string args;
    for (const chat::ToolCallDelta& c : d.tool_calls) {
        args += c.arguments;
    }
    CAPTURE(args);
    const boost::json::object o = boost::json::parse(args).as_object();
    REQUIRE(o.size() == 2);
    CHECK(o.at("city").as_string().size() <= 5);
    CHECK(std::string_view(o.at("city").as_string()).starts_with("Paris"));
    CHECK(o.at("days").as_int64() >= 1);
    CHECK(o.at("days").as_int64() <= 9);
}

TEST_CASE("tool serving: each format's forced prefix starts a call its parser reads") {
    using chat::ToolCallFormat;
    struct Case {
        ToolCallFormat format;
        const char* rest;  // The model's continuation.
    };
    const Case cases[] = {
        {ToolCallFormat::kHermes, " {\"a\": 1}}\n</tool_call>"},
        {ToolCallFormat::kGlm45, "<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"},
        {ToolCallFormat::kKimiK2, "{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|>"},
        {ToolCallFormat::kDeepSeekV3, "{\"a\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
        {ToolCallFormat::kDeepSeekV31, "{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
    };
    for (const Case& c : cases) {
        CAPTURE(chat::tool_call_format_name(c.format));
        auto parser = chat::create_tool_call_parser(c.format, "call_", kTools);
        chat::ParsedDelta head = parser->feed(chat::forced_call_prefix(c.format, "f"));
        // The named call's header is out before the model writes anything.
        REQUIRE(head.tool_calls.size() == 1);
        CHECK(head.tool_calls[0].name == "f");
        CHECK(head.content.empty());
        chat::ParsedDelta rest = parser->feed(c.rest);
        chat::ParsedDelta end = parser->finish();
        CHECK(rest.content.empty());
        CHECK(end.content.empty());
        std::string args = head.tool_calls[0].arguments;
        for (const auto& d : rest.tool_calls) {
            args += d.arguments;
        }
        CHECK(boost::json::parse(args) == boost::json::parse("{\"a\": 1}"));
        // A forced call's tail is what the format writes after the arguments (JSON, or
        // GLM-4.5's key/value pairs), and a held call takes the model's continuation whole.
        const std::string tail = chat::forced_call_tail(c.format);
        CHECK(std::string_view(c.rest).ends_with(tail));
        CHECK(chat::arguments_as_pairs(c.format) == (c.format == ToolCallFormat::kGlm45));
        const std::string lead(chat::arguments_lead(c.format));
        if (!chat::arguments_as_pairs(c.format)) {
            CHECK(std::string_view(c.rest) == lead + "{\"a\": 1}" + tail);
        }
        // Held as the API holds a call forced to a strict tool: the lead, then the arguments.
        sampling::JsonReply held;
        auto schema = *sampling::JsonSchema::compile(boost::json::parse(
            R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})"));
        auto pairs = chat::arguments_as_pairs(c.format)
                         ? std::make_shared<const sampling::ArgumentPairs>()
                         : nullptr;
        if (lead.empty()) {
            held.schema = schema;
            held.pairs = pairs;
        } else {
            held.heads.push_back({lead, schema, pairs});
        }
        held.tail = tail;
        sampling::JsonPrefix prefix(held);
        CHECK(prefix.feed(c.rest));
        CHECK(prefix.complete());
        CHECK(parser->completed_calls() == 1);
        CHECK_FALSE(parser->malformed());

        // "required": only the opening marker is forced; the model names the function.
        CHECK(chat::forced_call_prefix(c.format, "").size() <
              chat::forced_call_prefix(c.format, "f").size());
    }
}

TEST_CASE("tool serving: a forced prefix and the model's continuation spell the template's call") {
    // What a forced call puts in the prompt, then what the model writes (the arguments' lead,
    // the arguments, the tail), is the text the format's template renders for the same call in
    // a past turn (up to the call's end: DeepSeek-V3's template closes a section of one call
    // without <｜tool▁calls▁end｜>): the model continues the text it was trained on. The
    // prompt's part never ends
    // in whitespace that the trained text fuses with the next token (Hermes: the space after
    // "arguments":, written with the arguments' "{", " {").
    using chat::ToolCallFormat;
    using tokenizer::ChatFormat;
    const std::pair<ToolCallFormat, ChatFormat> formats[] = {
        {ToolCallFormat::kHermes, ChatFormat::kChatMl},
        {ToolCallFormat::kKimiK2, ChatFormat::kKimiK2},
        {ToolCallFormat::kDeepSeekV3, ChatFormat::kDeepSeekV3},
        {ToolCallFormat::kDeepSeekV31, ChatFormat::kDeepSeekV31},
    };
    auto tok = tokenizer::tokenizer_with_markers();
    for (const auto& [format, chat_format] : formats) {
        CAPTURE(chat::tool_call_format_name(format));
        // Kimi K2's template writes the call's id, which its ids spell as the call.
        const std::string id = format == ToolCallFormat::kKimiK2 ? "functions.f:0" : "call_0";
        const std::vector<ChatMessage> conversation = {
            {"user", "Weather?", "", {}, ""},
            {"assistant", "", "", {{id, "f", R"({"a": 1})"}}, ""},
            {"tool", "sunny", "", {}, id},
        };
        auto t = tokenizer::ChatTemplate::create(chat_format, tok.get());
        REQUIRE(t.ok());
        const std::string rendered = t->render_text(conversation, kTools);
        const std::string prefix = chat::forced_call_prefix(format, "f");
        CHECK_FALSE(prefix.ends_with(' '));
        const std::string tail = chat::forced_call_tail(format);
        const chat::NextCall next = chat::next_call_in_section(format);
        const std::string call = prefix + std::string(chat::arguments_lead(format)) +
                                 R"({"a": 1})" +
                                 (next.text.empty() ? tail : tail.substr(0, next.at));
        CAPTURE(rendered);
        CAPTURE(call);
        CHECK(rendered.find(call) != std::string::npos);
    }
}

TEST_CASE("tool serving: the decoder keeps only the listed special tokens") {
    auto tok = tokenizer::tokenizer_with_markers();
    auto chat = tokenizer::ChatTemplate::create(tokenizer::ChatFormat::kKimiK2, tok.get());
    REQUIRE(chat.ok());
    const std::vector<TokenId> kept = chat->tool_call_marker_ids();
    CHECK(kept.size() == 5);
    tokenizer::IncrementalDecoder decoder(tok.get(), /*skip_special_tokens=*/true);
    decoder.keep_special(kept);
    CHECK(decoder.push(id_of(*tok, "<|tool_call_begin|>")) == "<|tool_call_begin|>");
    CHECK(decoder.push(id_of(*tok, "<|im_end|>")).empty());
    CHECK(decoder.push(id_of(*tok, "<|im_middle|>")).empty());
}

}  // namespace edge::engine
