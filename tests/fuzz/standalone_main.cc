// A driver for the libFuzzer targets in builds without libFuzzer (g++, the CI build under
// AddressSanitizer and UBSan): it runs every seed of a corpus directory through
// LLVMFuzzerTestOneInput, then mutates seeds at random (bit and byte flips, inserts, deletes,
// duplicated and spliced ranges, interesting integers) for a bounded time. It has no coverage
// feedback, so it finds less than libFuzzer per second; deploy/sanitize runs the coverage-guided
// build. A crash, a sanitizer report or an abort (a target's invariant) ends the process; the
// input is written first so the finding can be replayed with `<target> FILE`.
//
// Usage: <target> [--seconds N] [--runs N] [--seed N] [--max-len N] (CORPUS_DIR | FILE)...

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

// The input being run, saved by the crash handler.
const Bytes* g_current = nullptr;

void save_current() {
    if (g_current == nullptr) {
        return;
    }
    if (FILE* f = std::fopen("fuzz-crash-input", "wb")) {
        std::fwrite(g_current->data(), 1, g_current->size(), f);
        std::fclose(f);
        std::fprintf(stderr, "fuzz: input of %zu bytes saved to ./fuzz-crash-input\n",
                     g_current->size());
    }
}

// A target's own check that aborts (an invariant broken) is a finding too: saved the same way.
extern "C" void on_abort(int) {
    save_current();
    std::signal(SIGABRT, SIG_DFL);
    std::raise(SIGABRT);
}

// Sanitizers call this before they abort.
extern "C" void __sanitizer_set_death_callback(void (*callback)());
extern "C" __attribute__((weak)) void __sanitizer_set_death_callback(void (*)()) {}

bool read_file(const std::filesystem::path& path, Bytes* out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        return false;
    }
    out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return true;
}

void run_one(const Bytes& input) {
    g_current = &input;
    // An empty vector's data() may be null; libFuzzer never passes null.
    static const uint8_t kEmpty = 0;
    LLVMFuzzerTestOneInput(input.empty() ? &kEmpty : input.data(), input.size());
    g_current = nullptr;
}

class Mutator {
public:
    Mutator(uint64_t seed, size_t max_len) : rng_(seed), max_len_(max_len) {}

    Bytes mutate(const std::vector<Bytes>& corpus) {
        Bytes out = corpus[pick(corpus.size())];
        const int rounds = 1 + static_cast<int>(pick(4));
        for (int i = 0; i < rounds; ++i) {
            apply(out, corpus);
        }
        if (out.size() > max_len_) {
            out.resize(max_len_);
        }
        return out;
    }

private:
    size_t pick(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

    void apply(Bytes& b, const std::vector<Bytes>& corpus) {
        static constexpr uint64_t kInteresting[] = {0,    1,    0x7f,       0x80,       0xff,
                                                    0x100, 0x7fff, 0x8000, 0xffff, 0x7fffffff,
                                                    0x80000000, 0xffffffff, ~0ull};
        switch (pick(8)) {
            case 0:  // Flip one bit.
                if (!b.empty()) b[pick(b.size())] ^= static_cast<uint8_t>(1u << pick(8));
                break;
            case 1:  // Random byte.
                if (!b.empty()) b[pick(b.size())] = static_cast<uint8_t>(rng_());
                break;
            case 2: {  // Insert random bytes.
                const size_t at = pick(b.size() + 1);
                const size_t n = 1 + pick(8);
                for (size_t i = 0; i < n; ++i) {
                    b.insert(b.begin() + static_cast<std::ptrdiff_t>(at),
                             static_cast<uint8_t>(rng_()));
                }
                break;
            }
            case 3: {  // Delete a range.
                if (b.empty()) break;
                const size_t at = pick(b.size());
                const size_t n = 1 + pick(std::min<size_t>(16, b.size() - at));
                b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
                        b.begin() + static_cast<std::ptrdiff_t>(at + n));
                break;
            }
            case 4: {  // Duplicate a range in place.
                if (b.empty()) break;
                const size_t at = pick(b.size());
                const size_t n = 1 + pick(std::min<size_t>(64, b.size() - at));
                Bytes chunk(b.begin() + static_cast<std::ptrdiff_t>(at),
                            b.begin() + static_cast<std::ptrdiff_t>(at + n));
                b.insert(b.begin() + static_cast<std::ptrdiff_t>(pick(b.size() + 1)),
                         chunk.begin(), chunk.end());
                break;
            }
            case 5: {  // Splice the tail of another seed.
                const Bytes& other = corpus[pick(corpus.size())];
                if (other.empty()) break;
                const size_t cut = pick(b.size() + 1);
                const size_t from = pick(other.size());
                b.resize(cut);
                b.insert(b.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
                break;
            }
            case 6: {  // Overwrite with an interesting integer, little or big endian.
                if (b.empty()) break;
                const uint64_t v = kInteresting[pick(std::size(kInteresting))];
                const size_t width = size_t{1} << pick(4);
                const size_t at = pick(b.size());
                const bool big = pick(2) == 1;
                for (size_t i = 0; i < width && at + i < b.size(); ++i) {
                    const size_t shift = 8 * (big ? width - 1 - i : i);
                    b[at + i] = static_cast<uint8_t>(shift < 64 ? v >> shift : 0);
                }
                break;
            }
            default:  // Truncate.
                b.resize(pick(b.size() + 1));
                break;
        }
    }

    std::mt19937_64 rng_;
    size_t max_len_;
};

int usage() {
    std::fprintf(stderr,
                 "usage: fuzz-target [--seconds N] [--runs N] [--seed N] [--max-len N] "
                 "(CORPUS_DIR | FILE)...\n");
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    double seconds = 10.0;
    uint64_t max_runs = UINT64_MAX;
    uint64_t seed = 1;
    size_t max_len = 1 << 16;
    std::vector<std::filesystem::path> inputs;
    for (int i = 1; i < argc; ++i) {
        auto value = [&](const char* flag) -> const char* {
            if (std::strcmp(argv[i], flag) != 0 || i + 1 >= argc) return nullptr;
            return argv[++i];
        };
        if (const char* v = value("--seconds")) {
            seconds = std::atof(v);
        } else if (const char* v = value("--runs")) {
            max_runs = std::strtoull(v, nullptr, 10);
        } else if (const char* v = value("--seed")) {
            seed = std::strtoull(v, nullptr, 10);
        } else if (const char* v = value("--max-len")) {
            max_len = std::strtoull(v, nullptr, 10);
        } else if (argv[i][0] == '-') {
            return usage();
        } else {
            inputs.emplace_back(argv[i]);
        }
    }
    __sanitizer_set_death_callback(save_current);
    std::signal(SIGABRT, on_abort);

    std::vector<Bytes> corpus;
    for (const auto& path : inputs) {
        std::error_code ec;
        if (std::filesystem::is_directory(path, ec)) {
            for (const auto& entry : std::filesystem::directory_iterator(path)) {
                Bytes b;
                if (entry.is_regular_file() && read_file(entry.path(), &b)) {
                    corpus.push_back(std::move(b));
                }
            }
        } else {
            Bytes b;
            if (!read_file(path, &b)) {
                std::fprintf(stderr, "fuzz: cannot read %s\n", path.c_str());
                return 2;
            }
            corpus.push_back(std::move(b));
        }
    }
    if (corpus.empty()) {
        corpus.emplace_back();
    }
    for (const Bytes& b : corpus) {
        run_one(b);
    }

    Mutator mutator(seed, max_len);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    uint64_t runs = 0;
    while (runs < max_runs && std::chrono::steady_clock::now() < deadline) {
        // Check the clock every 64 runs; one input never takes long.
        for (int i = 0; i < 64 && runs < max_runs; ++i, ++runs) {
            Bytes input = mutator.mutate(corpus);
            run_one(input);
        }
    }
    std::printf("fuzz: %zu seeds and %llu mutated inputs ran clean (seed %llu)\n", corpus.size(),
                static_cast<unsigned long long>(runs), static_cast<unsigned long long>(seed));
    return 0;
}
