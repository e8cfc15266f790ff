#!/usr/bin/env bash
# Packs the CUDA tests and benches for a GPU machine that cannot build them: the device image
# here has nvcc, CMake and the driver but not the Debian -dev packages (Boost, OpenSSL, yaml-cpp,
# prometheus-cpp, PCRE2, ICU) and no network. Builds gpu_tests, bench_gpu_decode, bench_tenancy,
# bench_gpu_serving and edgeserve in build/ (CUDA for sm_90a and sm_80, as configured), strips
# them, and writes build/gpu-bundle/bundle.tar.xz with the shared libraries they load beyond
# glibc, libstdc++ and the driver's (NCCL is found on the GPU machine: it is 200 MB). Carry that
# file and run bench/gpu_bundle_run.sh there (docs/benchmarks.md).
# Usage: bench/gpu_bundle.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${EDGE_BUILD_DIR:-$root/build}"
EDGE_BUILD_TARGETS="gpu_tests bench_gpu_decode bench_gpu_serving bench_tenancy edgeserve" \
    "$root/deploy/build"
out="$build/gpu-bundle"
rm -rf "$out" && mkdir -p "$out/stage/bin" "$out/stage/lib"
for b in tests/gpu/gpu_tests bench/bench_gpu_decode bench/bench_gpu_serving bench/bench_tenancy \
    daemon/edgeserve; do
    strip -o "$out/stage/bin/$(basename "$b")" "$build/$b"
done
for b in "$out"/stage/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
    while read -r lib; do
        case "$(basename "$lib")" in
            libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libgcc_s* | \
                libstdc++* | libnccl* | libcuda.so*) ;;
            *) cp -L "$lib" "$out/stage/lib/" ;;
        esac
    done
tar -C "$out/stage" -cJf "$out/bundle.tar.xz" bin lib
rm -rf "$out/stage"
echo "$(du -h "$out/bundle.tar.xz" | cut -f1) ${out#"$root"/}/bundle.tar.xz"
