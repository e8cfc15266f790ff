#include "engine/quant/quant_kernels.h"

#include <string_view>

#if defined(__x86_64__)
#include <cpuid.h>

#include "engine/cpu/bf16_split.h"
#endif

#include "engine/quant/kernels_internal.h"
#include "engine/quant/quantized_weight.h"

namespace edge::engine::quant {
namespace {

struct CpuFeatures {
    bool avx2 = false;    // AVX2 + FMA + F16C.
    bool avx512 = false;  // AVX-512 F/BW/VL/DQ.
    bool vnni = false;    // AVX-512 VNNI.
    bool vbmi = false;    // AVX-512 VBMI (byte permutes).
    bool bf16 = false;    // AVX512_BF16 (bf16 dot products).
    bool gfni = false;    // GFNI (bit-matrix byte transforms), with AVX-512.
};

#if defined(__x86_64__)
// F16C straight from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports lacks "f16c".
bool has_f16c() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}
#endif

CpuFeatures detect() {
    CpuFeatures f;
#if defined(__x86_64__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.vnni = f.avx512 && __builtin_cpu_supports("avx512vnni");
    f.vbmi = f.avx512 && __builtin_cpu_supports("avx512vbmi");
    f.bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
    f.gfni = f.avx512 && __builtin_cpu_supports("gfni");
#endif
    return f;
}

const CpuFeatures& features() {
    static const CpuFeatures f = detect();
    return f;
}

}  // namespace

namespace {

// The kernels for WeightLayout::kRowTiles16 (no scalar one: see matmul_kernel_variants).
std::vector<KernelVariant> row_tile_variants(WeightFormat format) {
    std::vector<KernelVariant> out;
#if defined(__x86_64__)
    const CpuFeatures& f = features();
    switch (format) {
        case WeightFormat::kInt8Row:
            if (f.vnni) {
                out.push_back({"avx512-vnni-tiles", detail::matmul_int8_tiles_avx512_vnni, 64});
            }
            break;
        case WeightFormat::kInt4G32:
        case WeightFormat::kInt4G128:
            if (f.vnni && f.gfni) {
                out.push_back({"avx512-vnni-gfni-tiles", detail::matmul_int4_tiles_avx512_vnni_gfni,
                               int4_group_size(format)});
            }
            break;
        default:
            break;
    }
#endif
    return out;
}

}  // namespace

std::vector<KernelVariant> matmul_kernel_variants(WeightFormat format, WeightLayout layout) {
    if (layout == WeightLayout::kRowTiles16) {
        return row_tile_variants(format);
    }
    std::vector<KernelVariant> out;
    [[maybe_unused]] const CpuFeatures& f = features();
    switch (format) {
        case WeightFormat::kFP8E4M3Block128:
            out.push_back({"scalar", detail::matmul_fp8_scalar, 0});
#if defined(__x86_64__)
            if (f.avx2) {
                out.push_back({"avx2", detail::matmul_fp8_avx2, 0});
            }
            // The VBMI table decode measured slower than the F16 decode on Zen 4 (6.5-9 vs
            // 9.6-14 GB/s in cache, docs/quantization.md), so it is listed, tested, not picked.
            if (f.vbmi) {
                out.push_back({"avx512-vbmi", detail::matmul_fp8_avx512_vbmi, 0});
            }
            if (f.avx512) {
                out.push_back({"avx512", detail::matmul_fp8_avx512, 0});
            }
            if (f.bf16) {
                out.push_back(
                    {"avx512-bf16", detail::matmul_fp8_avx512_bf16, 0, cpu::kBf16SplitRelError});
            }
            // Table decode into bf16 and one bf16 per activation: the fewest ops per weight.
            if (f.bf16 && f.vbmi) {
                out.push_back({"avx512-bf16-vbmi", detail::matmul_fp8_avx512_bf16_vbmi, 0,
                               kBf16RoundRelError});
            }
#endif
            break;
        case WeightFormat::kInt8Row:
            out.push_back({"scalar", detail::matmul_int8_scalar, 0});
#if defined(__x86_64__)
            if (f.avx2) {
                out.push_back({"avx2", detail::matmul_int8_avx2, 0});
            }
            if (f.avx512) {
                out.push_back({"avx512", detail::matmul_int8_avx512, 0});
            }
            // Integer dot products need fewer ops per weight than widening to f32, even at half
            // the vector width; picked where VNNI is missing (docs/quantization.md).
            if (f.avx2) {
                out.push_back({"avx2-i8dot", detail::matmul_int8_avx2_i8dot, 64});
            }
            if (f.vnni) {
                out.push_back({"avx512-vnni", detail::matmul_int8_avx512_vnni, 64});
            }
#endif
            break;
        case WeightFormat::kInt4G32:
        case WeightFormat::kInt4G128:
            out.push_back({"scalar", detail::matmul_int4_scalar, 0});
#if defined(__x86_64__)
            if (f.avx2) {
                out.push_back({"avx2", detail::matmul_int4_avx2, 0});
            }
            if (f.avx512) {
                out.push_back({"avx512", detail::matmul_int4_avx512, 0});
            }
            if (f.avx2) {
                out.push_back(
                    {"avx2-i8dot", detail::matmul_int4_avx2_i8dot, int4_group_size(format)});
            }
            if (f.vnni) {
                out.push_back(
                    {"avx512-vnni", detail::matmul_int4_avx512_vnni, int4_group_size(format)});
            }
            if (f.vnni && f.gfni) {
                out.push_back({"avx512-vnni-gfni", detail::matmul_int4_avx512_vnni_gfni,
                               int4_group_size(format)});
            }
#endif
            break;
        default:
            break;
    }
    return out;
}

bool decodes_to_bf16(const Weight& w) {
    const bool format = w.format == WeightFormat::kFP8E4M3Block128 ||
                        w.format == WeightFormat::kInt8Row || w.format == WeightFormat::kInt4G32 ||
                        w.format == WeightFormat::kInt4G128;
    return format && w.layout == WeightLayout::kRows && features().bf16;
}

namespace {

// The level a variant needs, from its name ("scalar", "avx2...", "avx512...", "...bf16...").
KernelLevel level_of(std::string_view name) {
    if (name.find("bf16") != std::string_view::npos) {
        return KernelLevel::kAvx512Bf16;
    }
    if (name.starts_with("avx512")) {
        return KernelLevel::kAvx512;
    }
    return name.starts_with("avx2") ? KernelLevel::kAvx2 : KernelLevel::kScalar;
}

}  // namespace

MatmulKernel matmul_kernel_for(WeightFormat format, WeightLayout layout, KernelLevel level) {
    const std::vector<KernelVariant> variants = matmul_kernel_variants(format, layout);
    for (auto it = variants.rbegin(); it != variants.rend(); ++it) {
        if (level_of(it->name) <= level) {
            return it->kernel;
        }
    }
    return nullptr;
}

}  // namespace edge::engine::quant
