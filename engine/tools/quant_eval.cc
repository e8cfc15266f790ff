#include "engine/tools/quant_eval.h"

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <string_view>

#include <unistd.h>

#include <boost/json.hpp>

#include "common/cli_flags.h"
#include "common/json_text.h"
#include "engine/cpu/thread_pool.h"
#include "engine/model/loader.h"
#include "engine/model/safetensors.h"
#include "engine/quant/policy.h"
#include "engine/tokenizer/tiktoken.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/cli.h"

namespace edge::engine {

namespace json = boost::json;
namespace {

struct Run {
    std::vector<float> logits;  // Every scored position, vocab floats each.
    int64_t weight_bytes = 0;
    double decode_tps = 0.0;
};

// The text to score as token ids, and the size of the tokenizer that made them (0 when the
// options gave ids).
struct EvalIds {
    std::vector<TokenId> ids;
    int64_t tokenizer_vocab = 0;
};

Result<Run> run_model(const QuantEvalOptions& o, const std::string& policy, const EvalIds& text,
                      int64_t* vocab) {
    const std::vector<TokenId>& ids = text.ids;
    LoadOptions lo;
    lo.threads = o.threads;
    lo.max_slots = 1;
    lo.max_context = static_cast<int32_t>(std::max<int64_t>(o.chunk, o.decode_steps + 1));
    lo.quantization = policy;
    Result<std::unique_ptr<CausalLM>> loaded = load_model(o.model_dir, lo);
    if (!loaded.ok() && lo.max_context == o.chunk &&
        loaded.status().message().find("max_context") != std::string::npos) {
        return loaded.status().with_context("quant-eval: --chunk " + std::to_string(o.chunk));
    }
    EDGE_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model, std::move(loaded));
    *vocab = model->spec().vocab_size;
    // As the engine refuses such a model at load: a tokenizer larger than the model.
    if (text.tokenizer_vocab > *vocab) {
        return invalid_argument_error("tokenizer.json has " + std::to_string(text.tokenizer_vocab) +
                                      " tokens but the model's vocab_size is " +
                                      std::to_string(*vocab));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= *vocab) {
            return invalid_argument_error("token id " + std::to_string(ids[i]) + " at position " +
                                          std::to_string(i) + " is outside the vocabulary of " +
                                          std::to_string(*vocab));
        }
    }
    // Every position's logits are kept, for the baseline and a policy at once: they must fit.
    const double logit_bytes = 2.0 * static_cast<double>(ids.size()) *
                               static_cast<double>(*vocab) * static_cast<double>(sizeof(float));
    const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                          static_cast<double>(sysconf(_SC_PAGESIZE));
    if (logit_bytes > memory / 2) {
        return invalid_argument_error(
            "quant-eval: " + std::to_string(ids.size()) + " tokens of a " +
            std::to_string(*vocab) + "-token vocabulary keep " +
            std::to_string(static_cast<int64_t>(logit_bytes / (1 << 20))) +
            " MiB of logits (baseline and policy), more than half this machine's memory; "
            "lower --tokens");
    }
    Run r;
    r.weight_bytes = model->spec().weight_bytes;
    r.logits.reserve(ids.size() * static_cast<size_t>(*vocab));
    std::vector<float> out;
    for (size_t c = 0; c < ids.size(); c += static_cast<size_t>(o.chunk)) {
        const size_t n = std::min(ids.size() - c, static_cast<size_t>(o.chunk));
        EDGE_ASSIGN_OR_RETURN(int32_t slot, model->acquire_slot());
        SequenceChunk ch{slot, 0, std::span<const TokenId>(ids.data() + c, n), true};
        Status st = model->forward({&ch, 1}, &out);
        model->release_slot(slot);
        EDGE_RETURN_IF_ERROR(st);
        r.logits.insert(r.logits.end(), out.begin(), out.end());
    }
    if (o.decode_steps > 0 && !ids.empty()) {
        EDGE_ASSIGN_OR_RETURN(int32_t slot, model->acquire_slot());
        TokenId tok = ids[0];
        const auto t0 = std::chrono::steady_clock::now();
        for (int32_t s = 0; s <= o.decode_steps; ++s) {
            SequenceChunk ch{slot, s, std::span<const TokenId>(&tok, 1), false};
            Status st = model->forward({&ch, 1}, &out);
            if (!st.ok()) {
                model->release_slot(slot);
                return st;
            }
            tok = static_cast<TokenId>(std::max_element(out.begin(), out.end()) - out.begin());
        }
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        model->release_slot(slot);
        r.decode_tps = secs > 0 ? (o.decode_steps + 1) / secs : 0.0;
    }
    return r;
}

// log-softmax of one row into `out`.
void log_softmax(const float* l, int64_t v, std::vector<double>& out) {
    out.resize(static_cast<size_t>(v));
    double mx = l[0];
    for (int64_t i = 1; i < v; ++i) {
        mx = std::max(mx, static_cast<double>(l[i]));
    }
    double sum = 0.0;
    for (int64_t i = 0; i < v; ++i) {
        sum += std::exp(l[i] - mx);
    }
    const double lse = mx + std::log(sum);
    for (int64_t i = 0; i < v; ++i) {
        out[i] = l[i] - lse;
    }
}

QuantEvalRow compare(const Run& base, const Run& q, const std::vector<TokenId>& ids, int64_t chunk,
                     int64_t vocab) {
    QuantEvalRow row;
    row.weight_bytes = q.weight_bytes;
    row.decode_tps = q.decode_tps;
    const size_t n = ids.size();
    std::vector<double> kls;
    kls.reserve(n);
    std::vector<double> lp, lq;
    double nll = 0.0, sq = 0.0;
    int64_t scored = 0, agree = 0;
    for (size_t i = 0; i < n; ++i) {
        const float* a = base.logits.data() + i * vocab;
        const float* b = q.logits.data() + i * vocab;
        log_softmax(a, vocab, lp);
        log_softmax(b, vocab, lq);
        double kl = 0.0;
        for (int64_t v = 0; v < vocab; ++v) {
            kl += std::exp(lp[v]) * (lp[v] - lq[v]);
            const double d = static_cast<double>(a[v]) - b[v];
            sq += d * d;
        }
        kls.push_back(std::max(0.0, kl));
        agree += (std::max_element(a, a + vocab) - a) == (std::max_element(b, b + vocab) - b);
        const bool has_next =
            (i % static_cast<size_t>(chunk)) + 1 < static_cast<size_t>(chunk) && i + 1 < n;
        if (has_next) {
            nll -= lq[static_cast<size_t>(ids[i + 1])];
            ++scored;
        }
    }
    double sum = 0.0;
    for (double k : kls) {
        sum += k;
    }
    row.mean_kl = n ? sum / static_cast<double>(n) : 0.0;
    std::sort(kls.begin(), kls.end());
    row.p99_kl = n ? kls[std::min(n - 1, static_cast<size_t>(std::ceil(0.99 * n)) - 1)] : 0.0;
    row.top1 = n ? static_cast<double>(agree) / static_cast<double>(n) : 1.0;
    row.perplexity = scored ? std::exp(nll / static_cast<double>(scored)) : 0.0;
    row.logit_rmse = n ? std::sqrt(sq / static_cast<double>(n * vocab)) : 0.0;
    row.positions = static_cast<int64_t>(n);
    row.scored = scored;
    return row;
}

// Where a prefix of a text being read may be cut without splitting what follows: after its last
// line end, else after its last other whitespace, else before its last UTF-8 character (which
// may be incomplete); 0 when none of these is past the start.
size_t prefix_cut(std::string_view text) {
    if (const size_t nl = text.rfind('\n'); nl != std::string_view::npos) {
        return nl + 1;
    }
    if (const size_t ws = text.find_last_of(" \t\r\f\v"); ws != std::string_view::npos) {
        return ws + 1;
    }
    size_t at = text.size();
    while (at > 0 && (static_cast<unsigned char>(text[at - 1]) & 0xC0) == 0x80) {
        --at;  // UTF-8 continuation bytes: back to the character's first byte.
    }
    return at > 0 ? at - 1 : 0;
}

// The first `o.tokens` tokens of the text (or the ids given). Reads the file in growing prefixes
// cut where prefix_cut says, so a large text is neither read nor tokenized past what is scored,
// one line or many; a prefix is taken once it holds a margin of tokens beyond the count, which
// the cut cannot reach. The size the file claims is not trusted (procfs says 0, a file may grow
// while read): reading ends at end of file or once a read returns nothing.
Result<EvalIds> read_ids(const QuantEvalOptions& o) {
    EvalIds out;
    if (!o.token_ids.empty()) {
        out.ids = o.token_ids;
        return out;
    }
    const std::string path = o.text_path.empty() ? o.model_dir + "/eval.txt" : o.text_path;
    // A regular file, checked before it is opened: a FIFO would block the open, a device
    // (/dev/zero) never end.
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
        return invalid_argument_error("quant-eval: " + path + ": not a regular file");
    }
    std::ifstream in(path, std::ios::binary);
    if (ec || !in) {
        return not_found_error("quant-eval: cannot read text file " + path +
                               " (give one with --text)");
    }
    // As serving and quantize load it: tokenizer.json, else Kimi K2's tiktoken.model.
    EDGE_ASSIGN_OR_RETURN(auto tok, tokenizer::load_checkpoint_tokenizer(o.model_dir));
    out.tokenizer_vocab = tok->vocab_size();
    constexpr int64_t kMargin = 64;
    std::string text;
    // About 8 bytes a token are read at first (doubled while too few), at most 1 MiB: a huge
    // --tokens on a short text allocates what the text holds, not tokens x 8 bytes.
    const auto tokens = static_cast<uint64_t>(std::min<int64_t>(o.tokens, int64_t{1} << 40));
    size_t want = static_cast<size_t>(std::min<uint64_t>(tokens * 8 + 4096, uint64_t{1} << 20));
    while (true) {
        const size_t had = text.size();
        text.resize(want);
        in.read(text.data() + had, static_cast<std::streamsize>(want - had));
        const auto got = static_cast<size_t>(in.gcount());
        text.resize(had + got);
        if (in.bad()) {
            return internal_error("quant-eval: cannot read text file " + path);
        }
        const bool whole = in.eof() || got == 0;
        const size_t cut = whole ? text.size() : prefix_cut(text);
        if (cut > 0 || whole) {
            Result<std::vector<TokenId>> ids =
                tok->encode(std::string_view(text).substr(0, cut), false);
            if (!ids.ok()) {
                return ids.status().with_context("quant-eval: " + path);
            }
            out.ids = std::move(ids).value();
            if (whole || static_cast<int64_t>(out.ids.size()) >= o.tokens + kMargin) {
                break;
            }
        }
        want = text.size() * 2 + 4096;
    }
    if (static_cast<int64_t>(out.ids.size()) > o.tokens) {
        out.ids.resize(static_cast<size_t>(o.tokens));
    }
    return out;
}

// The baseline row's label: the stored float format ("bf16", "f16", "f32", by the bytes of each),
// or "as-stored" when the checkpoint already stores quantized tensors.
Result<std::string> baseline_label(const std::string& model_dir) {
    EDGE_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::open_dir(model_dir));
    std::map<DType, int64_t> bytes;
    for (const std::string& name : ckpt->names()) {
        const TensorInfo* t = ckpt->info(name);
        // Only weights a policy could quantize tell; integer buffers (position ids) do not.
        if (t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32 &&
            quant::tensor_class_for_name(name).has_value()) {
            return std::string("as-stored");
        }
        if (t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32) {
            continue;
        }
        bytes[t->dtype] += t->end - t->begin;
    }
    const auto most = std::max_element(bytes.begin(), bytes.end(), [](auto& a, auto& b) {
        return a.second < b.second;
    });
    std::string label(most == bytes.end() ? "BF16" : dtype_name(most->first));
    std::transform(label.begin(), label.end(), label.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    return label;
}

// The whole of `v` as an integer in [lo, hi]; throws otherwise ("12abc" is not 12).
int64_t whole_number(const std::string& v, int64_t lo, int64_t hi) {
    int64_t n = 0;
    if (!parse_whole_number(v, &n) || n < lo || n > hi) {
        throw std::invalid_argument("not a whole number in range");
    }
    return n;
}

}  // namespace

Result<std::vector<QuantEvalRow>> run_quant_eval(const QuantEvalOptions& o) {
    if (o.tokens < 2 || o.chunk < 2 || o.tokens > (int64_t{1} << 30)) {
        return invalid_argument_error(
            "quant-eval: --tokens must be in 2..2^30 and --chunk at least 2");
    }
    std::vector<std::pair<std::string, std::string>> runs;  // label, policy
    std::set<WeightFormat> formats;
    for (const std::string& p : o.policies) {
        EDGE_ASSIGN_OR_RETURN(quant::QuantPolicy qp, quant::parse_quant_policy(p));
        runs.emplace_back(p, qp.to_string());
        for (WeightFormat f : qp.formats) {
            if (f != WeightFormat::kBF16) {
                formats.insert(f);
            }
        }
    }
    if (o.per_class) {
        EDGE_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::open_dir(o.model_dir));
        std::set<quant::TensorClass> present;
        for (const std::string& name : ckpt->names()) {
            if (auto c = quant::tensor_class_for_name(name)) {
                present.insert(*c);
            }
        }
        for (WeightFormat f : formats) {
            for (quant::TensorClass c : present) {
                quant::QuantPolicy qp;
                qp.set(c, f);
                const std::string label =
                    std::string(quant::tensor_class_name(c)) + "=" + quant::policy_format_name(f);
                runs.emplace_back(label, qp.to_string());
            }
        }
    }
    EDGE_ASSIGN_OR_RETURN(EvalIds text, read_ids(o));
    std::vector<TokenId>& ids = text.ids;
    if (static_cast<int64_t>(ids.size()) > o.tokens) {
        ids.resize(static_cast<size_t>(o.tokens));
    }
    if (ids.size() < 2) {
        return invalid_argument_error("quant-eval: the text has fewer than 2 tokens");
    }
    int64_t vocab = 0;
    EDGE_ASSIGN_OR_RETURN(Run base, run_model(o, "none", text, &vocab));
    std::vector<QuantEvalRow> rows;
    rows.push_back(compare(base, base, ids, o.chunk, vocab));
    EDGE_ASSIGN_OR_RETURN(rows.back().label, baseline_label(o.model_dir));
    rows.back().policy = "none";
    const double base_ppl = rows.back().perplexity;
    if (!std::isfinite(base_ppl)) {
        return invalid_argument_error(
            "quant-eval: " + o.model_dir +
            ": the unquantized model gives NaN or Inf logits on this text (NaN or Inf in the "
            "checkpoint's weights?); nothing to compare against");
    }
    for (size_t k = 0; k < runs.size(); ++k) {
        const auto& [label, policy] = runs[k];
        const bool asked = k < o.policies.size();  // Not one of the per-class runs.
        int64_t v = 0;
        auto r = run_model(o, policy, text, &v);
        if (!r.ok()) {
            return Status(r.status().code(),
                          "quant-eval: policy '" + label + "': " + r.status().message());
        }
        QuantEvalRow row = compare(base, *r, ids, o.chunk, vocab);
        if (row.weight_bytes == base.weight_bytes && r->logits == base.logits) {
            // Nothing of this model was quantized: its classes are absent, or the checkpoint
            // stores them quantized already (a policy applies to float tensors only).
            if (asked) {
                return invalid_argument_error(
                    "quant-eval: policy '" + label + "' changes no tensor of " + o.model_dir +
                    " (the classes it names are absent, or stored quantized already)");
            }
            continue;
        }
        if (!std::isfinite(row.perplexity) || !std::isfinite(row.logit_rmse)) {
            return invalid_argument_error("quant-eval: policy '" + label +
                                          "' gives NaN or Inf logits on this text");
        }
        row.label = label;
        row.policy = policy;
        row.ppl_ratio = base_ppl > 0 ? row.perplexity / base_ppl : 0.0;
        rows.push_back(std::move(row));
    }
    return rows;
}

std::string quant_eval_table(const std::vector<QuantEvalRow>& rows) {
    std::string s;
    char line[512];
    std::snprintf(line, sizeof line, "%-28s %12s %10s %10s %7s %9s %8s %10s %9s\n", "policy",
                  "weight_MiB", "mean_KL", "p99_KL", "top1", "ppl", "ppl_x", "logit_rmse",
                  "decode/s");
    s += line;
    for (const QuantEvalRow& r : rows) {
        std::snprintf(line, sizeof line,
                      "%-28s %12.3f %10.6f %10.6f %7.4f %9.4f %8.4f %10.6f %9.1f\n",
                      r.label.c_str(), static_cast<double>(r.weight_bytes) / (1 << 20), r.mean_kl,
                      r.p99_kl, r.top1, r.perplexity, r.ppl_ratio, r.logit_rmse, r.decode_tps);
        s += line;
    }
    if (!rows.empty()) {
        s += "(" + std::to_string(rows[0].positions) + " positions compared, " +
             std::to_string(rows[0].scored) + " next tokens scored for the perplexity)\n";
    }
    return s;
}

std::string quant_eval_json(const std::vector<QuantEvalRow>& rows) {
    // Non-finite numbers have no JSON form: null.
    auto number = [](double x) { return std::isfinite(x) ? json::value(x) : json::value(nullptr); };
    json::array out;
    for (const QuantEvalRow& r : rows) {
        json::object o;
        o["label"] = r.label;
        o["policy"] = r.policy;
        o["weight_bytes"] = r.weight_bytes;
        o["mean_kl"] = number(r.mean_kl);
        o["p99_kl"] = number(r.p99_kl);
        o["top1"] = number(r.top1);
        o["perplexity"] = number(r.perplexity);
        o["ppl_ratio"] = number(r.ppl_ratio);
        o["logit_rmse"] = number(r.logit_rmse);
        o["decode_tps"] = number(r.decode_tps);
        o["positions"] = r.positions;
        o["scored_tokens"] = r.scored;
        out.push_back(std::move(o));
    }
    json::object root;
    root["rows"] = std::move(out);
    return json_text(root);
}

int quant_eval_main(int argc, char** argv) {
    int i = argc > 1 && std::string_view(argv[1]) == "quant-eval" ? 2 : 1;
    const char* usage =
        "usage: edgeserve quant-eval --model DIR --policies P1,P2,... [--text FILE] "
        "[--tokens N] [--chunk N] [--threads N] [--no-per-class]\n";
    QuantEvalOptions o;
    if (wants_help(argc, argv, i)) {
        std::fputs(usage, stdout);
        return 0;
    }
    auto wrong = [usage](const std::string& what) {
        return usage_error("quant-eval", what, usage);
    };
    SeenFlags seen;
    for (; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (std::string twice = seen.repeated(a); !twice.empty()) {
            // A second --policies is not appended to the first: every policy goes in one list.
            if (a == "--policies") {
                twice += " (list every policy in one, separated by ',')";
            }
            return wrong(twice);
        }
        if (a == "--no-per-class") {
            o.per_class = false;
            continue;
        }
        if (a != "--model" && a != "--policies" && a != "--text" && a != "--tokens" &&
            a != "--chunk" && a != "--threads") {
            return wrong("unknown argument '" + std::string(a) + "'");
        }
        if (i + 1 >= argc) {
            return wrong("missing the value of " + std::string(a));
        }
        const std::string v = argv[++i];
        try {
            if (a == "--model") {
                o.model_dir = v;
            } else if (a == "--policies") {
                // Empty items are mistakes (a policy string refuses its empty items too), not
                // something to skip.
                std::string cur;
                for (char ch : v + ",") {
                    if (ch != ',') {
                        cur += ch == '+' ? ',' : ch;
                        continue;
                    }
                    if (cur.empty()) {
                        return wrong("--policies '" + v + "': item " +
                                     std::to_string(o.policies.size() + 1) + " is empty");
                    }
                    // Checked now: a policy that does not parse is a usage error, found before
                    // the model loads.
                    if (Result<quant::QuantPolicy> p = quant::parse_quant_policy(cur); !p.ok()) {
                        return wrong("--policies: " + p.status().message());
                    }
                    o.policies.push_back(cur);
                    cur.clear();
                }
            } else if (a == "--text") {
                o.text_path = v;
            } else if (a == "--tokens") {
                o.tokens = whole_number(v, 2, int64_t{1} << 30);
            } else if (a == "--chunk") {
                o.chunk = whole_number(v, 2, int64_t{1} << 20);
            } else {
                o.threads = static_cast<int32_t>(whole_number(v, 0, cpu::kMaxPoolThreads));
            }
        } catch (...) {
            return wrong("bad value '" + v + "' for " + std::string(a));
        }
    }
    if (o.model_dir.empty() || o.policies.empty()) {
        return wrong(std::string("missing ") +
                     (o.model_dir.empty() ? "--model" : "--policies (at least one policy)"));
    }
    auto rows = run_quant_eval(o);
    if (!rows.ok()) {
        std::fprintf(stderr, "edgeserve quant-eval: %s\n", rows.status().to_string().c_str());
        return 1;
    }
    std::fputs(quant_eval_table(*rows).c_str(), stdout);
    std::printf("%s\n", quant_eval_json(*rows).c_str());
    return 0;
}

}  // namespace edge::engine
