#!/usr/bin/env bash
# User-space instructions per keep-alive TLS GET /v1/models, edgeserve (one I/O thread) against
# nginx (one worker, master_process off), each under valgrind's callgrind and driven by wrk with
# the same certificate and response bytes. Unlike requests/s on a shared machine, instruction
# counts do not move with the load; they leave out the kernel (syscalls), which tls_vs_nginx.sh
# measures.
# Counting: instrumentation is on from the start (so handshakes are done before it counts), the
# counters are zeroed a few seconds into the wrk run, and the requests served since are read from
# each server's own counter (edgeserve's /metrics, nginx's stub_status).
# Prints a table, then (last line) one JSON object: {"edgeserve_instructions_per_request",
# "nginx_instructions_per_request", "ratio" (nginx/edgeserve, > 1: edgeserve runs fewer)}.
# Env: EDGE_BUILD_DIR (default build/), BENCH_SECONDS (10), BENCH_CONNECTIONS (8).
set -euo pipefail
conns="${BENCH_CONNECTIONS:-8}"
source "$(dirname "$0")/tls_bench_common.sh"
tls_bench_setup tls_instructions valgrind callgrind_control
if [ "$seconds" -lt 6 ]; then
    # The counters are zeroed 3 s into the run, after the handshakes: leave time to count.
    echo "tls_instructions.sh: BENCH_SECONDS must be at least 6, not $seconds" >&2
    exit 2
fi

# measure PID PORT COUNT_FUNCTION OUT: callgrind instructions per request of PID.
measure() {
    local pid=$1 port=$2 count=$3 out=$4 r0 r1 total
    callgrind_control -i on "$pid" >/dev/null
    wrk -t1 -c"$conns" -d"${seconds}s" "https://127.0.0.1:$port/v1/models" > "$work/wrk.txt" &
    local wrk_pid=$!
    sleep 3
    r0="$($count)"
    callgrind_control -z "$pid" >/dev/null
    wait "$wrk_pid"
    callgrind_control -d "$pid" >/dev/null
    r1="$($count)"
    total="$(grep -m1 '^totals:' "$out.1" | awk '{print $2}')"
    if [ $((r1 - r0)) -le 0 ]; then
        echo "tls_instructions.sh: no request was counted on port $port; nothing to divide" >&2
        exit 1
    fi
    awk -v t="$total" -v n=$((r1 - r0)) 'BEGIN {printf "%.0f %d\n", t / n, n}'
}

valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/edge.cg" \
    "$edgeserve" run --config "$work/edgeserve.yaml" 2>"$work/edgeserve.log" &
edge_pid=$!
pids+=("$edge_pid")
wait_port "$edge_port"
body="$(curl -sk "https://127.0.0.1:$edge_port/v1/models")"
edge_count() {
    curl -s "http://127.0.0.1:$admin_port/metrics" |
        awk '/^edgeserve_http_requests_total/ && /models/ {s += $NF} END {printf "%d", s}'
}
read -r edge_ir edge_n < <(measure "$edge_pid" "$edge_port" edge_count "$work/edge.cg")
kill "$edge_pid"

write_nginx_conf "$body" "master_process off;"
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/nginx.cg" \
    "$nginx_bin" -c "$work/nginx.conf" -p "$work/nginx" 2>"$work/nginx-valgrind.log" &
nginx_pid=$!
pids+=("$nginx_pid")
wait_port "$nginx_port"
nginx_body="$(curl -sk "https://127.0.0.1:$nginx_port/v1/models")"
[ "$body" = "$nginx_body" ] || { echo "tls_instructions: response bodies differ" >&2; exit 1; }
# stub_status counts its own request too: one per reading, so the difference is exact.
nginx_count() { curl -s "http://127.0.0.1:$status_port/status" | awk 'NR == 3 {print $3}'; }
read -r nginx_ir nginx_n < <(measure "$nginx_pid" "$nginx_port" nginx_count "$work/nginx.cg")
nginx_n=$((nginx_n - 1))
nginx_ir="$(awk -v ir="$nginx_ir" -v n="$nginx_n" 'BEGIN {printf "%.0f", ir * (n + 1) / n}')"

ratio="$(awk -v a="$nginx_ir" -v b="$edge_ir" 'BEGIN {printf "%.3f", a / b}')"
printf '%-34s %14s %10s\n' "server (GET /v1/models, TLS)" "instr/request" "requests"
printf '%-34s %14s %10s\n' "edgeserve, 1 I/O thread" "$edge_ir" "$edge_n"
printf '%-34s %14s %10s\n' "nginx, 1 worker" "$nginx_ir" "$nginx_n"
printf '%-34s %14s\n' "ratio nginx/edgeserve" "$ratio"
printf '{"bench":"tls_instructions","seconds":%s,"connections":%s,"edgeserve_instructions_per_request":%s,"nginx_instructions_per_request":%s,"ratio":%s}\n' \
    "$seconds" "$conns" "$edge_ir" "$nginx_ir" "$ratio"
