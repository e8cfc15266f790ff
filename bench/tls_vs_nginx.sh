#!/usr/bin/env bash
# TLS keep-alive throughput of GET /v1/models: edgeserve on one I/O thread against nginx with one
# worker, same certificate, same response bytes, both measured with wrk in the same run.
# The two servers are measured in alternating rounds (BENCH_ROUNDS, default 3, of BENCH_SECONDS
# each) so that a change in the machine's load hits both alike; the figures are the medians of the
# rounds, and the ratio is the median of the per-round ratios.
# Prints a table, then (last line) one JSON object: {"edgeserve_rps", "nginx_rps", "ratio"}.
# Env: EDGE_BUILD_DIR (default build/), BENCH_SECONDS (10), BENCH_CONNECTIONS (32),
# BENCH_ROUNDS (3).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${EDGE_BUILD_DIR:-$root/build}"
seconds="${BENCH_SECONDS:-10}"
conns="${BENCH_CONNECTIONS:-32}"
rounds="${BENCH_ROUNDS:-3}"
edgeserve="$build/daemon/edgeserve"
for tool in wrk nginx openssl curl; do
    command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] ||
        { echo "tls_vs_nginx: $tool is missing (deploy/setup installs it)" >&2; exit 1; }
done
nginx_bin="$(command -v nginx || echo /usr/sbin/nginx)"
[ -x "$edgeserve" ] || { echo "tls_vs_nginx: build edgeserve first ($edgeserve)" >&2; exit 1; }

work="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
edge_port="$(free_port)"; admin_port="$(free_port)"; nginx_port="$(free_port)"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null

cat > "$work/edgeserve.yaml" <<YAML
listeners:
  public:
    address: 127.0.0.1
    port: $edge_port
    io_threads: 1
    certificates: [{server_names: [localhost], cert: $work/cert.pem, key: $work/key.pem}]
  admin: {address: 127.0.0.1, port: $admin_port}
site: {id: bench}
log: {level: error}
YAML
"$edgeserve" run --config "$work/edgeserve.yaml" 2>"$work/edgeserve.log" &
pids+=($!)

wait_port() {
    for _ in $(seq 100); do
        curl -sk -o /dev/null "https://127.0.0.1:$1/v1/models" && return 0
        sleep 0.1
    done
    echo "tls_vs_nginx: nothing answers on port $1" >&2; exit 1
}
wait_port "$edge_port"
body="$(curl -sk "https://127.0.0.1:$edge_port/v1/models")"

mkdir -p "$work/nginx"
cat > "$work/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx-error.log error;
events { worker_connections 4096; }
http {
    access_log off;
    server_tokens off;
    client_body_temp_path $work/nginx;
    keepalive_requests 100000000;
    server {
        listen 127.0.0.1:$nginx_port ssl;
        ssl_certificate $work/cert.pem;
        ssl_certificate_key $work/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        location = /v1/models {
            default_type application/json;
            return 200 '$body';
        }
    }
}
NGINX
"$nginx_bin" -c "$work/nginx.conf" -p "$work/nginx" 2>>"$work/nginx-error.log" &
pids+=($!)
wait_port "$nginx_port"
nginx_body="$(curl -sk "https://127.0.0.1:$nginx_port/v1/models")"
[ "$body" = "$nginx_body" ] || { echo "tls_vs_nginx: response bodies differ" >&2; exit 1; }

run_wrk() {
    wrk -t1 -c"$conns" -d"${seconds}s" "https://127.0.0.1:$1/v1/models" > "$work/wrk-$2.txt"
    awk '/^Requests\/sec:/ {print $2}' "$work/wrk-$2.txt"
}
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
edge_all=(); nginx_all=(); ratio_all=()
for round in $(seq "$rounds"); do
    e="$(run_wrk "$edge_port" edgeserve)"
    n="$(run_wrk "$nginx_port" nginx)"
    edge_all+=("$e"); nginx_all+=("$n")
    ratio_all+=("$(awk -v a="$e" -v b="$n" 'BEGIN {printf "%.4f", a / b}')")
    echo "round $round: edgeserve $e nginx $n" >&2
done
edge_rps="$(printf '%s\n' "${edge_all[@]}" | median)"
nginx_rps="$(printf '%s\n' "${nginx_all[@]}" | median)"
ratio="$(printf '%s\n' "${ratio_all[@]}" | median)"
ratio="$(awk -v r="$ratio" 'BEGIN {printf "%.3f", r}')"

printf '%-28s %14s\n' "server (GET /v1/models, TLS)" "requests/s"
printf '%-28s %14s\n' "edgeserve, 1 I/O thread" "$edge_rps"
printf '%-28s %14s\n' "nginx, 1 worker" "$nginx_rps"
printf '%-28s %14s\n' "ratio edgeserve/nginx" "$ratio"
printf '{"bench":"tls_vs_nginx","seconds":%s,"rounds":%s,"connections":%s,"edgeserve_rps":%s,"nginx_rps":%s,"ratio":%s}\n' \
    "$seconds" "$rounds" "$conns" "$edge_rps" "$nginx_rps" "$ratio"
