#!/bin/sh
# Capture real function_graph output of the parser situations issue 14 names that a
# 1-vCPU lab guest can show (plain writes to tracefs and trace-cmd, no probekit code):
#   start-in-irq.N.trace  `cat trace` of a 4 KB ring buffer that kept overwriting while
#                         nfs_file_read calls and timer interrupts ran: whichever snapshots
#                         begin inside an interrupt are the buffer-starts-in-an-interrupt case
#                         (the host picks them; every snapshot is kept)
#   trace-cmd-l.trace     `trace-cmd report -l` (latency format) of
#                         `trace-cmd record -p function_graph -g nfs_file_read` around a read;
#   trace-cmd.trace       `trace-cmd report` of the same trace.dat, for comparison
# Runs inside a lab guest as root. Usage: capture_parser_cases.sh OUTDIR MOUNT
# Every tracefs setting it changes is put back on exit, Ctrl-C and SIGTERM.
set -eu
out=${1:?usage: capture_parser_cases.sh OUTDIR MOUNT}
mount=${2:?usage: capture_parser_cases.sh OUTDIR MOUNT}
here=$(dirname "$0")
. "$here/tracefs_state.sh"
capture_dir "$out"
sh "$here/../checks/workload.sh" prepare "$mount"

# -- a small overwriting buffer, snapshots taken without switching the tracer again
echo 0 > "$T/tracing_on"
echo 4 > "$T/buffer_size_kb"
echo nfs_file_read > "$T/set_graph_function"
echo function_graph > "$T/current_tracer"
saved_graph_options=$(cat "$T/trace_options")
cat "$T/trace_options" > "$out/start-in-irq.trace_options"
i=1
while [ $i -le 6 ]; do
    : > "$T/trace"
    echo 1 > "$T/tracing_on"
    sh "$here/../checks/workload.sh" read "$mount"
    echo 0 > "$T/tracing_on"
    cat "$T/trace" > "$out/start-in-irq.$i.trace"
    cat "$T/per_cpu/cpu0/stats" > "$out/start-in-irq.$i.stats"
    i=$((i + 1))
done
# back to the tracer and buffer trace-cmd would find on a quiet machine (the exit trap
# restores everything once more at the end)
for opt in $saved_graph_options; do echo "$opt" > "$T/trace_options" 2>/dev/null || true; done
echo nop > "$T/current_tracer"
: > "$T/set_graph_function"
echo "$saved_buffer" > "$T/buffer_size_kb"

# -- trace-cmd's latency format (its own record: it sets and resets the tracer itself)
cd /tmp
sync
echo 3 > /proc/sys/vm/drop_caches
trace-cmd record -q -p function_graph -g nfs_file_read -o /tmp/parser-cases.dat \
    dd if="$mount/work/probekit/read.bin" of=/dev/null bs=64k status=none > /dev/null
trace-cmd report -l -i /tmp/parser-cases.dat > "$out/trace-cmd-l.trace"
trace-cmd report -i /tmp/parser-cases.dat > "$out/trace-cmd.trace"
trace-cmd --version 2>&1 | head -n 2 > "$out/trace-cmd-version.txt" || true
rm -f /tmp/parser-cases.dat
echo "done: $(ls "$out" | wc -l) files"
