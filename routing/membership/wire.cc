#include "routing/membership/wire.h"

#include <bit>
#include <cstring>

namespace edge::routing::membership {

void WireWriter::put_varint(uint64_t v) {
    while (v >= 0x80) {
        buf_.push_back(static_cast<uint8_t>(v) | 0x80);
        v >>= 7;
    }
    buf_.push_back(static_cast<uint8_t>(v));
}

void WireWriter::put_bytes(std::span<const uint8_t> bytes) {
    buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

void WireWriter::field_uint(uint32_t tag, uint64_t v) {
    WireWriter inner;
    inner.put_varint(v);
    field_bytes(tag, inner.bytes());
}

void WireWriter::field_bytes(uint32_t tag, std::span<const uint8_t> bytes) {
    put_varint(tag);
    put_varint(bytes.size());
    put_bytes(bytes);
}

void WireWriter::field_string(uint32_t tag, std::string_view s) {
    field_bytes(tag, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()),
                                              s.size()));
}

void WireWriter::field_double(uint32_t tag, double v) {
    const uint64_t bits = std::bit_cast<uint64_t>(v);
    uint8_t raw[8];
    for (int i = 0; i < 8; ++i) {
        raw[i] = static_cast<uint8_t>(bits >> (8 * i));
    }
    field_bytes(tag, raw);
}

Result<uint64_t> WireField::as_uint() const {
    WireReader r(value);
    EDGE_ASSIGN_OR_RETURN(uint64_t v, r.read_varint("field " + std::to_string(tag)));
    if (!r.done()) {
        return data_loss_error("gossip wire: field " + std::to_string(tag) +
                               " has trailing bytes after its integer");
    }
    return v;
}

Result<std::optional<uint64_t>> WireField::as_enum(uint64_t lo, uint64_t hi) const {
    EDGE_ASSIGN_OR_RETURN(uint64_t v, as_uint());
    if (v < lo || v > hi) {
        return std::optional<uint64_t>();
    }
    return std::optional<uint64_t>(v);
}

Result<double> WireField::as_double() const {
    if (value.size() != 8) {
        return data_loss_error("gossip wire: field " + std::to_string(tag) +
                               " is not an 8-byte double");
    }
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) {
        bits |= static_cast<uint64_t>(value[i]) << (8 * i);
    }
    return std::bit_cast<double>(bits);
}

Result<uint8_t> WireReader::read_u8(std::string_view what) {
    if (pos_ >= data_.size()) {
        return data_loss_error("gossip wire: truncated before " + std::string(what));
    }
    return data_[pos_++];
}

Result<uint64_t> WireReader::read_varint(std::string_view what) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (pos_ >= data_.size()) {
            return data_loss_error("gossip wire: truncated varint in " + std::string(what));
        }
        const uint8_t b = data_[pos_++];
        if (shift == 63 && (b & 0x7e) != 0) {
            return data_loss_error("gossip wire: varint overflows 64 bits in " +
                                   std::string(what));
        }
        v |= static_cast<uint64_t>(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            return v;
        }
    }
    return data_loss_error("gossip wire: varint longer than 10 bytes in " + std::string(what));
}

Result<std::span<const uint8_t>> WireReader::read_span(uint64_t n, std::string_view what) {
    if (n > remaining()) {
        return data_loss_error("gossip wire: " + std::string(what) + " claims " +
                               std::to_string(n) + " bytes but only " +
                               std::to_string(remaining()) + " remain");
    }
    auto out = data_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
}

Result<WireField> WireReader::read_field(std::string_view what) {
    EDGE_ASSIGN_OR_RETURN(uint64_t tag, read_varint(what));
    if (tag > 0xffffffffull) {
        return data_loss_error("gossip wire: field tag too large in " + std::string(what));
    }
    EDGE_ASSIGN_OR_RETURN(uint64_t len, read_varint(what));
    EDGE_ASSIGN_OR_RETURN(auto span, read_span(len, what));
    return WireField{static_cast<uint32_t>(tag), span};
}

}  // namespace edge::routing::membership
