#!/bin/sh
# Evidence for `discover propose nfsd`, on the NFS server (knfsd) of a lab pair: one
# function_graph capture of the server's request processing, with the nfsd tracepoints and
# sunrpc's request events enabled, while a client runs a known workload. The graph starts
# at sunrpc's svc_process (set_graph_function), so whatever it calls for each request
# (nfsd_dispatch, the NFSv3 procedures, nfsd4_proc_compound and its operations, the reply's
# encoding) is in it, not names guessed in advance. Plain tracefs writes, no probekit code
# on the traced path. Also writes `discover snapshot` (the kernel profile) and `discover
# events nfsd sunrpc`.
#   OUT/nfsd-ops.events.trace  the capture (`cat trace`), .stats and .trace_options beside it
#   OUT/profile.json           the kernel profile; OUT/nfsd.events.json, OUT/sunrpc.events.json
# Usage: capture_nfsd.sh OUTDIR
# It writes OUTDIR/tracing once tracing runs, then waits (at most 900 s) until OUTDIR/done
# exists: the host runs the client's workload in between (fixture README) and then makes
# it (/results is one share for both guests). Every tracefs setting it changes is put back
# on exit, Ctrl-C and SIGTERM.
set -eu
out=${1:?usage: capture_nfsd.sh OUTDIR}
here=$(dirname "$0")
. "$here/tracefs_state.sh"
capture_dir "$out"
rm -f "$out/tracing" "$out/done"
cd /opt/probekit
python3 -m discover snapshot -o "$out/profile.json"
python3 -m discover events nfsd --json > "$out/nfsd.events.json"
python3 -m discover events sunrpc --json > "$out/sunrpc.events.json"

echo 0 > "$T/tracing_on"
echo nop > "$T/current_tracer"
echo svc_process > "$T/set_graph_function"
echo 7 > "$T/max_graph_depth"
echo 16384 > "$T/buffer_size_kb"
echo function_graph > "$T/current_tracer"
saved_graph_options=$(cat "$T/trace_options")
echo 1 > "$T/events/nfsd/enable"
for ev in svc_process svc_send svc_stats_latency svc_drop svc_defer; do
    [ -d "$T/events/sunrpc/$ev" ] && echo 1 > "$T/events/sunrpc/$ev/enable"
done
: > "$T/trace"
echo 1 > "$T/tracing_on"
date -u +%FT%TZ > "$out/tracing"
waited=0
while [ ! -e "$out/done" ]; do
    if [ $waited -ge 900 ]; then echo "capture_nfsd.sh: no $out/done after 900 s" >&2; exit 1; fi
    sleep 1
    waited=$((waited + 1))
done
echo 0 > "$T/tracing_on"
echo 0 > "$T/events/enable"
save_capture "$out" nfsd-ops.events
echo "nfsd-ops.events: $(wc -l < "$out/nfsd-ops.events.trace") lines"
