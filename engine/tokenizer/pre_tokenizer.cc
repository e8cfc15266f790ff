#include "engine/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <cstdint>

#include "engine/tokenizer/pcre2_error.h"
#include "engine/tokenizer/utf8.h"

namespace edge::engine::tokenizer {

struct PreTokenizer::Compiled {
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Compiled() {
        if (code != nullptr) {
            pcre2_code_free(code);
        }
    }
};

namespace {

struct MatchDataDeleter {
    void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

struct MatchContextDeleter {
    void operator()(pcre2_match_context* c) const { pcre2_match_context_free(c); }
};

// PCRE2's match limit (default 10 million) counts backtracking steps per match call, and a
// repeat that gives characters back counts one per character: `\s*[\r\n]+` backtracks over a
// whole run of spaces before failing, so a fixed limit failed every pattern on ~10 MB of spaces.
// The limit grows with the text still to match instead; each of the supported patterns
// backtracks at most about once per character of the run it is in.
constexpr uint64_t kMatchLimitBase = 10'000'000;
constexpr uint64_t kMatchStepsPerByte = 4;
// The interpreter keeps its backtracking frames on the heap; none of the supported patterns needs
// more than a few KiB, so this only bounds what a pathological tokenizer.json regex can take.
constexpr uint32_t kHeapLimitKiB = 64 * 1024;

uint32_t match_limit_for(size_t remaining_bytes) {
    const uint64_t limit = kMatchLimitBase + kMatchStepsPerByte * remaining_bytes;
    return static_cast<uint32_t>(std::min<uint64_t>(limit, UINT32_MAX));
}

}  // namespace

const char* PreTokenizer::gpt2_pattern() {
    return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
}

PreTokenizer::~PreTokenizer() = default;

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::create(
    const std::vector<std::string>& patterns) {
    std::unique_ptr<PreTokenizer> pt(new PreTokenizer());
    for (size_t i = 0; i < patterns.size(); ++i) {
        int error_code = 0;
        PCRE2_SIZE error_offset = 0;
        auto compiled = std::make_unique<Compiled>();
        compiled->code =
            pcre2_compile(reinterpret_cast<PCRE2_SPTR>(patterns[i].data()), patterns[i].size(),
                          PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
        if (compiled->code == nullptr) {
            return invalid_argument_error(
                "pre-tokenizer regex " + std::to_string(i) + " does not compile at offset " +
                std::to_string(error_offset) + ": " + pcre2_error_message(error_code));
        }
        // JIT is an optimisation only; fall back to the interpreter when it is unavailable.
        compiled->jit = pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE) == 0;
        pt->regexes_.push_back(std::move(compiled));
    }
    return pt;
}

Status PreTokenizer::split(std::string_view text, std::vector<std::string_view>* pieces,
                           size_t* searches) const {
    size_t unused = 0;
    searches = searches != nullptr ? searches : &unused;
    *searches = 0;
    pieces->clear();
    if (text.empty()) {
        return ok_status();
    }
    pieces->push_back(text);
    std::vector<std::string_view> next;
    for (const auto& re : regexes_) {
        next.clear();
        for (std::string_view piece : *pieces) {
            EDGE_RETURN_IF_ERROR(split_one(*re, piece, &next, searches));
        }
        pieces->swap(next);
    }
    return ok_status();
}

Status PreTokenizer::split_one(const Compiled& re, std::string_view text,
                               std::vector<std::string_view>* out, size_t* searches) const {
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
        pcre2_match_data_create_from_pattern(re.code, nullptr));
    std::unique_ptr<pcre2_match_context, MatchContextDeleter> context(
        pcre2_match_context_create(nullptr));
    if (!match || !context) {
        return resource_exhausted_error("pre-tokenizer: cannot allocate PCRE2 match data");
    }
    pcre2_set_heap_limit(context.get(), kHeapLimitKiB);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t emitted = 0;  // Text before this offset is already in `out`.
    size_t start = 0;
    while (start < text.size()) {
        // The text was validated as UTF-8 by the caller; skip PCRE2's own check after the first
        // call (it is O(n) per call).
        const uint32_t options = start == 0 ? 0 : PCRE2_NO_UTF_CHECK;
        const uint32_t limit = match_limit_for(text.size() - start);
        pcre2_set_match_limit(context.get(), limit);
        pcre2_set_depth_limit(context.get(), limit);
        ++*searches;
        int rc = re.jit ? pcre2_jit_match(re.code, subject, text.size(), start, options,
                                          match.get(), context.get())
                        : PCRE2_ERROR_JIT_STACKLIMIT;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
            // The JIT's machine stack (32 KiB) holds a frame per repetition of a group, so a
            // pattern that repeats a group (none of the supported ones does) exhausts it on a
            // long run. The interpreter keeps its frames on the heap and matches the same text.
            rc = pcre2_match(re.code, subject, text.size(), start, options | PCRE2_NO_JIT,
                             match.get(), context.get());
        }
        if (rc == PCRE2_ERROR_NOMATCH) {
            break;
        }
        if (rc < 0) {
            return invalid_argument_error(
                "pre-tokenizer regex failed at byte " + std::to_string(start) + " of a " +
                std::to_string(text.size()) + "-byte piece: " + pcre2_error_message(rc));
        }
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
        const size_t m_begin = ovector[0];
        const size_t m_end = ovector[1];
        if (m_begin > emitted) {
            out->push_back(text.substr(emitted, m_begin - emitted));
            emitted = m_begin;
        }
        if (m_end == m_begin) {
            // An empty match (a look-ahead such as `(?=[A-Z])`) splits at its position, as
            // Hugging Face's does; the next search starts one character past it, not past
            // `start`: searching again from each character before it would find the same match,
            // O(n^2) on a long run without one.
            if (m_begin >= text.size()) {
                break;
            }
            const int n = utf8_sequence_length(static_cast<uint8_t>(text[m_begin]));
            start = m_begin + (n > 0 ? static_cast<size_t>(n) : 1);
            continue;
        }
        out->push_back(text.substr(m_begin, m_end - m_begin));
        emitted = m_end;
        start = m_end;
    }
    if (emitted < text.size()) {
        out->push_back(text.substr(emitted));
    }
    return ok_status();
}

}  // namespace edge::engine::tokenizer
