#!/bin/sh
# Capture the function_graph line forms the NFS captures (capture_fixtures.sh) do not show:
# the `$` overhead mark (a call over 1 s), sleep-time/graph-time off, `(Overruns: N)`,
# layouts without the cpu or duration column, funcgraph-args/-retaddr/-retval where the
# kernel has them. The relative-time column comes only from the latency tracers (irqsoff,
# wakeup) with display-graph: available_tracers records whether the kernel has any.
# Plain writes to tracefs, no probekit code. Runs inside a lab guest as root, needs no NFS.
# Usage: capture_more_forms.sh OUTDIR
# Writes OUTDIR/<function>.<options>.{trace,trace_options,set_graph_function}, plus
# options.ls (the option files this kernel has), available_tracers and irqentry.txt
# (traceable functions inside __irqentry_text: the only ones that get ==========> markers).
# Every tracefs setting it changes is put back on exit, Ctrl-C and SIGTERM.
set -eu
out=${1:?usage: capture_more_forms.sh OUTDIR}
. "$(dirname "$0")/tracefs_state.sh"
capture_dir "$out"

ls "$T/options" > "$out/options.ls"
cat "$T/available_tracers" > "$out/available_tracers"
# ==========> / <========== are printed only for functions inside __irqentry_text
start=$(awk '$3 == "__irqentry_text_start" {print $1}' /proc/kallsyms)
end=$(awk '$3 == "__irqentry_text_end" {print $1}' /proc/kallsyms)
{
    echo "__irqentry_text_start=$start __irqentry_text_end=$end"
    awk -v s="$start" -v e="$end" '$1 >= s && $1 < e && $1 != s {print $3}' /proc/kallsyms |
        sort -u > /tmp/irqentry.syms
    echo "symbols in the section: $(wc -l < /tmp/irqentry.syms)"
    echo "of them in available_filter_functions:"
    sed -e 's/ .*//' "$T/available_filter_functions" | sort -u | comm -12 - /tmp/irqentry.syms
} > "$out/irqentry.txt"
rm -f /tmp/irqentry.syms

opt() { echo "$1" > "$T/trace_options"; }
GRAPH_DEFAULTS="funcgraph-cpu funcgraph-overhead nofuncgraph-proc funcgraph-duration nofuncgraph-abstime
funcgraph-irqs nofuncgraph-tail nofuncgraph-overrun sleep-time graph-time nofuncgraph-retval
nofuncgraph-retval-hex nofuncgraph-args nofuncgraph-retaddr nolatency-format"
defaults() {
    for o in $GRAPH_DEFAULTS; do echo "$o" > "$T/trace_options" 2>/dev/null || true; done
}
first_of() {  # the first of the given functions this kernel can trace
    for f in "$@"; do
        if grep -q "^$f\$" "$T/available_filter_functions"; then echo "$f"; return; fi
    done
    echo "none of $* is traceable" >&2; exit 1
}
# capture FUNC LABEL COMMAND...: trace COMMAND under FUNC, store `cat trace` untouched
capture() {
    func=$1; label=$2; shift 2
    name=$func.$label
    echo 0 > "$T/tracing_on"
    : > "$T/trace"
    echo "$func" > "$T/set_graph_function"
    echo 1 > "$T/tracing_on"
    "$@"
    echo 0 > "$T/tracing_on"
    cat "$T/trace" > "$out/$name.trace"
    cat "$T/set_graph_function" > "$out/$name.set_graph_function"
    cat "$T/trace_options" > "$out/$name.trace_options"
    echo "$name: $(wc -c < "$out/$name.trace") bytes"
}
sleep_long() { sleep 1.2; }
reads() { for i in 1 2 3; do cat /etc/os-release > /dev/null; done; }

nsleep=$(first_of hrtimer_nanosleep do_nanosleep common_nsleep)
echo 0 > "$T/tracing_on"
echo function_graph > "$T/current_tracer"
saved_graph_options=$(cat "$T/trace_options")
defaults

# a call over 1 s: `$` (sleep-time on, the default, counts the time asleep)
capture "$nsleep" default sleep_long
opt nosleep-time; capture "$nsleep" nosleep-time sleep_long; defaults
# graph-time exists only with CONFIG_FUNCTION_PROFILER
if [ -e "$T/options/graph-time" ]; then
    opt nograph-time; capture "$nsleep" nograph-time sleep_long; defaults
fi
# column layouts
opt funcgraph-overrun;    capture vfs_read overrun reads;    defaults
opt nofuncgraph-cpu;      capture vfs_read nocpu reads;      defaults
opt nofuncgraph-duration; capture vfs_read noduration reads; defaults
opt nofuncgraph-cpu; opt nofuncgraph-duration; opt funcgraph-proc
capture vfs_read nocpu-noduration-proc reads; defaults
# newer kernels' extras, each only if the option file exists
for o in funcgraph-args funcgraph-retaddr funcgraph-retval; do
    if [ -e "$T/options/$o" ]; then opt "$o"; capture vfs_read "${o#funcgraph-}" reads; defaults; fi
done
