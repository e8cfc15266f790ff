#include "common/json_text.h"

#include <algorithm>
#include <boost/json.hpp>
#include <boost/json/basic_parser_impl.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace edge {
namespace {

void append_string(std::string_view s, std::string* out) {
    static constexpr char kHex[] = "0123456789abcdef";
    out->push_back('"');
    for (const char c : s) {
        const auto u = static_cast<unsigned char>(c);
        switch (c) {
            case '"':
                out->append("\\\"");
                break;
            case '\\':
                out->append("\\\\");
                break;
            case '\b':
                out->append("\\b");
                break;
            case '\f':
                out->append("\\f");
                break;
            case '\n':
                out->append("\\n");
                break;
            case '\r':
                out->append("\\r");
                break;
            case '\t':
                out->append("\\t");
                break;
            default:
                if (u < 0x20) {
                    out->append("\\u00");
                    out->push_back(kHex[u >> 4]);
                    out->push_back(kHex[u & 15]);
                } else {
                    out->push_back(c);
                }
        }
    }
    out->push_back('"');
}

template <typename Int>
void append_integer(Int i, std::string* out) {
    char buf[24];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), i);
    out->append(buf, end);
}

}  // namespace

void append_python_float(double d, std::string* out) {
    if (d == 0.0) {
        out->append(std::signbit(d) ? "-0.0" : "0.0");
        return;
    }
    if (!std::isfinite(d)) {
        out->append(std::isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity");
        return;
    }
    // The shortest digits that read back as d, as "D.DDDDe+XX".
    char buf[64];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
    const std::string_view sci(buf, static_cast<size_t>(end - buf));
    const size_t e_at = sci.find('e');
    int exponent = 0;
    std::from_chars(sci.data() + e_at + (sci[e_at + 1] == '+' ? 2 : 1), sci.data() + sci.size(),
                    exponent);
    std::string_view mantissa = sci.substr(0, e_at);
    if (mantissa.front() == '-') {
        out->push_back('-');
        mantissa.remove_prefix(1);
    }
    std::string digits(mantissa.substr(0, 1));
    if (mantissa.size() > 2) {
        digits += mantissa.substr(2);  // Past "D.".
    }
    // repr's rule: positional while -4 <= exponent < 16, else with an exponent of 2+ digits.
    if (exponent < -4 || exponent >= 16) {
        out->push_back(digits[0]);
        if (digits.size() > 1) {
            out->push_back('.');
            out->append(digits, 1);
        }
        char e[16];
        std::snprintf(e, sizeof(e), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
        out->append(e);
    } else if (exponent < 0) {
        out->append("0.");
        out->append(static_cast<size_t>(-exponent - 1), '0');
        out->append(digits);
    } else {
        const size_t whole = static_cast<size_t>(exponent) + 1;
        if (digits.size() <= whole) {
            out->append(digits);
            out->append(whole - digits.size(), '0');
            out->append(".0");
        } else {
            out->append(digits, 0, whole);
            out->push_back('.');
            out->append(digits, whole);
        }
    }
}

void append_json(const boost::json::value& v, JsonStyle style, std::string* out) {
    namespace json = boost::json;
    const bool python = style == JsonStyle::kPython;
    switch (v.kind()) {
        case json::kind::object: {
            out->push_back('{');
            bool first = true;
            for (const auto& kv : v.get_object()) {
                if (!first) {
                    out->append(python ? ", " : ",");
                }
                first = false;
                append_string(kv.key(), out);
                out->append(python ? ": " : ":");
                append_json(kv.value(), style, out);
            }
            out->push_back('}');
            break;
        }
        case json::kind::array: {
            out->push_back('[');
            bool first = true;
            for (const auto& e : v.get_array()) {
                if (!first) {
                    out->append(python ? ", " : ",");
                }
                first = false;
                append_json(e, style, out);
            }
            out->push_back(']');
            break;
        }
        case json::kind::string:
            append_string(v.get_string(), out);
            break;
        case json::kind::double_:
            if (!python && !std::isfinite(v.get_double())) {
                out->append("null");  // JSON has no spelling for them.
            } else {
                append_python_float(v.get_double(), out);
            }
            break;
        case json::kind::int64:
            append_integer(v.get_int64(), out);
            break;
        case json::kind::uint64:
            append_integer(v.get_uint64(), out);
            break;
        case json::kind::bool_:
            out->append(v.get_bool() ? "true" : "false");
            break;
        case json::kind::null:
            out->append("null");
            break;
    }
}

std::string json_text(const boost::json::value& v) {
    std::string out;
    append_json(v, JsonStyle::kCompact, &out);
    return out;
}

boost::json::parse_options json_parse_options() {
    boost::json::parse_options options;
    options.max_depth = kMaxJsonDepth;
    return options;
}

namespace {

// boost::json::parser's handler (a value_stack taking each event), but for the numbers it reads
// as doubles: Boost 1.81 makes those from their digits and a power of ten in doubles (its
// precise mode came in 1.83), a unit in the last place off for some (1.380649e-23 read as
// 1.3806489999999998e-23), and a response_format `enum` or `const` written back from such a
// double is another number than the schema's. Their text is read again with std::from_chars,
// which rounds correctly; a value past a double's range keeps Boost's infinity or zero.
class PreciseNumbers {
public:
    static constexpr size_t max_object_size = boost::json::object::max_size();
    static constexpr size_t max_array_size = boost::json::array::max_size();
    static constexpr size_t max_key_size = boost::json::string::max_size();
    static constexpr size_t max_string_size = boost::json::string::max_size();
    using error_code = boost::json::error_code;
    using string_view = boost::json::string_view;

    PreciseNumbers() { stack.reset(); }

    bool on_document_begin(error_code&) { return true; }
    bool on_document_end(error_code&) { return true; }
    bool on_object_begin(error_code&) { return true; }
    bool on_object_end(size_t n, error_code&) {
        stack.push_object(n);
        return true;
    }
    bool on_array_begin(error_code&) { return true; }
    bool on_array_end(size_t n, error_code&) {
        stack.push_array(n);
        return true;
    }
    bool on_key_part(string_view s, size_t, error_code&) {
        stack.push_chars(s);
        return true;
    }
    bool on_key(string_view s, size_t, error_code&) {
        stack.push_key(s);
        return true;
    }
    bool on_string_part(string_view s, size_t, error_code&) {
        stack.push_chars(s);
        return true;
    }
    bool on_string(string_view s, size_t, error_code&) {
        stack.push_string(s);
        return true;
    }
    // A number split across writes comes in parts before its last; parse_json writes once.
    bool on_number_part(string_view s, error_code&) {
        number_.append(s.data(), s.size());
        return true;
    }
    bool on_int64(int64_t i, string_view, error_code&) {
        number_.clear();
        stack.push_int64(i);
        return true;
    }
    bool on_uint64(uint64_t u, string_view, error_code&) {
        number_.clear();
        stack.push_uint64(u);
        return true;
    }
    bool on_double(double d, string_view s, error_code&) {
        number_.append(s.data(), s.size());
        double precise = 0.0;
        const char* end = number_.data() + number_.size();
        const auto [at, err] = std::from_chars(number_.data(), end, precise);
        stack.push_double(err == std::errc() && at == end ? precise : d);
        number_.clear();
        return true;
    }
    bool on_bool(bool b, error_code&) {
        stack.push_bool(b);
        return true;
    }
    bool on_null(error_code&) {
        stack.push_null();
        return true;
    }
    bool on_comment_part(string_view, error_code&) { return true; }
    bool on_comment(string_view, error_code&) { return true; }

    boost::json::value_stack stack;

private:
    std::string number_;
};

}  // namespace

boost::json::value parse_json(std::string_view text, std::error_code& ec, std::string* why,
                              size_t max_depth) {
    ec.clear();
    boost::json::parse_options options = json_parse_options();
    options.max_depth = max_depth;
    boost::json::basic_parser<PreciseNumbers> parser(options);
    boost::json::error_code jec;
    const size_t used = parser.write_some(false, text.data(), text.size(), jec);
    if (!jec && used < text.size()) {
        jec = boost::json::error::extra_data;  // As boost::json::parser::write says.
    }
    ec = jec;
    if (!ec) {
        return parser.handler().stack.release();
    }
    if (why != nullptr) {
        const std::string_view before = text.substr(0, std::min(used, text.size()));
        const size_t line_start = before.rfind('\n');
        const size_t column =
            line_start == std::string_view::npos ? before.size() + 1 : before.size() - line_start;
        *why = "line " + std::to_string(1 + std::count(before.begin(), before.end(), '\n')) +
               ", column " + std::to_string(column) + ": " + ec.message();
        if (ec == boost::json::error::too_deep) {
            *why += " (more than " + std::to_string(max_depth) + " nested arrays and objects)";
        }
    }
    return nullptr;
}

Result<boost::json::object> parse_json_object(std::string_view text, std::string_view what,
                                              StatusCode code) {
    const std::string prefix = what.empty() ? std::string() : std::string(what) + ": ";
    std::error_code ec;
    std::string why;
    boost::json::value root = parse_json(text, ec, &why);
    if (ec) {
        return Status(code, prefix + "not valid JSON at " + why);
    }
    if (!root.is_object()) {
        return Status(code, prefix + "not a JSON object");
    }
    return std::move(root.get_object());
}

}  // namespace edge
