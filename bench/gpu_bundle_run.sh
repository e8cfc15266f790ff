#!/usr/bin/env bash
# On the GPU machine, from a copy of the repository that carries build/gpu-bundle/bundle.tar.xz
# (bench/gpu_bundle.sh): unpacks it, runs the gpu tests (the fixtures are read through the
# source path compiled in, linked to this copy when it lives elsewhere), then writes make-model's
# bench checkpoints and runs bench_gpu_decode and bench_gpu_serving (Qwen3-MoE, GLM-4.5,
# DeepSeek-V3) and bench_tenancy --backend cuda (64 streams from 4 tenants, Qwen3-MoE). With
# GPU_PROFILE=1, also ncu's time per kernel for one decode step shape each.
# Logs go to $OUT (or /tmp/gpu-logs). Exits 1 if a test failed or was skipped.
# Usage: bench/gpu_bundle_run.sh [compiled-in source path, default /work/main]
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="${1:-/work/main}"
logs="${OUT:-/tmp/gpu-logs}"
mkdir -p "$logs"
if [ "$src" != "$root" ] && [ ! -e "$src/tests/fixtures" ]; then
    mkdir -p "$(dirname "$src")" && rm -rf "$src" && ln -sfn "$root" "$src"
fi
g=/tmp/gpu-bundle
rm -rf "$g" && mkdir -p "$g" && tar -C "$g" -xJf "$root/build/gpu-bundle/bundle.tar.xz" || exit 2
nccl="$(find /usr/local /opt /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)"
export LD_LIBRARY_PATH="$g/lib${nccl:+:$(dirname "$nccl")}"
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "bench/gpu_bundle_run.sh: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if ldd "$g/bin/gpu_tests" | grep "not found"; then
    exit 2
fi
t0=$(date +%s)
timeout 300 "$g/bin/gpu_tests" --duration=true >"$logs/gpu_tests.log" 2>&1
rc=$?
echo "gpu_tests: rc $rc in $(($(date +%s) - t0)) s"
grep -E "ERROR|SKIPPED|test cases|assertions" "$logs/gpu_tests.log" | head -40
if [ "$rc" -ne 0 ] || grep -Eq "\| *[1-9][0-9]* skipped" "$logs/gpu_tests.log"; then
    status=1
else
    status=0
fi
for arch in qwen3_moe glm4_moe deepseek_v3; do
    "$g/bin/edgeserve" make-model --arch "$arch" --preset bench --out "/tmp/bench-$arch" \
        --seed 7 >/dev/null || echo "make-model $arch failed"
done
for arch in qwen3_moe glm4_moe deepseek_v3; do
    timeout 120 "$g/bin/bench_gpu_serving" --model "/tmp/bench-$arch" --steps 32 --context 256 \
        >"$logs/serving-$arch.log" 2>&1
    echo "bench_gpu_serving $arch: rc $?"
    tail -4 "$logs/serving-$arch.log" | head -3
done
# Tenancy on the device: the default contended batch (32 of 64 streams), then a larger step
# budget, then every stream admitted with 32 decoding a step by tenant weight.
for flags in "" "--step-tokens 128" "--batch 64 --decode 32 --step-tokens 128 --warmup 200"; do
    name="tenancy$(echo "$flags" | tr -d ' -')"
    timeout 120 "$g/bin/bench_tenancy" --model /tmp/bench-qwen3_moe --backend cuda --steps 600 \
        --out 32 $flags >"$logs/$name.log" 2>&1
    echo "bench_tenancy --backend cuda $flags: rc $?"
    grep -E "tokens/s|ratio|error|inter-token|hit rate|preemptions" "$logs/$name.log"
done
if [ "${GPU_PROFILE:-0}" = 1 ] && command -v ncu >/dev/null; then
    for streams in 1 64; do
        timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 420 \
            --print-summary per-kernel "$g/bin/bench_gpu_decode" --model /tmp/bench-qwen3_moe \
            --steps 4 --context 256 --streams "$streams" >"$logs/ncu-$streams.log" 2>&1
        echo "ncu $streams streams: rc $?"
    done
fi
timeout 180 "$g/bin/bench_gpu_decode" --model /tmp/bench-qwen3_moe --steps 32 --context 256 \
    >"$logs/decode.log" 2>&1
echo "bench_gpu_decode: rc $?"
tail -9 "$logs/decode.log"
exit "$status"
