#!/bin/sh
# Capture function_graph output of tasks migrating between CPUs without a proc column
# (issue 14's situations 2 and 5), with a known number of calls: two parallel loops of
# `sleep 0.01` under set_ftrace_pid (this shell, function-fork on), so hrtimer_nanosleep
# runs exactly once per sleep (2 x LOOPS) and its tasks wake on either CPU.
# Needs a guest with 2 vCPUs. Plain tracefs writes, no probekit code.
#   migrate.depth2-noirqs.trace  max_graph_depth 2, funcgraph-irqs off (situation 2)
#   migrate.irqs.trace           no depth limit, interrupts shown (situation 5)
# plus .trace_options, .stats (per_cpu/cpu*/stats) and calls.txt (the sleeps made).
# Usage: capture_smp_cases.sh OUTDIR [LOOPS]
# Every tracefs setting it changes is put back on exit, Ctrl-C and SIGTERM.
set -eu
out=${1:?usage: capture_smp_cases.sh OUTDIR [LOOPS]}
loops=${2:-40}
here=$(dirname "$0")
. "$here/tracefs_state.sh"
capture_dir "$out"

sleeps() {
    i=0; while [ $i -lt "$loops" ]; do sleep 0.01; i=$((i + 1)); done &
    j=0; while [ $j -lt "$loops" ]; do sleep 0.01; j=$((j + 1)); done
    wait
}
capture() {
    name=$1
    : > "$T/trace"
    echo 1 > "$T/tracing_on"
    sleeps
    echo 0 > "$T/tracing_on"
    save_capture "$out" "$name"
    echo "$name: $(wc -l < "$out/$name.trace") lines"
}

echo 0 > "$T/tracing_on"
echo 8192 > "$T/buffer_size_kb"
echo hrtimer_nanosleep > "$T/set_graph_function"
echo 1 > "$T/options/function-fork"
echo $$ > "$T/set_ftrace_pid"
echo function_graph > "$T/current_tracer"
saved_graph_options=$(cat "$T/trace_options")

echo 2 > "$T/max_graph_depth"
echo nofuncgraph-irqs > "$T/trace_options"
capture migrate.depth2-noirqs
echo 0 > "$T/max_graph_depth"
echo funcgraph-irqs > "$T/trace_options"
capture migrate.irqs
echo "each capture: $((2 * loops)) sleeps, so $((2 * loops)) calls of hrtimer_nanosleep" > "$out/calls.txt"

echo 0 > "$T/options/function-fork"
