// libFuzzer: the bytes a client sends on one keep-alive connection after the TLS handshake, framed
// as the HTTP session frames them (tls/http_session.cc's read_request, through the same functions
// of tls/http_framing.h): empty lines skipped, as many pipelined requests as the bytes hold, each
// fed to Beast's parser with the session's bounds (header, chunk-size line, trailer, body) and
// its checks (version, Host, method, target form, Transfer-Encoding), up to the first request the
// server answers itself (400, 413, 414, 431, 501, 505), one without keep-alive, or the end.
//
// Input: byte 0 picks the bounds (max_header_bytes, max_body_bytes: the defaults, or small ones
// that the seeds reach); byte 1 % 16 is the number N of bytes after it that are read sizes (the
// most each read returns, cycled; 0: all that the session asks for); the rest is the stream.
// The stream is framed with those read sizes, with reads as large as the session asks, (when
// short) a byte at a time, and its prefix cut where the first read size says: each must give the
// same requests and the same end (but for a chunked body cut short: see in_chunked_body), and
// bytes after a refused request change nothing. Each accepted request is checked (bounds, framing
// fields, Host). An invariant broken aborts (the input is then a finding).

#include <algorithm>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tls/http_framing.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using edge::tls::FramingError;
using edge::tls::RequestParser;
using edge::tls::RequestReadPhase;

[[noreturn]] void violated(const char* what) {
    std::fprintf(stderr, "http_session_fuzz: invariant violated: %s\n", what);
    std::abort();
}

#define CHECK_INVARIANT(cond) \
    do {                      \
        if (!(cond)) {        \
            violated(#cond);  \
        }                     \
    } while (0)

// The client's bytes as the session's reads see them: each read returns at most what was asked
// and, with read sizes, at most the next of them; 0 at the end (the client's close).
class Stream {
  public:
    Stream(std::string_view bytes, std::span<const uint8_t> sizes) : bytes_(bytes), sizes_(sizes) {}

    size_t read(beast::flat_buffer& buffer, size_t asked) {
        size_t n = std::min(asked, bytes_.size() - at_);
        if (!sizes_.empty()) {
            const size_t size = sizes_[next_++ % sizes_.size()];
            if (size != 0) {
                n = std::min(n, size);
            }
        }
        auto room = buffer.prepare(asked);
        std::memcpy(room.data(), bytes_.data() + at_, n);
        buffer.commit(n);
        at_ += n;
        return n;
    }

    size_t position() const { return at_; }

  private:
    std::string_view bytes_;
    std::span<const uint8_t> sizes_;
    size_t at_ = 0;
    size_t next_ = 0;
};

std::string_view buffered(const beast::flat_buffer& buffer) {
    return {static_cast<const char*>(buffer.data().data()), buffer.size()};
}

// A request the session hands to its handler.
struct Accepted {
    std::string method;
    std::string target;
    unsigned version = 0;
    std::vector<std::pair<std::string, std::string>> fields;  // The header's (not the trailer's).
    std::string body;
    bool keep_alive = false;
    bool operator==(const Accepted&) const = default;
};

struct Framing {
    enum class End {
        kIdleClose,     // The client closed between requests.
        kPartialClose,  // The client closed mid-request: no answer (or a 408 on a timeout).
        kAnswered,      // The server answered an error itself and closes.
        kNoKeepAlive,   // The last request ends the connection.
    };
    std::vector<Accepted> accepted;
    End end = End::kIdleClose;
    int status = 0;  // kAnswered's.
    std::string message;
    // The end came while the body of a chunked request was read. After a chunk line Beast
    // asked more for, the session gives it the next bytes only once 5 are there (Beast's final
    // chunk asserts on fewer): a malformed line whose last bytes are fewer than that, at the
    // stream's end, gets no answer where whole it gets a 400. The requests framed before it are
    // the same whatever the answer.
    bool in_chunked_body = false;
};

// The same framing, but for the answer to a chunked body cut short (in_chunked_body).
bool same_framing(const Framing& a, const Framing& b) {
    if (a.accepted != b.accepted) {
        return false;
    }
    if (a.in_chunked_body && b.in_chunked_body) {
        return true;
    }
    return a.end == b.end && a.status == b.status && a.message == b.message &&
           a.in_chunked_body == b.in_chunked_body;
}

// One phase of a request's read as HttpSession::parse_request runs it, the reads from `stream`.
boost::system::error_code read_phase(RequestParser& parser, beast::flat_buffer& buffer,
                                     Stream& stream, size_t max_header_bytes, bool header_only) {
    RequestReadPhase phase(max_header_bytes, header_only);
    for (;;) {
        const RequestReadPhase::Step step = phase.advance(parser, buffer);
        if (step.ec || step.finished) {
            CHECK_INVARIANT(!(step.ec && step.finished));
            return step.ec;
        }
        CHECK_INVARIANT(step.read_size > 0);
        if (stream.read(buffer, step.read_size) == 0) {
            return RequestReadPhase::at_eof(parser);
        }
    }
}

// What must hold of any request the session accepts, whatever the bytes were.
// `head`: the request's header as the session checked it and hands it to the handler, before the
// parser added the trailer's fields to the same list.
void check_accepted(const RequestParser& parser, const http::request_header<>& head,
                    const Accepted& request, size_t header_bytes, size_t max_header_bytes,
                    size_t max_body_bytes) {
    CHECK_INVARIANT(parser.is_done());
    CHECK_INVARIANT(request.version == 10 || request.version == 11);
    CHECK_INVARIANT(head.method() != http::verb::unknown && head.method() != http::verb::connect);
    CHECK_INVARIANT(!request.target.empty());
    CHECK_INVARIANT(request.target != "*" || request.method == "OPTIONS");
    CHECK_INVARIANT(request.version != 11 || head.count(http::field::host) == 1);
    // The header is held to its bound, the body to its own.
    CHECK_INVARIANT(header_bytes <= max_header_bytes);
    CHECK_INVARIANT(request.body.size() <= max_body_bytes);
    // Request smuggling (RFC 9112 section 6.3): never both framings, chunked only on HTTP/1.1,
    // and a Content-Length body is exactly that long.
    const bool chunked = parser.chunked();
    const bool has_te = head.find(http::field::transfer_encoding) != head.end();
    const bool has_cl = head.find(http::field::content_length) != head.end();
    CHECK_INVARIANT(!(has_te && has_cl));
    CHECK_INVARIANT(has_te == chunked);
    CHECK_INVARIANT(!chunked || request.version == 11);
    if (has_cl) {
        // Each Content-Length field, a comma-separated list (RFC 9110 section 8.6), says the
        // body's length.
        const auto [first, last] = head.equal_range(http::field::content_length);
        for (auto field = first; field != last; ++field) {
            std::string_view value = field->value();
            while (!value.empty()) {
                const size_t comma = value.find(',');
                std::string_view item = value.substr(0, comma);
                value = comma == std::string_view::npos ? std::string_view()
                                                        : value.substr(comma + 1);
                while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) {
                    item.remove_prefix(1);
                }
                while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) {
                    item.remove_suffix(1);
                }
                uint64_t length = 0;
                const auto [end, ec] =
                    std::from_chars(item.data(), item.data() + item.size(), length);
                CHECK_INVARIANT(ec == std::errc() && end == item.data() + item.size());
                CHECK_INVARIANT(request.body.size() == length);
            }
        }
    } else if (!chunked) {
        CHECK_INVARIANT(request.body.empty());  // No framing: no body (RFC 9112 section 6.3).
    }
}

// The session's read_request, request after request, over the whole stream.
Framing frame(std::string_view bytes, std::span<const uint8_t> sizes, size_t max_header_bytes,
              size_t max_body_bytes) {
    Framing out;
    Stream stream(bytes, sizes);
    beast::flat_buffer buffer;
    int empty_lines = 0;
    for (;;) {
        buffer.consume(edge::tls::empty_lines_prefix(buffered(buffer), empty_lines));
        while (edge::tls::awaiting_request(buffered(buffer), empty_lines)) {
            if (stream.read(buffer, 4096) == 0) {
                out.end = Framing::End::kIdleClose;
                return out;
            }
            buffer.consume(edge::tls::empty_lines_prefix(buffered(buffer), empty_lines));
        }
        empty_lines = 0;
        const size_t header_start = stream.position() - buffer.size();

        RequestParser parser;
        edge::tls::set_request_limits(parser, max_header_bytes, max_body_bytes);
        const boost::system::error_code ec =
            read_phase(parser, buffer, stream, max_header_bytes, true);
        const size_t header_bytes = stream.position() - buffer.size() - header_start;
        FramingError answer =
            edge::tls::header_phase_error(ec, parser, buffered(buffer), max_header_bytes);
        if (answer.status == 0 && ec) {
            CHECK_INVARIANT(stream.position() == bytes.size());  // Only the end stops it.
            out.end = Framing::End::kPartialClose;
            return out;
        }
        if (answer.status == 0) {
            answer = edge::tls::check_request_head(parser.get());
        }
        // The header as the session checked it (its handler gets these fields, not the trailer's).
        const http::request_header<> head = parser.get();
        // As HttpSession::read_request() takes it: the header's, never a trailer's.
        const bool keep_alive = parser.get().keep_alive();
        if (answer.status == 0 && !parser.is_done()) {
            const boost::system::error_code bec =
                read_phase(parser, buffer, stream, max_header_bytes, false);
            answer = edge::tls::body_phase_error(bec, parser.get());
            out.in_chunked_body = bec && parser.chunked();
            if (answer.status == 0 && bec) {
                CHECK_INVARIANT(stream.position() == bytes.size());
                out.end = Framing::End::kPartialClose;
                return out;
            }
        }
        if (answer.status != 0) {
            static constexpr int kAnswers[] = {400, 413, 414, 431, 501, 505};
            CHECK_INVARIANT(std::find(std::begin(kAnswers), std::end(kAnswers), answer.status) !=
                            std::end(kAnswers));
            CHECK_INVARIANT(!answer.message.empty());
            out.end = Framing::End::kAnswered;
            out.status = answer.status;
            out.message = std::string(answer.message);
            return out;
        }
        Accepted request;
        request.method = std::string(head.method_string());
        request.target = std::string(head.target());
        request.version = head.version();
        for (const auto& field : head) {
            request.fields.emplace_back(std::string(field.name_string()),
                                        std::string(field.value()));
        }
        request.body = parser.get().body();
        request.keep_alive = keep_alive;
        check_accepted(parser, head, request, header_bytes, max_header_bytes, max_body_bytes);
        out.accepted.push_back(std::move(request));
        if (!out.accepted.back().keep_alive) {
            out.end = Framing::End::kNoKeepAlive;
            return out;
        }
    }
}

// Two framings of the same bytes that must be equal; printed when they are not.
void check_same(const Framing& a, const Framing& b, const char* what) {
    if (same_framing(a, b)) {
        return;
    }
    for (const Framing* f : {&a, &b}) {
        std::fprintf(stderr, "http_session_fuzz: %zu accepted, end %d, answer %d %s\n",
                     f->accepted.size(), static_cast<int>(f->end), f->status,
                     f->message.c_str());
    }
    violated(what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) {
        return 0;
    }
    // The session's defaults, and bounds small enough for the fuzzer's inputs to pass.
    static constexpr size_t kHeaderLimits[] = {16 * 1024, 64, 256, 1024};
    static constexpr size_t kBodyLimits[] = {4 * 1024 * 1024, 0, 16, 1000};
    const size_t max_header_bytes = kHeaderLimits[data[0] & 3];
    const size_t max_body_bytes = kBodyLimits[(data[0] >> 2) & 3];
    const size_t split_count = std::min<size_t>(data[1] % 16, size - 2);
    const std::span<const uint8_t> sizes(data + 2, split_count);
    const std::string_view bytes(reinterpret_cast<const char*>(data + 2 + split_count),
                                 size - 2 - split_count);

    const Framing chosen = frame(bytes, sizes, max_header_bytes, max_body_bytes);
    const Framing whole = frame(bytes, {}, max_header_bytes, max_body_bytes);
    check_same(chosen, whole, "the input's read sizes frame as reads of all that is asked");
    // Framing stops at the first request it refuses or that closes the connection: bytes after
    // the point where a prefix of the stream ends so change nothing; and a prefix never frames
    // requests other than the whole stream's first ones.
    const size_t cut = split_count == 0 ? bytes.size() / 2 : bytes.size() * sizes[0] / 255;
    const Framing prefix = frame(bytes.substr(0, cut), sizes, max_header_bytes, max_body_bytes);
    CHECK_INVARIANT(prefix.accepted.size() <= whole.accepted.size());
    CHECK_INVARIANT(std::equal(prefix.accepted.begin(), prefix.accepted.end(),
                               whole.accepted.begin()));
    if (prefix.end == Framing::End::kAnswered || prefix.end == Framing::End::kNoKeepAlive) {
        check_same(prefix, whole, "bytes after the first refused request change nothing");
    }
    if (bytes.size() <= 4096) {
        static constexpr uint8_t kOne[] = {1};
        const Framing bytewise = frame(bytes, kOne, max_header_bytes, max_body_bytes);
        check_same(bytewise, whole, "reads of a byte frame as reads of all that is asked");
    }
    return 0;
}
