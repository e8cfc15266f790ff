// Scalar reference kernels: decode a piece of a row into a small stack buffer, then dot it with
// every token, so each weight byte is read once for all tokens.

#include <algorithm>

#include "engine/quant/fp8.h"
#include "engine/quant/kernels_internal.h"

namespace edge::engine::quant::detail {
namespace {

constexpr int64_t kPiece = 128;

// Accumulates piece [c0, c0 + n) of a decoded row into every token's running sum.
void accumulate_piece(const float* wrow, int64_t c0, int64_t n, const float* x, int64_t cols,
                      int64_t n_tokens, double* sums) {
    for (int64_t t = 0; t < n_tokens; ++t) {
        const float* xt = x + t * cols + c0;
        float s = 0.0f;
        for (int64_t i = 0; i < n; ++i) {
            s += wrow[i] * xt[i];
        }
        sums[t] += s;
    }
}

template <typename DecodePiece>
void run_rows(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
              int64_t row_begin, int64_t row_end, DecodePiece decode) {
    float piece[kPiece];
    constexpr int64_t kTokenTile = 64;
    double sums[kTokenTile];
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenTile) {
        const int64_t nt = std::min(kTokenTile, n_tokens - t0);
        for (int64_t r = row_begin; r < row_end; ++r) {
            std::fill(sums, sums + nt, 0.0);
            for (int64_t c0 = 0; c0 < w.cols; c0 += kPiece) {
                const int64_t n = std::min(kPiece, w.cols - c0);
                decode(r, c0, n, piece);
                accumulate_piece(piece, c0, n, x + t0 * w.cols, w.cols, nt, sums);
            }
            for (int64_t t = 0; t < nt; ++t) {
                y[(t0 + t) * ldy + r] = static_cast<float>(sums[t]);
            }
        }
    }
}

}  // namespace

void matmul_fp8_scalar(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
                       int64_t row_begin, int64_t row_end) {
    const float* table = fp8_e4m3_table();
    const int64_t block_cols = (w.cols + 127) / 128;
    const auto* data = static_cast<const uint8_t*>(w.data);
    run_rows(w, x, n_tokens, y, ldy, row_begin, row_end,
             [&](int64_t r, int64_t c0, int64_t n, float* out) {
                 const uint8_t* q = data + r * w.cols + c0;
                 const float s = w.scales[(r / 128) * block_cols + c0 / 128];
                 for (int64_t i = 0; i < n; ++i) {
                     out[i] = table[q[i]] * s;
                 }
             });
}

void matmul_int8_scalar(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
                        int64_t row_begin, int64_t row_end) {
    const auto* data = static_cast<const int8_t*>(w.data);
    run_rows(w, x, n_tokens, y, ldy, row_begin, row_end,
             [&](int64_t r, int64_t c0, int64_t n, float* out) {
                 const int8_t* q = data + r * w.cols + c0;
                 const float s = w.scales[r];
                 for (int64_t i = 0; i < n; ++i) {
                     out[i] = static_cast<float>(q[i]) * s;
                 }
             });
}

void matmul_int4_scalar(const Weight& w, const float* x, int64_t n_tokens, float* y, int64_t ldy,
                        int64_t row_begin, int64_t row_end) {
    const int64_t g = w.format == WeightFormat::kInt4G32 ? 32 : 128;
    const auto* data = static_cast<const uint8_t*>(w.data);
    run_rows(w, x, n_tokens, y, ldy, row_begin, row_end,
             [&](int64_t r, int64_t c0, int64_t n, float* out) {
                 const uint8_t* q = data + r * (w.cols / 2);
                 const float* s = w.scales + r * (w.cols / g);
                 for (int64_t i = 0; i < n; ++i) {
                     const int64_t c = c0 + i;
                     const int nibble = (c & 1) ? (q[c >> 1] >> 4) : (q[c >> 1] & 0xF);
                     out[i] = static_cast<float>(nibble - 8) * s[c / g];
                 }
             });
}

}  // namespace edge::engine::quant::detail
