// Memory read bandwidth at 1 and 2 threads (median of 7 runs over a 1 GiB buffer): the limit the
// decode benchmark's figures are ratios to.

#include <cstdio>

#include "bench/bench_cli.h"
#include "bench/membw_probe.h"

int main(int argc, char** argv) {
    edge::bench::parse_flags(argc, argv, {},
                             "bench_membw: memory read bandwidth at 1 and 2 threads (median of 7 "
                             "runs over a 1 GiB buffer)");
    double one = edge::bench::measure_read_bandwidth(1);
    double two = edge::bench::measure_read_bandwidth(2);
    std::printf("%-28s %10s\n", "threads", "GB/s");
    std::printf("%-28d %10.2f\n", 1, one / 1e9);
    std::printf("%-28d %10.2f\n", 2, two / 1e9);
    std::printf("{\"bench\":\"membw\",\"read_gbps_1t\":%.3f,\"read_gbps_2t\":%.3f}\n", one / 1e9,
                two / 1e9);
    return 0;
}
