#!/usr/bin/env bash
# Usage: isa_objects_check.sh SOURCE_NAME... -- OBJECT...
# Fails if the object of any named source (a per-ISA kernel file compiled with ISA flags,
# engine/CMakeLists.txt) defines a weak or unique symbol: an out-of-line copy of an inline
# function or template (std::vector's members, a shared header's helper) compiled with those
# flags may be the one the linker keeps for the whole program, which then faults on a CPU without
# that ISA. Such files take their scratch from cpu::kernel_scratch and call only builtins and
# static or always-inline helpers. Not counted: sanitizer symbols and DW.ref.* (a data pointer to
# the exception personality routine that instrumented builds emit, not code).
set -euo pipefail
names=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
    names+=("$1")
    shift
done
[[ $# -gt 0 ]] && shift
[[ ${#names[@]} -gt 0 ]] || { echo "isa_objects_check: no source names given" >&2; exit 2; }
status=0
for name in "${names[@]}"; do
    obj=""
    for o in "$@"; do
        [[ "$o" == */"$name".o || "$o" == */"$name".obj ]] && obj="$o"
    done
    if [[ -z "$obj" ]]; then
        echo "isa_objects_check: no object for $name among the target's objects" >&2
        status=1
        continue
    fi
    weak=$(nm -C --defined-only "$obj" | awk '$2 ~ /^[WVu]$/' |
        grep -Ev ' (_*(asan|ubsan|sancov|odr_asan|tsan|msan)|DW\.ref\.)' || true)
    if [[ -n "$weak" ]]; then
        echo "$name: defines weak symbols compiled with its ISA flags:" >&2
        echo "$weak" >&2
        status=1
    else
        echo "$name: no weak symbols"
    fi
done
exit $status
