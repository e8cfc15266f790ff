# Sourced by bench/tls_vs_nginx.sh and bench/tls_instructions.sh: the set-up both share.
#   tls_bench_setup NAME TOOL...  checks the tools and the edgeserve build; makes $work (removed at
#                                 exit with every pid in $pids), free ports $edge_port,
#                                 $admin_port, $nginx_port, $status_port, a certificate and
#                                 $work/edgeserve.yaml (one I/O thread).
#   wait_port PORT                waits until GET /v1/models answers over TLS on PORT.
#   write_nginx_conf BODY [MAIN]  $work/nginx.conf: one worker serving BODY (the bytes edgeserve
#                                 sent) at /v1/models with the same certificate, stub_status on
#                                 $status_port; MAIN goes into nginx's main context.
# Sets: root, build, seconds, edgeserve, nginx_bin, work, pids, bench_name.

tls_bench_setup() {
    bench_name="$1"
    shift
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    build="${EDGE_BUILD_DIR:-$root/build}"
    seconds="${BENCH_SECONDS:-10}"
    edgeserve="$build/daemon/edgeserve"
    local tool
    for tool in wrk nginx openssl curl "$@"; do
        command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] ||
            { echo "$bench_name: $tool is missing (apt-get install it)" >&2; exit 1; }
    done
    nginx_bin="$(command -v nginx || echo /usr/sbin/nginx)"
    [ -x "$edgeserve" ] || { echo "$bench_name: build edgeserve first ($edgeserve)" >&2; exit 1; }

    work="$(mktemp -d)"
    pids=()
    trap tls_bench_cleanup EXIT
    edge_port="$(free_port)"; admin_port="$(free_port)"
    nginx_port="$(free_port)"; status_port="$(free_port)"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj /CN=localhost -addext subjectAltName=DNS:localhost \
        -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
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
}

tls_bench_cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() {
    for _ in $(seq 600); do
        curl -sk -o /dev/null "https://127.0.0.1:$1/v1/models" && return 0
        sleep 0.2
    done
    echo "$bench_name: nothing answers on port $1" >&2; exit 1
}

write_nginx_conf() {
    mkdir -p "$work/nginx"
    cat > "$work/nginx.conf" <<NGINX
worker_processes 1;
${2:-}
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
            return 200 '$1';
        }
    }
    server {
        listen 127.0.0.1:$status_port;
        location = /status { stub_status; }
    }
}
NGINX
}
