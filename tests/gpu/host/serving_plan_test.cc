// Serving on the device, host side (no GPU): the batch-size buckets, the scheduler's chunks as
// device rows with their slots' KV block tables translated into the device table, padded rows
// masked to the scratch block, the logits copied back, copy-on-write moves of the host cache,
// the checks before an upload, and the decision to serve on the device or fall back.

#include "engine/cuda/host/serving_plan.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "engine/cuda/host/checkpoint_model.h"
#include "engine/cuda/host/paged_kv_layout.h"
#include "engine/model/kv_cache.h"
#include "engine/model/loader.h"

namespace edge::engine::cuda {
namespace {

const std::string kMicro = EDGE_SOURCE_DIR "/tests/fixtures/micro-qwen3-moe";

int32_t at(const DeviceStep& s, int64_t i) { return s.staging[static_cast<size_t>(i)]; }

TEST_CASE("serving buckets: powers of two up to max_rows, the smallest that holds the rows") {
    CHECK(serving_max_rows(1) == 64);
    CHECK(serving_max_rows(64) == 64);
    CHECK(serving_max_rows(65) == 128);
    CHECK(serving_max_rows(100000) == 512);
    // Logits rows: one per sequence (at least 16), never more than the rows.
    CHECK(serving_max_logit_rows(1, 64) == 16);
    CHECK(serving_max_logit_rows(4, 64) == 16);
    CHECK(serving_max_logit_rows(17, 64) == 32);
    CHECK(serving_max_logit_rows(100, 64) == 64);
    CHECK(serving_max_logit_rows(300, 512) == 512);
    CHECK(serving_max_logit_rows(4, 8) == 8);
    CHECK(serving_max_logit_rows(1, 1) == 1);
    auto b = row_buckets(64);
    REQUIRE(b.ok());
    CHECK(*b == std::vector<int32_t>{1, 2, 4, 8, 16, 24, 32, 48, 64});
    CHECK(*row_buckets(512) ==
          std::vector<int32_t>{1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512});
    CHECK(*row_buckets(16) == std::vector<int32_t>{1, 2, 4, 8, 16});
    CHECK(*row_buckets(1) == std::vector<int32_t>{1});
    auto odd = row_buckets(48);
    REQUIRE(odd.ok());
    CHECK(*odd == std::vector<int32_t>{1, 2, 4, 8, 16, 24, 32, 48});
    CHECK(*row_buckets(40) == std::vector<int32_t>{1, 2, 4, 8, 16, 24, 32, 40});
    CHECK(*row_buckets(20) == std::vector<int32_t>{1, 2, 4, 8, 16, 20});
    CHECK_FALSE(row_buckets(0).ok());
    CHECK(*choose_bucket(*b, 1) == 1);
    CHECK(*choose_bucket(*b, 3) == 4);
    CHECK(*choose_bucket(*b, 17) == 24);
    CHECK(*choose_bucket(*b, 33) == 48);
    CHECK(*choose_bucket(*b, 49) == 64);
    CHECK(*choose_bucket(*b, 64) == 64);
    CHECK(*choose_bucket(*odd, 40) == 48);
    CHECK_FALSE(choose_bucket(*b, 65).ok());
    CHECK_FALSE(choose_bucket(*b, 0).ok());
}

TEST_CASE("device rows: slots' block tables translated, padded rows on the scratch block") {
    const StepLayout layout{8, 4, 8};
    const auto buckets = *row_buckets(8);
    const int32_t scratch = 50;
    const std::vector<TokenId> decode = {7};
    const std::vector<TokenId> prompt = {1, 2, 3, 4, 5};
    // Slot 3 decodes position 20 (blocks 9, 4); slot 1 prefills positions 0..4 (block 12).
    const std::vector<SequenceChunk> batch = {{3, 20, decode, false}, {1, 0, prompt, false}};
    const SlotTables tables = {{9, 4}, {12}};
    auto planned = plan_device_steps(batch, tables, layout, buckets, scratch);
    REQUIRE(planned.ok());
    const std::vector<DeviceStep>& steps = *planned;
    REQUIRE(steps.size() == 1);
    const DeviceStep& s = steps[0];
    CHECK(s.rows == 6);
    CHECK(s.bucket == 8);
    // Tokens, positions and table rows of the real rows.
    const std::vector<int32_t> want_tok = {7, 1, 2, 3, 4, 5};
    const std::vector<int32_t> want_pos = {20, 0, 1, 2, 3, 4};
    const std::vector<int32_t> want_seq = {0, 1, 1, 1, 1, 1};
    for (int32_t r = 0; r < 6; ++r) {
        CAPTURE(r);
        CHECK(at(s, layout.tokens_offset() + r) == want_tok[r]);
        CHECK(at(s, layout.positions_offset() + r) == want_pos[r]);
        CHECK(at(s, layout.seqs_offset() + r) == want_seq[r]);
    }
    // Padded rows: token 0 at position 0 of the pad row (row 2, after the two chunks).
    for (int32_t r = 6; r < 8; ++r) {
        CHECK(at(s, layout.tokens_offset() + r) == 0);
        CHECK(at(s, layout.positions_offset() + r) == 0);
        CHECK(at(s, layout.seqs_offset() + r) == 2);
    }
    // Three table rows uploaded: the slots' tables (rest scratch) and the all-scratch pad row.
    REQUIRE(s.staging.size() == static_cast<size_t>(layout.table_offset() + 3 * 4));
    const std::vector<int32_t> want_table = {9, 4, 50, 50, 12, 50, 50, 50, 50, 50, 50, 50};
    CHECK(std::vector<int32_t>(s.staging.begin() + layout.table_offset(), s.staging.end()) ==
          want_table);
    // Logits: the decode row and the prompt's last row, in chunk order: the LM head runs on
    // those two rows only (logit bucket 2), gathered into compact rows 0 and 1 (the other
    // gather indices are row 0), and one copy brings both back.
    CHECK(s.logit_rows == std::vector<int32_t>{0, 5});
    CHECK(s.logit_bucket == 2);
    const std::vector<int32_t> want_gather = {0, 5, 0, 0, 0, 0, 0, 0};
    CHECK(std::vector<int32_t>(s.staging.begin() + layout.logit_rows_offset(),
                               s.staging.begin() + layout.table_offset()) == want_gather);
    CHECK(check_staging(layout, s.staging, s.bucket, s.logit_bucket, 512, scratch + 1).ok());
    const auto runs = logit_runs(s, 3);
    REQUIRE(runs.size() == 1);
    CHECK(runs[0].first_row == 0);
    CHECK(runs[0].rows == 2);
    CHECK(runs[0].out_row == 3);
}

TEST_CASE("device rows: half-step buckets, and the logit bucket never above the step's") {
    // 32 decoding sequences and a 16-token prefill chunk: 48 rows run the 48-row graph (not 64),
    // 33 logits rows the 48-row logit bucket of max_logit_rows 64.
    const StepLayout layout{64, 2, 64};
    const auto buckets = *row_buckets(64);
    const int32_t scratch = 200;
    std::vector<SequenceChunk> batch;
    SlotTables tables;
    const std::vector<TokenId> one = {9};
    for (int32_t slot = 0; slot < 32; ++slot) {
        batch.push_back({slot, 5, one, false});
        tables.push_back({slot});
    }
    std::vector<TokenId> prompt(16);
    std::iota(prompt.begin(), prompt.end(), 100);
    batch.push_back({40, 0, prompt, false});
    tables.push_back({40});
    auto planned = plan_device_steps(batch, tables, layout, buckets, scratch);
    REQUIRE(planned.ok());
    REQUIRE(planned->size() == 1);
    const DeviceStep& s = (*planned)[0];
    CHECK(s.rows == 48);
    CHECK(s.bucket == 48);
    CHECK(s.logit_rows.size() == 33);
    CHECK(s.logit_bucket == 48);
    CHECK(check_staging(layout, s.staging, s.bucket, s.logit_bucket, 512, scratch + 1).ok());
    // Every step's logit bucket fits its bucket, for each row count and logits rows from one to
    // all of them, with a logits limit in and out of the bucket series.
    for (int32_t max_logits : {64, 32, 20}) {
        const auto logit_buckets = *row_buckets(max_logits);
        for (int32_t rows = 1; rows <= 64; ++rows) {
            const int32_t bucket = *choose_bucket(buckets, rows);
            for (int32_t want = 1; want <= std::min(rows, max_logits); ++want) {
                CAPTURE(max_logits);
                CAPTURE(rows);
                CAPTURE(want);
                CHECK(*choose_bucket(logit_buckets, want) <= std::min(bucket, max_logits));
            }
        }
    }
}

TEST_CASE("device rows: a chunk longer than max_rows runs as several steps, logits in order") {
    const StepLayout layout{4, 2, 4};
    const auto buckets = *row_buckets(4);
    std::vector<TokenId> prompt(10);
    std::iota(prompt.begin(), prompt.end(), 100);
    const std::vector<TokenId> one = {9};
    for (bool all : {false, true}) {
        CAPTURE(all);
        const std::vector<SequenceChunk> batch = {{0, 3, prompt, all}, {5, 0, one, false}};
        const SlotTables tables = {{2}, {6}};
        auto planned = plan_device_steps(batch, tables, layout, buckets, 8);
        REQUIRE(planned.ok());
        const std::vector<DeviceStep>& steps = *planned;
        REQUIRE(steps.size() == 3);
        CHECK(steps[0].rows == 4);
        CHECK(steps[1].rows == 4);
        CHECK(steps[2].rows == 3);  // Prompt tokens 8, 9 and the other chunk's token.
        CHECK(steps[2].bucket == 4);
        // The prompt's first two steps want no logits unless all_logits: no LM head there.
        CHECK(steps[0].logit_bucket == (all ? 4 : 0));
        CHECK(steps[1].logit_bucket == (all ? 4 : 0));
        CHECK(steps[2].logit_bucket == (all ? 4 : 2));
        CHECK(logit_runs(steps[0], 0).size() == (all ? 1u : 0u));
        // Positions continue across steps; each step carries the prompt's table row 0.
        int32_t pos = 3;
        for (const DeviceStep& s : steps) {
            for (int32_t r = 0; r < s.rows; ++r) {
                if (at(s, layout.tokens_offset() + r) >= 100) {
                    CHECK(at(s, layout.positions_offset() + r) == pos++);
                    CHECK(at(s, layout.seqs_offset() + r) == 0);
                }
            }
            CHECK(at(s, layout.table_offset()) == 2);
            CHECK(check_staging(layout, s.staging, s.bucket, s.logit_bucket, 512, 9).ok());
        }
        CHECK(pos == 13);
        CHECK(at(steps[2], layout.seqs_offset() + 2) == 1);  // Slot 5's table row.
        CHECK(at(steps[2], layout.seqs_offset() + 3) == 2);  // The pad row.
        CHECK(at(steps[2], layout.table_offset() + 2) == 6);
        size_t wanted = 0;
        int64_t out = 0;
        for (const DeviceStep& s : steps) {
            const auto runs = logit_runs(s, out);
            for (const RowRun& r : runs) {
                CHECK(r.out_row == out);
                out += r.rows;
            }
            wanted += s.logit_rows.size();
        }
        CHECK(wanted == (all ? 11u : 2u));
        CHECK(out == static_cast<int64_t>(wanted));
        if (all) {
            REQUIRE(logit_runs(steps[0], 0).size() == 1);  // 4 rows, one copy.
            CHECK(logit_runs(steps[0], 0)[0].rows == 4);
        }
    }
}

TEST_CASE(
    "device rows: random batches keep every real row on its slot's blocks, logits gathered") {
    std::mt19937 rng(7);
    // At most 4 logits rows per step: all_logits chunks split steps before a fifth.
    const StepLayout layout{16, 6, 4};
    const auto buckets = *row_buckets(16);
    const int32_t scratch = 200;
    for (int iter = 0; iter < 200; ++iter) {
        std::vector<int32_t> blocks(scratch);
        std::iota(blocks.begin(), blocks.end(), 0);
        std::shuffle(blocks.begin(), blocks.end(), rng);
        const int chunks = 1 + static_cast<int>(rng() % 6);
        std::vector<std::vector<TokenId>> toks(chunks);
        std::vector<SequenceChunk> batch;
        SlotTables tables;
        size_t next = 0;
        for (int c = 0; c < chunks; ++c) {
            const int32_t start = static_cast<int32_t>(rng() % 60);
            const int32_t n = 1 + static_cast<int32_t>(rng() % 30);
            toks[c].resize(static_cast<size_t>(n));
            for (TokenId& t : toks[c]) {
                t = static_cast<TokenId>(rng() % 512);
            }
            tables.emplace_back(
                blocks.begin() + static_cast<int64_t>(next),
                blocks.begin() + static_cast<int64_t>(next) + kv_blocks_for(start + n));
            next += static_cast<size_t>(kv_blocks_for(start + n));
            batch.push_back(SequenceChunk{c * 3, start, toks[c], (rng() % 2) == 0});
        }
        auto planned = plan_device_steps(batch, tables, layout, buckets, scratch);
        REQUIRE(planned.ok());
        const std::vector<DeviceStep>& steps = *planned;
        int64_t rows = 0, wanted = 0;
        size_t chunk = 0;
        int32_t j = 0;  // Token of `chunk` the next real row runs.
        for (const DeviceStep& s : steps) {
            REQUIRE(check_staging(layout, s.staging, s.bucket, s.logit_bucket, 512, scratch + 1)
                        .ok());
            const int64_t table_rows =
                (static_cast<int64_t>(s.staging.size()) - layout.table_offset()) / 6;
            // The logit bucket: none without logits, else the smallest power of two holding
            // them, within the step's bucket; the gather indices are the logit rows, then 0.
            const int32_t n_logits = static_cast<int32_t>(s.logit_rows.size());
            CHECK(n_logits <= 4);
            if (n_logits == 0) {
                CHECK(s.logit_bucket == 0);
            } else {
                CHECK(s.logit_bucket >= n_logits);
                CHECK(s.logit_bucket < 2 * n_logits);
                CHECK(s.logit_bucket <= s.bucket);
            }
            for (int32_t i = 0; i < layout.max_logit_rows; ++i) {
                CHECK(at(s, layout.logit_rows_offset() + i) ==
                      (i < n_logits ? s.logit_rows[static_cast<size_t>(i)] : 0));
            }
            size_t next_logit = 0;
            for (int32_t r = 0; r < s.bucket; ++r) {
                const int32_t seq = at(s, layout.seqs_offset() + r);
                const int32_t pos = at(s, layout.positions_offset() + r);
                const int32_t block = at(s, layout.table_offset() + int64_t{seq} * 6 + pos / 16);
                if (r >= s.rows) {
                    // Padded: the pad row (last), only the scratch block everywhere.
                    CHECK(seq == table_rows - 1);
                    for (int32_t e = 0; e < 6; ++e) {
                        CHECK(at(s, layout.table_offset() + int64_t{seq} * 6 + e) == scratch);
                    }
                    continue;
                }
                const SequenceChunk& ch = batch[chunk];
                CHECK(at(s, layout.tokens_offset() + r) == ch.tokens[static_cast<size_t>(j)]);
                CHECK(pos == ch.start_pos + j);
                CHECK(block == tables[chunk][static_cast<size_t>(pos / 16)]);
                CHECK(block != scratch);
                ++rows;
                if (ch.all_logits || j + 1 == static_cast<int32_t>(ch.tokens.size())) {
                    // A row that wants logits is the step's next gathered row.
                    REQUIRE(next_logit < s.logit_rows.size());
                    CHECK(s.logit_rows[next_logit++] == r);
                }
                if (++j == static_cast<int32_t>(ch.tokens.size())) {
                    ++chunk;
                    j = 0;
                }
            }
            CHECK(next_logit == s.logit_rows.size());
            wanted += static_cast<int64_t>(s.logit_rows.size());
        }
        int64_t want_rows = 0, want_logits = 0;
        for (const SequenceChunk& ch : batch) {
            want_rows += static_cast<int64_t>(ch.tokens.size());
            want_logits += ch.all_logits ? static_cast<int64_t>(ch.tokens.size()) : 1;
        }
        CHECK(rows == want_rows);
        CHECK(wanted == want_logits);
    }
}

TEST_CASE("device rows: tables that would reach outside the pool are refused, naming the chunk") {
    const StepLayout layout{8, 2, 8};
    const auto buckets = *row_buckets(8);
    const std::vector<TokenId> toks = {1, 2};
    const std::vector<SequenceChunk> batch = {{4, 15, toks, false}};
    // Positions 15..16 need two blocks.
    Status short_table = plan_device_steps(batch, {{3}}, layout, buckets, 10).status();
    CHECK(short_table.code() == StatusCode::kInvalidArgument);
    CHECK(short_table.message().find("chunk 0 (slot 4)") != std::string::npos);
    CHECK_FALSE(plan_device_steps(batch, {{3, 10}}, layout, buckets, 10).ok());
    CHECK_FALSE(plan_device_steps(batch, {{3, -1}}, layout, buckets, 10).ok());
    CHECK_FALSE(plan_device_steps(batch, {{3, 4, 5}}, layout, buckets, 10).ok());
    CHECK_FALSE(plan_device_steps(batch, {}, layout, buckets, 10).ok());
    CHECK_FALSE(plan_device_steps(batch, {{3, 4}}, StepLayout{16, 2, 16}, buckets, 10).ok());
    CHECK_FALSE(plan_device_steps(batch, {{3, 4}}, StepLayout{8, 2, 0}, buckets, 10).ok());
    CHECK_FALSE(plan_device_steps(batch, {{3, 4}}, StepLayout{8, 2, 9}, buckets, 10).ok());
    CHECK(plan_device_steps(batch, {{3, 4}}, layout, buckets, 10).ok());
}

TEST_CASE(
    "staging checks: bad tokens, table rows, positions, gather rows, blocks and sizes are "
    "refused") {
    const StepLayout layout{4, 2, 4};
    const auto buckets = *row_buckets(4);
    const std::vector<TokenId> toks = {5, 6};
    auto steps = plan_device_steps(std::vector<SequenceChunk>{{0, 0, toks, false}}, {{1}}, layout,
                                   buckets, 3);
    REQUIRE(steps.ok());
    const std::vector<int32_t> good = (*steps)[0].staging;
    REQUIRE((*steps)[0].logit_bucket == 1);
    CHECK(check_staging(layout, good, 2, 1, 512, 4).ok());
    CHECK(check_staging(layout, good, 2, 0, 512, 4).ok());
    CHECK(check_staging(layout, good, 2, 2, 512, 4).ok());  // Pads gather row 0.
    auto bad = [&](int64_t i, int32_t v) {
        std::vector<int32_t> s = good;
        s[static_cast<size_t>(i)] = v;
        return check_staging(layout, s, 2, 1, 512, 4);
    };
    // A gather index outside the bucket's rows, or a logit bucket past the bucket or layout.
    const Status gather = bad(layout.logit_rows_offset(), 2);
    CHECK(gather.code() == StatusCode::kInvalidArgument);
    CHECK(gather.message().find("logits row 0") != std::string::npos);
    CHECK_FALSE(bad(layout.logit_rows_offset(), -1).ok());
    CHECK(bad(layout.logit_rows_offset() + 1, 7).ok());  // Past the logit bucket: unused.
    CHECK_FALSE(check_staging(layout, good, 2, 3, 512, 4).ok());
    CHECK_FALSE(check_staging(layout, good, 2, -1, 512, 4).ok());
    CHECK_FALSE(check_staging(StepLayout{4, 2, 0}, good, 2, 0, 512, 4).ok());
    CHECK_FALSE(bad(layout.tokens_offset() + 1, 512).ok());
    CHECK_FALSE(bad(layout.tokens_offset(), -1).ok());
    CHECK_FALSE(bad(layout.seqs_offset() + 1, 2).ok());  // Only rows 0 and 1 are uploaded.
    CHECK_FALSE(bad(layout.positions_offset(), 32).ok());
    CHECK_FALSE(bad(layout.table_offset() + 1, 4).ok());
    CHECK_FALSE(check_staging(layout, good, 5, 1, 512, 4).ok());
    CHECK_FALSE(check_staging(layout, good, 0, 0, 512, 4).ok());
    std::vector<int32_t> ragged = good;
    ragged.push_back(0);
    CHECK_FALSE(check_staging(layout, ragged, 2, 1, 512, 4).ok());
    CHECK_FALSE(
        check_staging(layout, std::span<const int32_t>(good.data(), 12), 2, 1, 512, 4).ok());
}

TEST_CASE("copy-on-write in the host KV cache is seen as a block move for the device pool") {
    KvCacheShape shape;
    shape.layers = 1;
    shape.kv_heads = 1;
    shape.head_dim = 4;
    shape.slots = 2;
    shape.max_context = 64;
    shape.block_tokens = 16;
    shape.budget_bytes = 16 * 16 * 2 * 4 * 8;  // 16 blocks.
    auto kv = KvCache::create(shape);
    REQUIRE(kv.ok());
    KvCache& c = **kv;
    const int32_t a = *c.acquire();
    REQUIRE(c.reserve(std::vector<SlotGrowth>{{a, 32}}).ok());
    c.set_length(a, 32);
    BlockHash h1{}, h2{};
    h1[0] = 1;
    h2[0] = 2;
    const std::vector<BlockHash> chain = {h1, h2};
    c.publish_prefix(a, chain);
    const int32_t b = *c.acquire();
    REQUIRE(c.attach_prefix(b, chain) == 32);
    c.truncate(b, 20);  // Block 1 is now partly b's and still a's.
    const std::vector<int32_t> before(c.blocks(b).begin(), c.blocks(b).end());
    REQUIRE(c.reserve(std::vector<SlotGrowth>{{b, 21}}).ok());
    const std::vector<int32_t> after(c.blocks(b).begin(), c.blocks(b).end());
    const auto moves = moved_blocks(before, after, 20, 16);
    REQUIRE(moves.size() == 1);
    CHECK(moves[0] == BlockMove{before[1], after[1]});
    CHECK(after[1] != before[1]);
    CHECK(after[0] == before[0]);  // The full shared block is only read.
    // Growth into new blocks moves nothing.
    CHECK(moved_blocks(std::vector<int32_t>{3}, std::vector<int32_t>{3, 8}, 16, 16).empty());
    CHECK(moved_blocks(std::vector<int32_t>{}, std::vector<int32_t>{5}, 0, 16).empty());
}

TEST_CASE("serving on the device or falling back: the decision and its reasons") {
    CHECK(device_serving_refusal({"cuda", 1, 16}).empty());
    CHECK(device_serving_refusal({"cpu", 1, 16}).find("cpu") != std::string::npos);
    CHECK(device_serving_refusal({"cuda", 2, 16}).find("sharding") != std::string::npos);
    CHECK(device_serving_refusal({"cuda", 1, 32}).find("kv_block_tokens") != std::string::npos);
    CHECK(serving_path_after(ok_status()) == ServingPath::kDevice);
    CHECK(serving_path_after(unimplemented_error("x")) == ServingPath::kFallback);
    CHECK(serving_path_after(resource_exhausted_error("x")) == ServingPath::kFail);
    CHECK(serving_path_after(unavailable_error("x")) == ServingPath::kFail);
    // An earlier model's CUDA backend holds the device's memory in its arena: the start fails
    // and says which order works. Other errors, or no arena held, are as they came.
    const Status full = device_load_failure(resource_exhausted_error("arena of 9 GiB"), true);
    CHECK(full.code() == StatusCode::kResourceExhausted);
    CHECK(full.message().starts_with("arena of 9 GiB (an earlier model"));
    CHECK(full.message().find("list the models the device forward runs before it") !=
          std::string::npos);
    CHECK(device_load_failure(resource_exhausted_error("x"), false).message() == "x");
    CHECK(device_load_failure(unavailable_error("x"), true).message() == "x");
    // The fixture architectures all run on the device (DeepSeek-V3 with MLA attention).
    for (const char* name : {"micro-glm4-moe", "micro-deepseek-v3"}) {
        CAPTURE(name);
        auto m =
            read_checkpoint_model(EDGE_SOURCE_DIR "/tests/fixtures/" + std::string(name), "none");
        CHECK_MESSAGE(m.ok(), m.status().to_string());
    }
    auto missing = read_checkpoint_model(kMicro + "/nowhere", "none");
    REQUIRE_FALSE(missing.ok());
    CHECK(serving_path_after(missing.status()) == ServingPath::kFail);
}

TEST_CASE("the device model's spec is the CPU model's (same sampler inputs, same version)") {
    const std::string glm = EDGE_SOURCE_DIR "/tests/fixtures/micro-glm4-moe";
    for (const std::pair<std::string, std::string>& run :
         std::vector<std::pair<std::string, std::string>>{
             {kMicro, "none"}, {kMicro, "experts-int4"}, {glm, "none"}, {glm, "experts-int4"}}) {
        const std::string& dir = run.first;
        const std::string& policy = run.second;
        CAPTURE(dir);
        CAPTURE(policy);
        LoadOptions lo;
        lo.threads = 1;
        lo.max_slots = 2;
        lo.max_context = 256;
        lo.quantization = policy;
        auto cpu = load_model(dir, lo);
        REQUIRE(cpu.ok());
        const ModelSpec& want = (*cpu)->spec();
        auto m = read_checkpoint_model(dir, policy);
        REQUIRE(m.ok());
        auto spec = serving_model_spec(dir, *m, 256);
        REQUIRE(spec.ok());
        CHECK(spec->architecture == want.architecture);
        CHECK(spec->vocab_size == want.vocab_size);
        CHECK(spec->max_context == want.max_context);
        CHECK(spec->eos_token_ids == want.eos_token_ids);
        CHECK(spec->bos_token_id == want.bos_token_id);
        CHECK(spec->version == want.version);
        CHECK(spec->weight_bytes == want.weight_bytes);
        CHECK(spec->kv_bytes_per_token == want.kv_bytes_per_token);
        CHECK(serving_model_spec(dir, *m, 0)->max_context == m->max_position);
        // Refused with the CPU load's and the preflight's text.
        const Status too_long = serving_model_spec(dir, *m, m->max_position + 1).status();
        CHECK(too_long.to_string() ==
              check_model_files(dir, "", {}, m->max_position + 1).to_string());
        // The arena covers the weights and the pool, and grows with the rows.
        const int64_t small = serving_arena_bytes(*m, 64, 16, 100, 16, 256);
        const PagedKvLayout kv{m->layers, m->kv_heads, m->head_dim, 100};
        CHECK(small > spec->weight_bytes + kv.pool_floats() * 4);
        CHECK(serving_arena_bytes(*m, 128, 16, 100, 16, 256) > small);
        // The logits are sized by the logits rows, not the rows: 48 more logits rows cost 48
        // vocab rows of floats (the staging's 48 gather indices and the 1/8 margin on top).
        const int64_t all_rows = serving_arena_bytes(*m, 64, 64, 100, 16, 256);
        const int64_t logits = int64_t{48} * m->vocab * 4;
        CHECK(all_rows - small >= logits);
        CHECK(all_rows - small <= (logits + 48 * 4) * 9 / 8 + 1);
    }
}

}  // namespace
}  // namespace edge::engine::cuda
