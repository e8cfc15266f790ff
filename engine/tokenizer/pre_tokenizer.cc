#include "engine/tokenizer/pre_tokenizer.h"

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

Status PreTokenizer::split(std::string_view text, std::vector<std::string_view>* pieces) const {
    pieces->clear();
    if (text.empty()) {
        return ok_status();
    }
    pieces->push_back(text);
    std::vector<std::string_view> next;
    for (const auto& re : regexes_) {
        next.clear();
        for (std::string_view piece : *pieces) {
            EDGE_RETURN_IF_ERROR(split_one(*re, piece, &next));
        }
        pieces->swap(next);
    }
    return ok_status();
}

Status PreTokenizer::split_one(const Compiled& re, std::string_view text,
                               std::vector<std::string_view>* out) const {
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
        pcre2_match_data_create_from_pattern(re.code, nullptr));
    if (!match) {
        return resource_exhausted_error("pre-tokenizer: cannot allocate PCRE2 match data");
    }
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t emitted = 0;  // Text before this offset is already in `out`.
    size_t start = 0;
    while (start < text.size()) {
        // The text was validated as UTF-8 by the caller; skip PCRE2's own check after the first
        // call (it is O(n) per call).
        const uint32_t options = start == 0 ? 0 : PCRE2_NO_UTF_CHECK;
        int rc = re.jit ? pcre2_jit_match(re.code, subject, text.size(), start, options,
                                          match.get(), nullptr)
                        : PCRE2_ERROR_JIT_STACKLIMIT;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
            // The JIT's machine stack (32 KiB) holds a frame per repetition of a group, so a
            // long run of letters under Kimi K2's pattern (its letter classes are groups with a
            // look-ahead) exhausts it at ~10k characters. The interpreter keeps its frames on
            // the heap and matches the same text.
            rc = pcre2_match(re.code, subject, text.size(), start, options | PCRE2_NO_JIT,
                             match.get(), nullptr);
        }
        if (rc == PCRE2_ERROR_NOMATCH) {
            break;
        }
        if (rc < 0) {
            return invalid_argument_error("pre-tokenizer regex failed at byte " +
                                          std::to_string(start) + ": " + pcre2_error_message(rc));
        }
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
        const size_t m_begin = ovector[0];
        const size_t m_end = ovector[1];
        if (m_end == m_begin) {
            // An empty match splits nothing; move on by one character.
            const int n = utf8_sequence_length(static_cast<uint8_t>(text[start]));
            start += n > 0 ? static_cast<size_t>(n) : 1;
            continue;
        }
        if (m_begin > emitted) {
            out->push_back(text.substr(emitted, m_begin - emitted));
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
