#!/usr/bin/env bash
# Side by side on loopback: N (default 20) HashiCorp serf agents (Debian package `serf`, built on
# memberlist) and N edgeserve gossip members (bench_gossip_node), both with memberlist's LAN
# timers and AES-GCM encryption. For each system it prints the time until every other member
# marks a SIGKILLed member failed, the time for a tag / site-state change to reach every member,
# and the bytes each member sends per second in steady state (sendto/sendmsg/write/writev on its
# sockets, counted with strace over the same window for both), with edgeserve/serf ratios
# (lower is better). Readable table, then one JSON line.
#
#   bench/gossip_vs_serf.sh [BUILD_DIR]      (env N=20 WINDOW=10)
set -euo pipefail

BUILD=${1:-build}
N=${N:-20}
WINDOW=${WINDOW:-10}
# Member 7 is killed and member 3 changes its tags: at least 8 members, and serf's RPC ports
# (27000 + 1000 + i) must stay below edgeserve's (29000).
if ! [[ "$N" =~ ^[0-9]+$ ]] || [ "$N" -lt 8 ] || [ "$N" -gt 999 ]; then
    echo "gossip_vs_serf.sh: N must be 8..999, not '$N'" >&2
    exit 2
fi
NODE="$BUILD/bench/bench_gossip_node"
for tool in serf strace "$NODE"; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

now_us() { date +%s%6N; }
KEY_B64=$(head -c 32 /dev/urandom | base64)
KEY_HEX=$(echo "$KEY_B64" | base64 -d | od -An -tx1 | tr -d ' \n')
SERF_BASE=${SERF_BASE:-27000}
EDGE_BASE=${EDGE_BASE:-29000}

cat > "$WORK/handler.sh" <<'H'
#!/bin/sh
t=$(date +%s%6N)
while read -r name rest; do
    echo "t=$t event=$SERF_EVENT member=$name" >> "$EVENT_LOG"
done
H
chmod +x "$WORK/handler.sh"

declare -a SERF_PID EDGE_PID
for i in $(seq 0 $((N - 1))); do
    join=()
    [ "$i" -gt 0 ] && join=(-join "127.0.0.1:$SERF_BASE")
    EVENT_LOG="$WORK/serf_$i.events" serf agent -node "s$i" -bind "127.0.0.1:$((SERF_BASE + i))" \
        -rpc-addr "127.0.0.1:$((SERF_BASE + 1000 + i))" -profile lan -encrypt "$KEY_B64" \
        -event-handler "$WORK/handler.sh" -log-level warn "${join[@]}" \
        > "$WORK/serf_$i.log" 2>&1 &
    SERF_PID[$i]=$!
    PIDS+=($!)
    join=()
    [ "$i" -gt 0 ] && join=(--join "127.0.0.1:$EDGE_BASE")
    "$NODE" --name "e$i" --bind "127.0.0.1:$((EDGE_BASE + i))" --key "$KEY_HEX" "${join[@]}" \
        > "$WORK/edge_$i.log" 2>&1 &
    EDGE_PID[$i]=$!
    PIDS+=($!)
    sleep 0.05
done

serf_alive() { serf members -rpc-addr "127.0.0.1:$((SERF_BASE + 1000 + $1))" -status alive 2>/dev/null | wc -l; }
edge_alive() { grep -o 'alive=[0-9]*' "$WORK/edge_$1.log" 2>/dev/null | tail -1 | cut -d= -f2; }
deadline=$(( $(date +%s) + 60 ))
until [ "$(serf_alive 0)" -eq "$N" ] && [ "$(serf_alive $((N - 1)))" -eq "$N" ] &&
      [ "$(edge_alive 0)" = "$N" ] && [ "$(edge_alive $((N - 1)))" = "$N" ]; do
    [ "$(date +%s)" -gt "$deadline" ] && { echo "clusters did not converge" >&2; exit 1; }
    sleep 0.5
done
sleep 5  # let join traffic settle

# Steady-state bytes: strace every member of both clusters over the same window.
count_bytes() {  # file -> bytes written to UDP/TCP sockets
    grep -E '(UDP|TCP|UDPv6|TCPv6):' "$1" | grep -oE '= [0-9]+$' | awk '{s += $2} END {print s + 0}'
}
for i in $(seq 0 $((N - 1))); do
    strace -f -qq -yy -e trace=sendto,sendmsg,write,writev -p "${SERF_PID[$i]}" \
        -o "$WORK/serf_$i.strace" 2>/dev/null &
    PIDS+=($!)
    strace -f -qq -yy -e trace=sendto,sendmsg,write,writev -p "${EDGE_PID[$i]}" \
        -o "$WORK/edge_$i.strace" 2>/dev/null &
    PIDS+=($!)
done
sleep "$WINDOW"
for p in $(jobs -p); do
    case " ${SERF_PID[*]} ${EDGE_PID[*]} " in *" $p "*) ;; *) kill "$p" 2>/dev/null || true ;; esac
done
sleep 1
serf_bytes=0; edge_bytes=0
for i in $(seq 0 $((N - 1))); do
    serf_bytes=$((serf_bytes + $(count_bytes "$WORK/serf_$i.strace")))
    edge_bytes=$((edge_bytes + $(count_bytes "$WORK/edge_$i.strace")))
done
serf_bps=$(awk -v b="$serf_bytes" -v n="$N" -v w="$WINDOW" 'BEGIN {printf "%.1f", b / n / w}')
edge_bps=$(awk -v b="$edge_bytes" -v n="$N" -v w="$WINDOW" 'BEGIN {printf "%.1f", b / n / w}')

# Time until all others see an event about `member` after `since`; empty if not everyone did.
spread_time() {  # system event member since skip1 skip2
    local sys=$1 ev=$2 member=$3 since=$4 worst=0 t
    for i in $(seq 0 $((N - 1))); do
        [ "$i" = "$5" ] || [ "$i" = "$6" ] && continue
        if [ "$sys" = serf ]; then f="$WORK/serf_$i.events"; else f="$WORK/edge_$i.log"; fi
        t=$(grep -E "event=$ev member=$member\$" "$f" 2>/dev/null |
            awk -v s="$since" -F'[ =]' '$2 > s {print $2; exit}')
        [ -z "$t" ] && { echo ""; return; }
        [ "$((t - since))" -gt "$worst" ] && worst=$((t - since))
    done
    awk -v w="$worst" 'BEGIN {printf "%.3f", w / 1e6}'
}
wait_spread() {  # same args; polls up to 90 s
    local r="" end=$(( $(date +%s) + 90 ))
    while [ -z "$r" ] && [ "$(date +%s)" -le "$end" ]; do
        r=$(spread_time "$@"); [ -z "$r" ] && sleep 0.2
    done
    echo "${r:-null}"
}

VICTIM=7
CHANGER=3
t0=$(now_us)
kill -9 "${SERF_PID[$VICTIM]}" "${EDGE_PID[$VICTIM]}"
serf_detect=$(wait_spread serf member-failed "s$VICTIM" "$t0" "$VICTIM" -1)
edge_detect=$(wait_spread edge dead "e$VICTIM" "$t0" "$VICTIM" -1)

t1=$(now_us)
serf tags -rpc-addr "127.0.0.1:$((SERF_BASE + 1000 + CHANGER))" -set role=changed >/dev/null
kill -USR1 "${EDGE_PID[$CHANGER]}"
serf_change=$(wait_spread serf member-update "s$CHANGER" "$t1" "$VICTIM" "$CHANGER")
edge_change=$(wait_spread edge update "e$CHANGER" "$t1" "$VICTIM" "$CHANGER")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0 && a == a + 0) printf "%.3f", a / b; else print "null"}'; }
printf "%-34s %12s %12s %8s\n" "figure (N=$N, LAN timers)" "serf" "edgeserve" "ratio"
printf "%-34s %12s %12s %8s\n" "failure seen by all others (s)" "$serf_detect" "$edge_detect" \
    "$(ratio "$edge_detect" "$serf_detect")"
printf "%-34s %12s %12s %8s\n" "state/tag change reaches all (s)" "$serf_change" "$edge_change" \
    "$(ratio "$edge_change" "$serf_change")"
printf "%-34s %12s %12s %8s\n" "bytes sent per member per s" "$serf_bps" "$edge_bps" \
    "$(ratio "$edge_bps" "$serf_bps")"
printf '{"bench":"gossip_vs_serf","n":%d,"serf_detect_s":%s,"edge_detect_s":%s,"detect_ratio":%s,"serf_change_s":%s,"edge_change_s":%s,"change_ratio":%s,"serf_bytes_per_member_s":%s,"edge_bytes_per_member_s":%s,"bytes_ratio":%s}\n' \
    "$N" "$serf_detect" "$edge_detect" "$(ratio "$edge_detect" "$serf_detect")" \
    "$serf_change" "$edge_change" "$(ratio "$edge_change" "$serf_change")" \
    "$serf_bps" "$edge_bps" "$(ratio "$edge_bps" "$serf_bps")"
