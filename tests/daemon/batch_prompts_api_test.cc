// /v1/completions with a list of prompts (OpenAI's and vLLM's batch), through the real HTTPS
// server and the API on the scripted generator: each prompt gets `n` choices, choice
// prompt * n + i; the usage counts each prompt once and every choice's tokens; an engine error
// about one prompt names its element; the tenant's limits count every prompt.

#include <doctest/doctest.h>

#include <map>

#include "daemon/api/openai_request.h"
#include "tests/testing/scripted_daemon.h"

using namespace edge;

namespace {

const std::string kAuth = "Authorization: Bearer 1\r\n";

std::string completion_body(const std::string& prompt, const std::string& extra) {
    return R"({"model":"test-model","prompt":)" + prompt + extra + "}";
}

// Tenant acme, whose API key is "1" (kAuth), with `limits`.
std::string tenant_yaml(const std::string& limits) {
    return "tenants:\n"
           "  - name: acme\n"
           "    api_key_sha256: "
           "[6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b]\n" +
           limits;
}

struct Fixture : testing::ScriptedDaemon {
    explicit Fixture(const std::string& extra = "") : ScriptedDaemon({"test-model"}) {
        start(extra);
    }
    // A connection that has sent a completion request, once the generator has recorded
    // `submitted` requests (its choices).
    std::unique_ptr<testing::TlsClient> complete(const std::string& prompt,
                                                 const std::string& extra, size_t submitted,
                                                 const std::string& headers = "") {
        auto c = client();
        REQUIRE(c->send(testing::http_request("POST", "/v1/completions",
                                              completion_body(prompt, extra), headers))
                    .ok());
        REQUIRE(generator.wait_for_request(submitted - 1));
        return c;
    }
};

boost::json::object json_of(const std::string& s) { return testing::json_object_of(s); }

std::string text_prompt(const engine::GenerateRequest& r) {
    return std::get<std::string>(r.prompt);
}

}  // namespace

TEST_CASE("batch: a whole answer has each prompt's choice by index, the usage summed") {
    Fixture f;
    auto c = f.complete(R"(["one","two","three"])", R"(,"max_tokens":5)", 3);
    const char* prompts[] = {"one", "two", "three"};
    for (size_t i = 0; i < 3; ++i) {
        CHECK(text_prompt(f.generator.request(i)) == prompts[i]);
        CHECK(f.generator.request(i).sampling.max_tokens == 5);
    }
    f.generator.emit(2, "C");
    f.generator.finish(2, engine::FinishReason::kLength, engine::Usage{7, 5, 1});
    f.generator.emit(0, "A");
    f.generator.finish(0, engine::FinishReason::kStop, engine::Usage{2, 1, 0});
    f.generator.emit(1, "B");
    f.generator.finish(1, engine::FinishReason::kStop, engine::Usage{3, 2, 2});
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    auto body = json_of(r->body);
    auto& choices = body["choices"].as_array();
    REQUIRE(choices.size() == 3);
    const char* texts[] = {"A", "B", "C"};
    for (size_t i = 0; i < 3; ++i) {
        CHECK(choices[i].as_object()["index"] == static_cast<int64_t>(i));
        CHECK(choices[i].as_object()["text"] == texts[i]);
    }
    CHECK(choices[2].as_object()["finish_reason"] == "length");
    auto& usage = body["usage"].as_object();
    CHECK(usage["prompt_tokens"] == 12);  // Every prompt's tokens.
    CHECK(usage["completion_tokens"] == 8);
    CHECK(usage["total_tokens"] == 20);
    CHECK(usage["prompt_tokens_details"].as_object()["cached_tokens"] == 3);
}

TEST_CASE("batch: n choices of each token-id prompt, index prompt * n + i, seed + i") {
    Fixture f;
    auto c = f.complete("[[1,2],[3,4,5]]", R"(,"n":2,"seed":41)", 4);
    const std::vector<engine::TokenId> ids[] = {{1, 2}, {1, 2}, {3, 4, 5}, {3, 4, 5}};
    for (size_t i = 0; i < 4; ++i) {
        CAPTURE(i);
        CHECK(std::get<std::vector<engine::TokenId>>(f.generator.request(i).prompt) == ids[i]);
        // Each prompt's choices draw as that prompt alone with n 2 would.
        CHECK(f.generator.request(i).sampling.seed == std::optional<uint64_t>(41 + i % 2));
    }
    for (size_t i = 0; i < 4; ++i) {
        f.generator.emit(i, "t" + std::to_string(i));
        // Each choice reports its prompt's tokens: counted once per prompt.
        f.generator.finish(i, engine::FinishReason::kStop,
                           engine::Usage{i < 2 ? 2 : 3, static_cast<int64_t>(i + 1), 0});
    }
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 200);
    auto body = json_of(r->body);
    auto& choices = body["choices"].as_array();
    REQUIRE(choices.size() == 4);
    for (size_t i = 0; i < 4; ++i) {
        CHECK(choices[i].as_object()["index"] == static_cast<int64_t>(i));
        CHECK(choices[i].as_object()["text"].as_string() == "t" + std::to_string(i));
    }
    CHECK(body["usage"].as_object()["prompt_tokens"] == 5);
    CHECK(body["usage"].as_object()["completion_tokens"] == 10);
}

TEST_CASE("batch: a stream tags each prompt's chunks with its choice index and ends once") {
    for (int n : {1, 2}) {
        CAPTURE(n);
        Fixture f;
        const size_t total = 2 * static_cast<size_t>(n);
        auto c = f.complete(
            R"(["x","y"])",
            R"(,"stream":true,"stream_options":{"include_usage":true},"n":)" + std::to_string(n),
            total);
        for (size_t i = 0; i < total; ++i) {
            CHECK(text_prompt(f.generator.request(i)) == (i < static_cast<size_t>(n) ? "x" : "y"));
        }
        for (size_t i = total; i-- > 0;) {
            f.generator.emit(i, "c" + std::to_string(i));
            f.generator.finish(i, engine::FinishReason::kStop,
                               engine::Usage{i < static_cast<size_t>(n) ? 4 : 6, 1, 0});
        }
        auto all = c->read_until("0\r\n\r\n");
        REQUIRE(all.ok());
        auto events = testing::sse_events(*all);
        std::map<int64_t, std::string> text;
        std::map<int64_t, int> finished;
        size_t usage_events = 0;
        for (const std::string& e : events) {
            if (e == "[DONE]") {
                continue;
            }
            auto o = json_of(e);
            if (o["choices"].as_array().empty()) {
                ++usage_events;
                CHECK(o["usage"].as_object()["prompt_tokens"] == 10);  // 4 + 6, once each.
                CHECK(o["usage"].as_object()["completion_tokens"] == static_cast<int64_t>(total));
                continue;
            }
            auto& choice = o["choices"].as_array()[0].as_object();
            const int64_t index = choice["index"].as_int64();
            text[index] += std::string(choice["text"].as_string());
            if (!choice["finish_reason"].is_null()) {
                ++finished[index];
            }
        }
        REQUIRE(text.size() == total);
        for (size_t i = 0; i < total; ++i) {
            CHECK(text[static_cast<int64_t>(i)] == "c" + std::to_string(i));
            CHECK(finished[static_cast<int64_t>(i)] == 1);
        }
        CHECK(usage_events == 1);
        REQUIRE_FALSE(events.empty());
        CHECK(events.back() == "[DONE]");
        CHECK(std::count(events.begin(), events.end(), "[DONE]") == 1);
    }
}

TEST_CASE("batch: echo returns each choice's own prompt") {
    Fixture f;
    auto c = f.complete(R"(["ab","cd"])", R"(,"echo":true,"logprobs":0)", 2);
    for (size_t i = 0; i < 2; ++i) {
        CHECK(f.generator.request(i).echo_prompt);
        f.generator.emit_prompt(i, {text_prompt(f.generator.request(i))});
        f.generator.emit(i, "!");
        f.generator.finish(i, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    }
    auto r = c->read_response();
    REQUIRE(r.ok());
    auto body = json_of(r->body);
    auto& choices = body["choices"].as_array();
    REQUIRE(choices.size() == 2);
    CHECK(choices[0].as_object()["text"] == "ab!");
    CHECK(choices[1].as_object()["text"] == "cd!");
    CHECK(choices[1].as_object()["logprobs"].as_object()["tokens"].as_array() ==
          boost::json::array{"cd", "!"});
}

TEST_CASE("batch: a prompt the engine refuses is named by its element, the others stop") {
    Fixture f;
    // The engine names the prompt as the request's prompt_field, which the API sets.
    f.generator.fail_submit_at(2, [](const engine::GenerateRequest& r) {
        return out_of_range_error(r.prompt_field +
                                  ": the prompt (9000 tokens) leaves no room for output "
                                  "within the model's context of 4096 tokens");
    });
    auto c = f.complete(R"(["short","short","long"])", "", 2);
    CHECK(f.generator.wait_cancelled(0));
    CHECK(f.generator.wait_cancelled(1));
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 400);
    auto error = json_of(r->body)["error"].as_object();
    CHECK(error["param"] == "prompt[2]");
    CHECK(error["code"] == "context_length_exceeded");
    CHECK(error["message"] ==
          "prompt[2]: the prompt (9000 tokens) leaves no room for output within the model's "
          "context of 4096 tokens");
}

TEST_CASE("batch: an engine error about a token of a prompt names it at the client's depth") {
    // The engine names token j of the prompt it was given prompt_field[j]; the client's field
    // is prompt[i][j], in the message as in param.
    const std::string out_of_range = "token id 99999 is out of range [0, 32000)";
    auto refused = [&](const std::string& prompt, size_t at) {
        Fixture f;
        f.generator.fail_submit_at(at, [&](const engine::GenerateRequest& r) {
            return invalid_argument_error(r.prompt_field + "[2]: " + out_of_range);
        });
        auto r = f.call("POST", "/v1/completions", completion_body(prompt, ""), "");
        CHECK(r.status == 400);
        return json_of(r.body)["error"].as_object();
    };
    auto second = refused("[[1,2],[3,4,99999]]", 1);
    CHECK(second["param"] == "prompt[1][2]");
    CHECK(second["message"].as_string() == "prompt[1][2]: " + out_of_range);
    // A list of one prompt is a list too: prompt[2] would name an element it does not have.
    auto only = refused("[[1,2,99999]]", 0);
    CHECK(only["param"] == "prompt[0][2]");
    CHECK(only["message"].as_string() == "prompt[0][2]: " + out_of_range);
    // One prompt given as ids: the engine's name is the client's.
    auto flat = refused("[1,2,99999]", 0);
    CHECK(flat["param"] == "prompt[2]");
    CHECK(flat["message"].as_string() == "prompt[2]: " + out_of_range);
}

TEST_CASE("batch: the tenant's output budget covers every prompt's choices") {
    Fixture f(tenant_yaml("    output_tokens_per_minute: 100\n"));
    // 2 prompts x 2 choices x 30 tokens is more than the minute's 100.
    auto over = f.call("POST", "/v1/completions",
                       completion_body(R"(["a","b"])", R"(,"n":2,"max_tokens":30)"), kAuth);
    CHECK(over.status == 400);
    CHECK(json_of(over.body)["error"].as_object()["param"] == "max_tokens");
    CHECK(json_of(over.body)["error"].as_object()["message"].as_string().find(
              "4 choices of 30 tokens") != std::string::npos);
    // Without max_tokens, the default (16) is lowered to the choices' share: 100 / 8.
    auto c = f.complete(R"(["a","b","c","d"])", R"(,"n":2)", 8, kAuth);
    CHECK(f.generator.request(0).sampling.max_tokens == 12);
    for (size_t i = 0; i < 8; ++i) {
        f.generator.finish(i, engine::FinishReason::kStop, engine::Usage{1, 1, 0});
    }
    CHECK(c->read_response()->status == 200);
}

TEST_CASE("batch: the prompts together must fit the tenant's input_tokens_per_minute") {
    // A generator that tokenizes only in submit(): each text prompt is counted as it is queued.
    Fixture f(tenant_yaml("    input_tokens_per_minute: 60\n"));
    f.generator.set_prompt_tokens(40);  // Each fits; two do not.
    auto c = f.complete(R"(["a","b"])", "", 2, kAuth);
    CHECK(f.generator.wait_cancelled(0));
    CHECK(f.generator.wait_cancelled(1));
    auto r = c->read_response();
    REQUIRE(r.ok());
    CHECK(r->status == 400);
    auto error = json_of(r->body)["error"].as_object();
    CHECK(error["param"] == "prompt");
    CHECK(error["message"] ==
          "the prompts (80 tokens in prompt[0..1]) exceed this tenant's input_tokens_per_minute "
          "of 60");
}

// `list` (three prompts: 40, 40 and 5 tokens) against an input_tokens_per_minute of 60: refused
// with 400 naming the first two, before any of it reached the generator, and charged the 80
// tokens measured, as a lone prompt refused for its length is (a stream of such lists is held to
// the tenant's input limit): `fitting`, a prompt of 50 tokens sent right after, waits (429).
void check_refused_unqueued(Fixture& f, const std::string& list, const std::string& fitting) {
    f.generator.set_prompt_tokens(40);  // What a queued prompt would count.
    auto r = f.call("POST", "/v1/completions", completion_body(list, ""), kAuth);
    CHECK(r.status == 400);
    auto error = json_of(r.body)["error"].as_object();
    CHECK(error["param"] == "prompt");
    CHECK(error["message"] ==
          "the prompts (80 tokens in prompt[0..1]) exceed this tenant's input_tokens_per_minute "
          "of 60");
    CHECK_FALSE(f.generator.wait_for_request(0, 0));
    auto after = f.call("POST", "/v1/completions", completion_body(fitting, ""), kAuth);
    CHECK(after.status == 429);
    CHECK_FALSE(after.headers["retry-after"].empty());
    CHECK_FALSE(f.generator.wait_for_request(0, 0));
}

TEST_CASE("batch: token-id prompts over the tenant's input budget are refused before any runs") {
    Fixture f(tenant_yaml("    input_tokens_per_minute: 60\n"));
    auto ids = [](int count) {
        std::string s = "[";
        for (int i = 0; i < count; ++i) {
            s += std::string(i > 0 ? "," : "") + "7";
        }
        return s + "]";
    };
    // Each fits; the first two together do not. (An engine counts them as it queues them.)
    check_refused_unqueued(f, "[" + ids(40) + "," + ids(40) + "," + ids(5) + "]", ids(50));
}

TEST_CASE("batch: more choices than the model's queue holds are a 400, not a 429 forever") {
    Fixture f;
    f.generator.set_max_request_sequences(4);
    // Each choice waits as a request of its own: five could never be queued whole.
    auto r = f.call("POST", "/v1/completions", completion_body(R"(["a","b","c"])", R"(,"n":2)"));
    CHECK(r.status == 400);
    auto error = json_of(r.body)["error"].as_object();
    CHECK(error["param"] == "prompt");
    CHECK(error["message"] ==
          "3 prompts with 'n' 2 (6 choices) exceeds the 4 requests model \"test-model\" queues at "
          "once on this site (each choice waits as one); ask for at most 4");
    r = f.call("POST", "/v1/completions", completion_body("\"a\"", R"(,"n":5)"));
    CHECK(r.status == 400);
    CHECK(json_of(r.body)["error"].as_object()["param"] == "n");
    CHECK_FALSE(f.generator.wait_for_request(0, 0));
    // Within the bound, every choice is queued.
    auto c = f.complete(R"(["a","b"])", R"(,"n":2)", 4);
    CHECK_FALSE(f.generator.wait_for_request(4, 0));
}

// The scripted generator tokenizes text as one token per byte (the byte's value) and records the
// field each prompt it measured is named by.
void tokenize_bytes(testing::ScriptedGenerator& generator, std::vector<std::string>& measured) {
    generator.set_tokenize(
        [&measured](const engine::GenerateRequest& r) -> Result<std::vector<engine::TokenId>> {
            measured.push_back(r.prompt_field);
            const std::string& text = std::get<std::string>(r.prompt);
            if (text == "bad") {
                return invalid_argument_error(r.prompt_field + ": text is not valid UTF-8");
            }
            return std::vector<engine::TokenId>(text.begin(), text.end());
        });
}

TEST_CASE("batch: text prompts over the tenant's input budget are refused before any runs") {
    Fixture f(tenant_yaml("    input_tokens_per_minute: 60\n"));
    std::vector<std::string> measured;
    tokenize_bytes(f.generator, measured);
    // Each fits; the first two together do not. (Were they queued, each would count 40.)
    check_refused_unqueued(
        f, "[\"" + std::string(40, 'a') + "\",\"" + std::string(40, 'b') + "\",\"ccccc\"]",
        "\"" + std::string(50, 'd') + "\"");
    // Measured up to the one that overflowed, each by its own name.
    CHECK(measured == std::vector<std::string>{"prompt[0]", "prompt[1]"});
}

TEST_CASE("batch: a prompt alone over the tenant's input budget is refused by its own name") {
    // As the engine refuses a lone prompt over the budget, naming the element, not the list.
    Fixture f(tenant_yaml("    input_tokens_per_minute: 60\n"));
    std::vector<std::string> measured;
    tokenize_bytes(f.generator, measured);
    auto r = f.call("POST", "/v1/completions",
                    completion_body("[\"ab\",\"" + std::string(70, 'x') + "\",\"c\"]", ""), kAuth);
    CHECK(r.status == 400);
    auto error = json_of(r.body)["error"].as_object();
    CHECK(error["param"] == "prompt[1]");
    CHECK(error["message"] ==
          "prompt[1]: the prompt (70 tokens) exceeds this tenant's input_tokens_per_minute of 60");
    CHECK(measured == std::vector<std::string>{"prompt[0]", "prompt[1]"});
    CHECK_FALSE(f.generator.wait_for_request(0, 0));
}

TEST_CASE("batch: measured text prompts run as their ids, a bad one refused by its name") {
    Fixture f(tenant_yaml("    input_tokens_per_minute: 60\n"));
    std::vector<std::string> measured;
    tokenize_bytes(f.generator, measured);
    // The ids measured are what is submitted (not tokenized again), named and echoed as text.
    auto c = f.complete(R"(["ab","cde"])", R"(,"n":2,"echo":true)", 4, kAuth);
    CHECK(measured == std::vector<std::string>{"prompt[0]", "prompt[1]"});
    const std::vector<engine::TokenId> ids[] = {{'a', 'b'}, {'c', 'd', 'e'}};
    for (size_t i = 0; i < 4; ++i) {
        CAPTURE(i);
        const engine::GenerateRequest req = f.generator.request(i);
        CHECK(std::get<std::vector<engine::TokenId>>(req.prompt) == ids[i / 2]);
        CHECK(req.prompt_field == "prompt[" + std::to_string(i / 2) + "]");
        CHECK(req.echo_prompt);
        f.generator.finish(i, engine::FinishReason::kStop, engine::Usage{2, 1, 0});
    }
    CHECK(c->read_response()->status == 200);
    // A prompt the generator cannot tokenize: its error, nothing queued.
    measured.clear();
    auto bad = f.call("POST", "/v1/completions", completion_body(R"(["ok","bad","x"])", ""), kAuth);
    CHECK(bad.status == 400);
    auto error = json_of(bad.body)["error"].as_object();
    CHECK(error["param"] == "prompt[1]");
    CHECK(error["message"] == "prompt[1]: text is not valid UTF-8");
    CHECK(measured == std::vector<std::string>{"prompt[0]", "prompt[1]"});
    CHECK_FALSE(f.generator.wait_for_request(4, 0));
}

TEST_CASE("batch: measured text prompts are echoed as sent, not as their ids read") {
    // Measuring turns each text into the ids that run (a BOS the generator adds included); the
    // echo is still the client's text.
    Fixture f(tenant_yaml("    input_tokens_per_minute: 60\n"));
    std::vector<std::string> measured;
    tokenize_bytes(f.generator, measured);
    auto c = f.complete(R"(["ab","cde"])", R"(,"echo":true)", 2, kAuth);
    for (size_t i = 0; i < 2; ++i) {
        CAPTURE(i);
        REQUIRE(
            std::holds_alternative<std::vector<engine::TokenId>>(f.generator.request(i).prompt));
        f.generator.emit_prompt(i, {"<s>", i == 0 ? "ab" : "cde"});
        f.generator.emit(i, "!");
        f.generator.finish(i, engine::FinishReason::kStop, engine::Usage{2, 1, 0});
    }
    auto r = c->read_response();
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    auto body = json_of(r->body);
    auto& choices = body["choices"].as_array();
    REQUIRE(choices.size() == 2);
    CHECK(choices[0].as_object()["text"] == "ab!");
    CHECK(choices[1].as_object()["text"] == "cde!");
}

TEST_CASE("batch: the parser takes lists of strings or of token ids, not both, within the cap") {
    using daemon::api::ApiError;
    using daemon::api::Endpoint;
    using daemon::api::ParsedRequest;
    auto parse = [](const std::string& prompt, const std::string& extra = "") {
        return daemon::api::parse_openai_request(Endpoint::kCompletions,
                                                 completion_body(prompt, extra));
    };
    auto error_param = [&](const std::string& prompt, const std::string& extra = "") {
        auto r = parse(prompt, extra);
        REQUIRE(std::holds_alternative<ApiError>(r));
        return std::get<ApiError>(r).param.value_or("");
    };
    auto texts = parse(R"(["a","b","c"])");
    REQUIRE(std::holds_alternative<ParsedRequest>(texts));
    const ParsedRequest& t = std::get<ParsedRequest>(texts);
    CHECK(std::get<std::string>(t.generate.prompt) == "a");
    REQUIRE(t.more_prompts.size() == 2);
    CHECK(std::get<std::string>(t.more_prompts[1]) == "c");
    CHECK(t.prompts() == 3);
    CHECK(t.choices() == 3);
    auto ids = parse("[[1],[2,3]]", R"(,"n":4)");
    REQUIRE(std::holds_alternative<ParsedRequest>(ids));
    CHECK(std::get<std::vector<engine::TokenId>>(std::get<ParsedRequest>(ids).more_prompts[0]) ==
          std::vector<engine::TokenId>{2, 3});
    CHECK(std::get<ParsedRequest>(ids).choices() == 8);
    // One prompt, as before: a string, ids, a list of one.
    CHECK(std::get<ParsedRequest>(parse("[[1,2]]")).prompts() == 1);
    CHECK(std::get<ParsedRequest>(parse("[1,2]")).prompts() == 1);
    // Mixed and empty elements are named.
    CHECK(error_param(R"(["a",[1]])") == "prompt[1]");
    CHECK(error_param(R"([[1],"a"])") == "prompt[1]");
    CHECK(error_param(R"([[1],5])") == "prompt[1]");
    CHECK(error_param(R"(["a",null])") == "prompt[1]");
    CHECK(error_param(R"([[1],[]])") == "prompt[1]");
    CHECK(error_param(R"([[1],[2,-3]])") == "prompt[1][1]");
    {
        auto r = parse(R"(["a",[1]])");
        CHECK(std::get<ApiError>(r).message ==
              "'prompt[1]' must be a string, as 'prompt[0]' is: a list of prompts holds strings "
              "or arrays of token ids, not both");
    }
    // The cap: kMaxBatchChoices choices over all the prompts.
    auto list = [](int count) {
        std::string s = "[";
        for (int i = 0; i < count; ++i) {
            s += std::string(i > 0 ? "," : "") + "\"p\"";
        }
        return s + "]";
    };
    CHECK(std::get<ParsedRequest>(parse(list(daemon::api::kMaxBatchChoices))).prompts() ==
          daemon::api::kMaxBatchChoices);
    CHECK(error_param(list(daemon::api::kMaxBatchChoices + 1)) == "prompt");
    CHECK(std::get<ParsedRequest>(parse(list(32), R"(,"n":2)")).choices() == 64);
    auto over = parse(list(33), R"(,"n":2)");
    REQUIRE(std::holds_alternative<ApiError>(over));
    CHECK(std::get<ApiError>(over).param == "prompt");
    CHECK(std::get<ApiError>(over).message ==
          "'prompt' holds 33 prompts and 'n' is 2: at most 64 choices per request (n for each "
          "prompt)");
}
