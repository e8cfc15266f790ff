#pragma once

// Helpers of the GPU tests: device buffers that free themselves, seeded random data, and the
// comparison with a stated threshold. Test-only; not thread-safe.

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace edge::testing {

template <typename T>
class DeviceVec {
public:
    explicit DeviceVec(size_t n) : n_(n) {
        REQUIRE(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)) == cudaSuccess);
    }
    explicit DeviceVec(const std::vector<T>& host) : DeviceVec(host.size()) { upload(host); }
    ~DeviceVec() { cudaFree(p_); }
    DeviceVec(const DeviceVec&) = delete;
    DeviceVec& operator=(const DeviceVec&) = delete;

    T* get() const { return p_; }
    void upload(const std::vector<T>& host) {
        REQUIRE(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) ==
                cudaSuccess);
    }
    std::vector<T> download() const {
        std::vector<T> out(n_);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        REQUIRE(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) ==
                cudaSuccess);
        return out;
    }

private:
    T* p_ = nullptr;
    size_t n_;
};

inline std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float lo = -1.0f,
                                        float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) {
        x = d(rng);
    }
    return v;
}

// Checks |got - want| <= abs_tol + rel_tol * |want| element-wise; reports the worst element.
inline void check_close(const std::vector<float>& got, const std::vector<float>& want,
                        double abs_tol, double rel_tol, const std::string& what) {
    REQUIRE(got.size() == want.size());
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(static_cast<double>(got[i]) - want[i]) -
                           rel_tol * std::fabs(static_cast<double>(want[i]));
        if (!(err <= worst) || std::isnan(got[i])) {
            worst = std::isnan(got[i]) ? INFINITY : err;
            at = i;
        }
    }
    INFO(what << ": worst excess error " << worst << " at " << at << " (got " << got[at]
              << ", want " << want[at] << "), allowed " << abs_tol << " + " << rel_tol
              << " * |want|");
    CHECK(worst <= abs_tol);
}

}  // namespace edge::testing
