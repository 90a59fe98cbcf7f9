#!/bin/sh
# Capture real function_graph traces of the NFS workload under several tracer option
# mixes, with plain writes to tracefs (no probekit code involved), for parser tests.
# Runs inside a lab guest as root, NFSv3 on /mnt/nfs3 and NFSv4.2 on /mnt/nfs42.
# Usage: capture_fixtures.sh OUTDIR
# Writes OUTDIR/<mount>.<function>.<options>.{trace,trace_options,stats,set_graph_function}
# Every tracefs setting it changes is put back on exit, Ctrl-C and SIGTERM.
# function_graph is enabled ONCE; captures only change options and set_graph_function
# (switching tracers back and forth has hung a TCG guest).
set -eu
out=${1:?usage: capture_fixtures.sh OUTDIR}
. "$(dirname "$0")/tracefs_state.sh"
capture_dir "$out"

opt() { echo "$1" > "$T/trace_options"; }   # opt funcgraph-proc | opt nofuncgraph-proc
# function_graph's option defaults as the kernel boots with them (its options are listed in
# trace_options only while it is the current tracer, so they are set explicitly)
GRAPH_DEFAULTS="funcgraph-cpu funcgraph-overhead nofuncgraph-proc funcgraph-duration nofuncgraph-abstime
funcgraph-irqs nofuncgraph-tail nofuncgraph-overrun sleep-time graph-time nofuncgraph-retval nolatency-format"
defaults() {
    for o in $GRAPH_DEFAULTS; do echo "$o" > "$T/trace_options" 2>/dev/null || true; done
    echo 0 > "$T/events/enable"
    echo "$saved_buffer" > "$T/buffer_size_kb"
}

# --- the workload (labs/checks/workload.sh), 128 KiB per file: each trace stays under 2 MB
here=$(cd "$(dirname "$0")" && pwd)
export PROBEKIT_WORKLOAD_BLOCKS=2
prepare() { sh "$here/../checks/workload.sh" prepare "$1"; }
workload() { sh "$here/../checks/workload.sh" all "$1"; }

# capture MOUNT FUNCS OPTIONS_LABEL [STEP]: one traced workload (all steps, or one),
# `cat trace` stored untouched
capture() {
    mnt=$1; funcs=$2; label=$3; step=${4:-all}
    name=$(basename "$mnt").$(echo "$funcs" | cut -d' ' -f1).$label
    echo 0 > "$T/tracing_on"
    : > "$T/trace"
    echo "$funcs" > "$T/set_graph_function"
    echo 1 > "$T/tracing_on"
    sh "$here/../checks/workload.sh" "$step" "$mnt"
    echo 0 > "$T/tracing_on"
    cat "$T/trace" > "$out/$name.trace"
    cat "$T/set_graph_function" > "$out/$name.set_graph_function"
    cat "$T/trace_options" > "$out/$name.trace_options"
    for c in "$T"/per_cpu/cpu*; do echo "## $(basename "$c")"; cat "$c/stats"; done > "$out/$name.stats"
    echo "$name: $(wc -c < "$out/$name.trace") bytes"
}

for m in /mnt/nfs3 /mnt/nfs42; do prepare "$m"; done
open_fn=nfs_file_open
grep -qx 'nfs4_file_open \[nfsv4\]' "$T/available_filter_functions" && v4_open=nfs4_file_open || v4_open=$open_fn

echo 0 > "$T/tracing_on"
echo function_graph > "$T/current_tracer"
saved_graph_options=$(cat "$T/trace_options")
defaults

# kernel defaults
capture /mnt/nfs3 nfs_file_read default
capture /mnt/nfs3 nfs_file_write default
capture /mnt/nfs3 nfs_getattr default
capture /mnt/nfs3 $open_fn default
capture /mnt/nfs42 $v4_open default
capture /mnt/nfs42 nfs_file_write default

# one option at a time
opt funcgraph-proc;     capture /mnt/nfs3 nfs_file_read proc;      defaults
opt funcgraph-abstime;  capture /mnt/nfs42 nfs_file_read abstime;  defaults
opt funcgraph-tail;     capture /mnt/nfs3 nfs_getattr tail;        defaults
opt funcgraph-irqs;     capture /mnt/nfs3 nfs_file_write irqs;     defaults
opt latency-format;     capture /mnt/nfs3 nfs_file_read latency;   defaults
opt funcgraph-proc; opt funcgraph-abstime; opt funcgraph-tail
capture /mnt/nfs42 nfs_file_write proc-abstime-tail; defaults

# several traced tasks on one CPU: client reads and the server's nfsd threads
capture /mnt/nfs3 "nfs_file_read nfsd_read" ctxsw-nfsd_read read

# NFS tracepoints enabled beside the graph: they appear as /* event */ comment lines
for ev in nfs_getattr_enter nfs_getattr_exit; do
    if [ -e "$T/events/nfs/$ev/enable" ]; then echo 1 > "$T/events/nfs/$ev/enable"; fi
done
capture /mnt/nfs3 nfs_getattr events-nfs_getattr
capture /mnt/nfs42 nfs_getattr events-nfs_getattr
defaults
echo 1 > "$T/events/nfs/enable"
capture /mnt/nfs3 nfs_file_write events-nfs
defaults

# a deliberately tiny ring buffer: overruns, and [LOST N EVENTS] on the consuming reader
echo 4 > "$T/buffer_size_kb"
capture /mnt/nfs3 nfs_file_write tinybuf
: > "$T/trace"
echo nfs_file_write > "$T/set_graph_function"
echo 1 > "$T/tracing_on"
workload /mnt/nfs3
echo 0 > "$T/tracing_on"
timeout 5 cat "$T/trace_pipe" > "$out/nfs3.nfs_file_write.tinybuf-trace_pipe.trace" || true
echo "nfs3.nfs_file_write.tinybuf-trace_pipe: $(wc -c < "$out/nfs3.nfs_file_write.tinybuf-trace_pipe.trace") bytes"
defaults

# return values (kernels >= 6.5)
if [ -e "$T/options/funcgraph-retval" ]; then
    opt funcgraph-retval; capture /mnt/nfs3 nfs_file_read retval; defaults
fi

# trace-cmd last, from the restored state (it sets the tracer up and tears it down itself)
restore
trap - EXIT
if command -v trace-cmd > /dev/null; then
    sync; echo 3 > /proc/sys/vm/drop_caches
    ( cd /tmp && trace-cmd record -q -p function_graph -g nfs_file_read -o /tmp/fixture.dat \
        dd if=/mnt/nfs3/work/probekit/read.bin of=/dev/null bs=64k status=none > /dev/null )
    trace-cmd report -i /tmp/fixture.dat > "$out/nfs3.nfs_file_read.trace-cmd.trace"
    rm -f /tmp/fixture.dat
    echo "nfs3.nfs_file_read.trace-cmd: $(wc -c < "$out/nfs3.nfs_file_read.trace-cmd.trace") bytes"
fi
