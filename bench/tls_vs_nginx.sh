#!/usr/bin/env bash
# TLS keep-alive throughput of GET /v1/models: edgeserve on one I/O thread against nginx with one
# worker, same certificate, same response bytes, both measured with wrk in the same run.
# The two servers are measured in alternating rounds (BENCH_ROUNDS, default 3, of BENCH_SECONDS
# each) so that a change in the machine's load hits both alike; the figures are the medians of the
# rounds, and the ratio is the median of the per-round ratios.
# Each server's CPU time (user + system, from /proc) per request is reported too: on a shared
# machine it moves far less with the load than requests/s do.
# Prints a table, then (last line) one JSON object: {"edgeserve_rps", "nginx_rps", "ratio",
# "edgeserve_cpu_us_per_request", "nginx_cpu_us_per_request", "cpu_ratio" (nginx/edgeserve, > 1:
# edgeserve spends less CPU per request)}.
# Env: EDGE_BUILD_DIR (default build/), BENCH_SECONDS (10), BENCH_CONNECTIONS (32),
# BENCH_ROUNDS (3).
set -euo pipefail
conns="${BENCH_CONNECTIONS:-32}"
rounds="${BENCH_ROUNDS:-3}"
source "$(dirname "$0")/tls_bench_common.sh"
tls_bench_setup tls_vs_nginx

"$edgeserve" run --config "$work/edgeserve.yaml" 2>"$work/edgeserve.log" &
pids+=($!)
edge_pid=$!
wait_port "$edge_port"
body="$(curl -sk "https://127.0.0.1:$edge_port/v1/models")"

write_nginx_conf "$body"
"$nginx_bin" -c "$work/nginx.conf" -p "$work/nginx" 2>>"$work/nginx-error.log" &
pids+=($!)
wait_port "$nginx_port"
nginx_body="$(curl -sk "https://127.0.0.1:$nginx_port/v1/models")"
[ "$body" = "$nginx_body" ] || { echo "tls_vs_nginx: response bodies differ" >&2; exit 1; }

# The nginx process that serves (its single worker), by parent.
nginx_worker="$(pgrep -P "$(cat "$work/nginx.pid")" | head -1)"
[ -n "$nginx_worker" ] || { echo "tls_vs_nginx: no nginx worker" >&2; exit 1; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # utime + stime, clock ticks.
hz="$(getconf CLK_TCK)"
# run_wrk PORT NAME PID: prints "requests/s CPU-microseconds-per-request".
run_wrk() {
    local before after
    before="$(cpu_ticks "$3")"
    wrk -t1 -c"$conns" -d"${seconds}s" "https://127.0.0.1:$1/v1/models" > "$work/wrk-$2.txt"
    after="$(cpu_ticks "$3")"
    awk -v ticks=$((after - before)) -v hz="$hz" '
        /requests in/ {n = $1}
        /^Requests\/sec:/ {rps = $2}
        END {printf "%s %.2f\n", rps, ticks * 1e6 / hz / n}' "$work/wrk-$2.txt"
}
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
edge_all=(); nginx_all=(); ratio_all=(); edge_cpu_all=(); nginx_cpu_all=(); cpu_ratio_all=()
for round in $(seq "$rounds"); do
    read -r e ecpu < <(run_wrk "$edge_port" edgeserve "$edge_pid")
    read -r n ncpu < <(run_wrk "$nginx_port" nginx "$nginx_worker")
    edge_all+=("$e"); nginx_all+=("$n"); edge_cpu_all+=("$ecpu"); nginx_cpu_all+=("$ncpu")
    ratio_all+=("$(awk -v a="$e" -v b="$n" 'BEGIN {printf "%.4f", a / b}')")
    cpu_ratio_all+=("$(awk -v a="$ncpu" -v b="$ecpu" 'BEGIN {printf "%.4f", a / b}')")
    echo "round $round: edgeserve $e req/s ${ecpu} us CPU/req, nginx $n req/s ${ncpu} us CPU/req" >&2
done
edge_rps="$(printf '%s\n' "${edge_all[@]}" | median)"
nginx_rps="$(printf '%s\n' "${nginx_all[@]}" | median)"
ratio="$(printf '%s\n' "${ratio_all[@]}" | median)"
ratio="$(awk -v r="$ratio" 'BEGIN {printf "%.3f", r}')"
edge_cpu="$(printf '%s\n' "${edge_cpu_all[@]}" | median)"
nginx_cpu="$(printf '%s\n' "${nginx_cpu_all[@]}" | median)"
cpu_ratio="$(printf '%s\n' "${cpu_ratio_all[@]}" | median)"
cpu_ratio="$(awk -v r="$cpu_ratio" 'BEGIN {printf "%.3f", r}')"

printf '%-28s %14s\n' "server (GET /v1/models, TLS)" "requests/s"
printf '%-28s %14s\n' "edgeserve, 1 I/O thread" "$edge_rps"
printf '%-28s %14s\n' "nginx, 1 worker" "$nginx_rps"
printf '%-28s %14s\n' "ratio edgeserve/nginx" "$ratio"
printf '%-28s %14s\n' "server CPU per request" "microseconds"
printf '%-28s %14s\n' "edgeserve" "$edge_cpu"
printf '%-28s %14s\n' "nginx" "$nginx_cpu"
printf '%-28s %14s\n' "ratio nginx/edgeserve" "$cpu_ratio"
printf '{"bench":"tls_vs_nginx","seconds":%s,"rounds":%s,"connections":%s,"edgeserve_rps":%s,"nginx_rps":%s,"ratio":%s,"edgeserve_cpu_us_per_request":%s,"nginx_cpu_us_per_request":%s,"cpu_ratio":%s}\n' \
    "$seconds" "$rounds" "$conns" "$edge_rps" "$nginx_rps" "$ratio" "$edge_cpu" "$nginx_cpu" \
    "$cpu_ratio"
