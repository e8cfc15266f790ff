// main() of the GPU test binary: without a CUDA device every test exits 77 (ctest's SKIP_RETURN_CODE
// for the gpu label) after printing why, so CI machines without a GPU report the tests as
// skipped instead of failed. Listing the tests (doctest_discover_tests at build time) never
// touches CUDA.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

#include "engine/cuda/cuda_backend.h"

int main(int argc, char** argv) {
    bool listing = false;
    for (int i = 1; i < argc; ++i) {
        listing = listing || std::strncmp(argv[i], "--list", 6) == 0 ||
                  std::strncmp(argv[i], "-ltc", 4) == 0 || std::strncmp(argv[i], "-h", 2) == 0;
    }
    if (!listing && edge::engine::cuda::cuda_device_count() == 0) {
        std::printf("SKIPPED: no CUDA device visible to this process (cudaGetDeviceCount found "
                    "none); the gpu-labelled tests need an NVIDIA GPU and driver\n");
        return 77;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
