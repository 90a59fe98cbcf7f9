#!/bin/sh
# Capture function_graph output of long-lived threads that sleep and are moved between
# CPUs while asleep, with no proc column (issue 14's situations 2 and 5). With one traced
# thread no CPU prints a context-switch banner after its first line, so nothing in the
# text says which call a line on another CPU continues; with two, the banners name them.
# Plain tracefs writes and a Python workload (migrating_sleepers.py, no probekit code);
# needs 2 vCPUs. For T in 1 and 2 threads, N in 1..REPEATS:
#   whole.depth2-noirqs.TtN.trace  max_graph_depth 2, nofuncgraph-irqs; tracing on before
#                                  the sleeps start and off after they end (situation 2)
#   cut.irqs.TtN.trace             interrupts shown; tracing turned on and off while the
#                                  threads sleep, so calls are cut at the end, and callees
#                                  of calls begun before the start show
#   overwrite.irqs.N.trace         two `dd` from /dev/zero, one pinned to each CPU, under
#                                  set_graph_function vfs_read in a 16 KB per-CPU buffer
#                                  that keeps overwriting: each CPU's text begins at its
#                                  own oldest kept event, inside a call, while the other
#                                  CPU's call is open (situation 5: no call migrates)
#   overwrite.depth3-irqs.N.trace  the same under set_graph_function read_zero with
#                                  max_graph_depth 3: an interrupt is one open frame
# plus .stats beside each, and .truth.json (the calls made, by the workload's own clock)
# beside each sleeper capture.
# Usage: capture_migration_cases.sh OUTDIR [REPEATS] [SNAPSHOTS]
# Every tracefs setting it changes is put back on exit, Ctrl-C and SIGTERM.
set -eu
out=${1:?usage: capture_migration_cases.sh OUTDIR [REPEATS] [SNAPSHOTS]}
repeats=${2:-3}
snapshots=${3:-20}
here=$(dirname "$0")
. "$here/tracefs_state.sh"
capture_dir "$out"

capture() {
    name=$1 mode=$2 threads=$3
    : > "$T/trace"
    python3 "$here/migrating_sleepers.py" "$T" "$mode" "$threads" "$out/$name.truth.json"
    save_capture "$out" "$name"
    echo "$name: $(wc -l < "$out/$name.trace") lines"
}

echo 0 > "$T/tracing_on"
echo 8192 > "$T/buffer_size_kb"
echo hrtimer_nanosleep > "$T/set_graph_function"
echo function_graph > "$T/current_tracer"
saved_graph_options=$(cat "$T/trace_options")

for threads in 1 2; do
    i=1
    while [ $i -le "$repeats" ]; do
        echo 2 > "$T/max_graph_depth"
        echo nofuncgraph-irqs > "$T/trace_options"
        capture "whole.depth2-noirqs.${threads}t$i" whole "$threads"
        echo 0 > "$T/max_graph_depth"
        echo funcgraph-irqs > "$T/trace_options"
        capture "cut.irqs.${threads}t$i" cut "$threads"
        i=$((i + 1))
    done
done

echo 16 > "$T/buffer_size_kb"
taskset -c 0 dd if=/dev/zero of=/dev/null bs=256k status=none & dd0=$!
taskset -c 1 dd if=/dev/zero of=/dev/null bs=256k status=none & dd1=$!
trap 'kill $dd0 $dd1 2>/dev/null || true; restore' EXIT
echo "$dd0 $dd1" > "$T/set_ftrace_pid"
snapshot() {
    name=$1
    i=1
    while [ $i -le "$snapshots" ]; do
        : > "$T/trace"
        echo 1 > "$T/tracing_on"
        sleep 0.3
        echo 0 > "$T/tracing_on"
        save_capture "$out" "$name.$i"
        i=$((i + 1))
    done
    echo "$name: $snapshots snapshots"
}
echo 0 > "$T/max_graph_depth"
echo vfs_read > "$T/set_graph_function"
snapshot overwrite.irqs
echo 3 > "$T/max_graph_depth"
echo read_zero > "$T/set_graph_function"
snapshot overwrite.depth3-irqs

