#!/usr/bin/env bash
# One-shot GPU check for an H100/H200-class machine, from a fresh copy of the repository on a
# machine with the CUDA toolkit and the Debian build packages (deploy/packages.txt; installed with
# deploy/setup when missing and the network allows): builds edgeserve with the CUDA backend (only
# the targets needed, for this GPU's architecture), runs the gpu- and cuda_host-labelled tests
# (each kernel against its CPU twin, the device decoder's greedy tokens on the fixture checkpoint
# vs the CPU backend, CUDA-graph replay, NCCL, sharded vs single GPU when there are several,
# serving on the device: the device CausalLM's logits vs the CPU model and the engine API's greedy
# tokens with engine.backend cuda vs cpu),
# writes make-model's `bench` checkpoint, then runs the decode benchmark (bench/gpu_decode.cc) on
# its real weights: BF16, FP8 and INT4 experts, 1 and 64 streams, as a fraction of the measured
# device-to-device copy bandwidth (after bench_gpu_serving: decode through the engine's device
# CausalLM, as engine.backend cuda serves, over the bare graph decoder's tokens/s, for the Qwen3
# and the GLM-4.5 bench checkpoints). Prints the
# test summary, the bench tables, and as its last line the decode bench's JSON. Fails if a test
# fails or was skipped.
# Usage: bench/gpu.sh [extra cmake args]   (EDGE_GPU_BUILD_DIR overrides build-gpu/)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${EDGE_GPU_BUILD_DIR:-$root/build-gpu}"
nvcc="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "bench/gpu.sh: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ ! -x "$nvcc" ]; then
    echo "bench/gpu.sh: no nvcc (looked at \$CUDACXX, PATH and /usr/local/cuda/bin)" >&2
    exit 2
fi
# The Debian packages the build needs (a subset of deploy/packages.txt).
missing=()
for p in cmake pkg-config g++ libboost1.81-dev libboost-json1.81-dev libssl-dev libyaml-cpp-dev \
    prometheus-cpp-dev doctest-dev libpcre2-dev libicu-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bench/gpu.sh: installing ${missing[*]} (deploy/setup)" >&2
    "$root/deploy/setup" || { echo "bench/gpu.sh: missing packages: ${missing[*]}" >&2; exit 2; }
fi
generator=(-G "Unix Makefiles")
command -v ninja >/dev/null && generator=(-G Ninja)
# Compile for this GPU only: compute capability 9.0 -> sm_90a, 8.0 -> sm_80, ...
cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
arch="$cap"
[ "$cap" = 90 ] && arch=90a
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache
    -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
t0=$(date +%s)
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEDGE_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$arch" "${launcher[@]}" "$@" \
    >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
grep -q "CUDA backend ON" "$build.configure.log" || { echo "CUDA backend not enabled" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)" --target gpu_tests cuda_host_tests bench_gpu_decode \
    bench_gpu_serving edgeserve
t1=$(date +%s)
echo "build: $((t1 - t0)) s (sm_$arch)"
cd "$build"
ctest -L 'gpu|cuda_host' --output-on-failure --timeout 300 | tee "$build/gpu-ctest.log"
if grep -q "Skipped" "$build/gpu-ctest.log" || grep -q "\*\*\*Not Run" "$build/gpu-ctest.log"; then
    echo "bench/gpu.sh: gpu tests were skipped on a machine with a GPU" >&2
    exit 1
fi
t2=$(date +%s)
echo "tests: $((t2 - t1)) s"
model="$build/bench-model"
if [ ! -f "$model/config.json" ]; then
    "$build/daemon/edgeserve" make-model --preset bench --out "$model" --seed 7 >/dev/null
fi
t3=$(date +%s)
echo "bench checkpoint: $((t3 - t2)) s ($(du -sh "$model" | cut -f1))"
# Serving through the engine's device CausalLM vs the bare graph decoder (host overhead ratio).
"$build/bench/bench_gpu_serving" --model "$model" --steps 32 --context 256
# The same on make-model's GLM-4.5 `bench` checkpoint (dense first layer, shared expert, sigmoid
# grouped routing, q/k/v bias, partial RoPE on the device).
glm_model="$build/bench-model-glm4"
if [ ! -f "$glm_model/config.json" ]; then
    "$build/daemon/edgeserve" make-model --arch glm4_moe --preset bench --out "$glm_model" \
        --seed 7 >/dev/null
fi
"$build/bench/bench_gpu_serving" --model "$glm_model" --steps 32 --context 256
# And on its DeepSeek-V3 `bench` checkpoint (MLA attention over the paged latent cache).
mla_model="$build/bench-model-deepseek-v3"
if [ ! -f "$mla_model/config.json" ]; then
    "$build/daemon/edgeserve" make-model --arch deepseek_v3 --preset bench --out "$mla_model" \
        --seed 7 >/dev/null
fi
"$build/bench/bench_gpu_serving" --model "$mla_model" --steps 32 --context 256
"$build/bench/bench_gpu_decode" --model "$model" --steps 32 --context 256
