#pragma once

// The low-level gossip wire encoding: LEB128 varints, and TLV fields (varint tag, varint length,
// value) so a decoder skips fields it does not know and a newer peer can add some. A newer peer
// may add values to an enumeration too: as_enum reports one as not understood, not as an error,
// and the caller decides what it means. WireWriter appends to a byte vector; WireReader walks
// untrusted bytes and checks every length against what is left before using it (overflow-safe),
// returning kDataLoss naming the field on any violation. Both are plain values with no shared
// state.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/status.h"

namespace edge::routing::membership {

class WireWriter {
public:
    void put_u8(uint8_t v) { buf_.push_back(v); }
    void put_varint(uint64_t v);
    void put_bytes(std::span<const uint8_t> bytes);

    // TLV fields.
    void field_uint(uint32_t tag, uint64_t v);
    void field_bytes(uint32_t tag, std::span<const uint8_t> bytes);
    void field_string(uint32_t tag, std::string_view s);
    void field_double(uint32_t tag, double v);

    std::vector<uint8_t>& bytes() { return buf_; }
    std::vector<uint8_t> take() { return std::move(buf_); }

private:
    std::vector<uint8_t> buf_;
};

// One TLV field as read: its tag and the span of its value (valid while the input lives).
struct WireField {
    uint32_t tag = 0;
    std::span<const uint8_t> value;

    Result<uint64_t> as_uint() const;
    Result<double> as_double() const;
    // An enumeration: its value when in [lo, hi], nullopt for any other integer (a value a newer
    // peer added, which the caller treats as not understood: proto2's closed enums do the same),
    // kDataLoss when the field is not one integer at all.
    Result<std::optional<uint64_t>> as_enum(uint64_t lo, uint64_t hi) const;
    std::string as_string() const { return std::string(value.begin(), value.end()); }
    std::vector<uint8_t> as_bytes() const { return {value.begin(), value.end()}; }
};

class WireReader {
public:
    explicit WireReader(std::span<const uint8_t> data) : data_(data) {}

    bool done() const { return pos_ >= data_.size(); }
    size_t remaining() const { return data_.size() - pos_; }

    Result<uint8_t> read_u8(std::string_view what);
    Result<uint64_t> read_varint(std::string_view what);
    // A span of `n` bytes, checked against what is left.
    Result<std::span<const uint8_t>> read_span(uint64_t n, std::string_view what);
    // The next TLV field of a message body.
    Result<WireField> read_field(std::string_view what);

private:
    std::span<const uint8_t> data_;
    size_t pos_ = 0;
};

}  // namespace edge::routing::membership
