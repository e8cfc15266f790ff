#!/usr/bin/env bash
# Starts the real edgeserve binary on 127.0.0.1 (ephemeral ports, a certificate and a tenant key made
# here) serving the fortunes fixture, runs openai_client.mjs against it with the official OpenAI
# Node client, then stops the daemon with SIGTERM and expects exit 0.
# Usage: run_openai_client.sh EDGESERVE_BINARY
set -euo pipefail
bin="$1"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
if ! command -v node >/dev/null || [ ! -d "$here/node_modules/openai" ]; then
    echo "SKIP: node or the openai package is missing (deploy/test installs it with npm)"
    exit 0
fi
work="$(mktemp -d)"
pid=""
cleanup() {
    if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
key="sk-test-$(openssl rand -hex 16)"
# A YAML single-quoted scalar: a checkout under "/home/me/my #1 demo" stays one path.
q="'"
model_path="'${root//$q/$q$q}/tests/fixtures/fortunes-qwen3-moe'"
hash="$(printf '%s' "$key" | openssl dgst -sha256 -r | cut -d' ' -f1)"
cat > "$work/edgeserve.yaml" <<YAML
listeners:
  public:
    address: 127.0.0.1
    port: 0
    certificates:
      - server_names: [localhost]
        cert: $work/cert.pem
        key: $work/key.pem
  admin:
    address: 127.0.0.1
    port: 0
site:
  id: test
  region: local
  latitude: 0
  longitude: 0
models:
  - name: fortunes
    path: $model_path
engine:
  threads: 2
tenants:
  - name: tester
    api_key_sha256: [$hash]
YAML
"$bin" run --config "$work/edgeserve.yaml" 2>"$work/log" &
pid=$!
port=""
for _ in $(seq 1 600); do
    port="$(grep -o '"public_port":[0-9]*' "$work/log" | head -1 | cut -d: -f2 || true)"
    [ -n "$port" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then cat "$work/log"; echo "edgeserve exited early"; exit 1; fi
    sleep 0.1
done
[ -n "$port" ] || { cat "$work/log"; echo "edgeserve did not start listening"; exit 1; }
status=0
NODE_EXTRA_CA_CERTS="$work/cert.pem" node "$here/openai_client.mjs" \
    "https://localhost:$port/v1" "$key" fortunes || status=$?
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
if [ "$rc" != 0 ]; then echo "edgeserve exited $rc after SIGTERM"; tail -20 "$work/log"; status=1; fi
if grep -q "$key" "$work/log"; then echo "the API key appeared in the log"; status=1; fi
exit $status
