# Sourced by the guest capture scripts (sh): mount tracefs if needed, remember the
# tracer, buffer size, tracing_on, options, pid filter and graph depth, and put them all
# back on exit, Ctrl-C and SIGTERM. A script sets saved_graph_options=$(cat
# "$T/trace_options") right after it makes function_graph current, so the graph options
# are restored while it still is.
T=/sys/kernel/tracing
[ -e "$T/trace" ] || mount -t tracefs nodev "$T"

saved_tracer=$(cat "$T/current_tracer")
# "7 (expanded: 1408)" before the first tracer use: the expanded size is what to restore
saved_buffer=$(sed -e 's/.*expanded: \([0-9]*\).*/\1/' "$T/buffer_size_kb")
saved_on=$(cat "$T/tracing_on")
saved_options=$(cat "$T/trace_options")
saved_events=$(cat "$T/events/enable")
saved_pid=$(cat "$T/set_ftrace_pid")
saved_depth=$(cat "$T/max_graph_depth")
saved_graph_options=""
restore() {
    echo 0 > "$T/tracing_on"
    # the graph options first, while function_graph is still current
    for opt in $saved_graph_options; do echo "$opt" > "$T/trace_options" 2>/dev/null || true; done
    echo "$saved_tracer" > "$T/current_tracer"
    for opt in $saved_options; do echo "$opt" > "$T/trace_options" 2>/dev/null || true; done
    : > "$T/set_graph_function"
    : > "$T/set_ftrace_filter"
    # all events were off before ("0"), or all on ("1"); a mixed "X" cannot be written back
    case "$saved_events" in 0|1) echo "$saved_events" > "$T/events/enable" ;; esac
    echo "$saved_buffer" > "$T/buffer_size_kb"
    echo "$saved_depth" > "$T/max_graph_depth"
    case "$saved_pid" in "no pid") : > "$T/set_ftrace_pid" ;; *) echo "$saved_pid" > "$T/set_ftrace_pid" ;; esac
    : > "$T/trace"
    echo "$saved_on" > "$T/tracing_on"
}
# capture_dir OUT: the folder the captures go to, with the guest's kernel and CPU count
capture_dir() {
    mkdir -p "$1"
    uname -r > "$1/uname-r.txt"
    nproc > "$1/nproc.txt"
}
# save_capture OUT NAME: the trace as `cat trace` shows it, the options it was taken
# under, and each CPU's ring-buffer stats (overruns, oldest event)
save_capture() {
    cat "$T/trace" > "$1/$2.trace"
    cat "$T/trace_options" > "$1/$2.trace_options"
    for c in "$T"/per_cpu/cpu*; do echo "## ${c##*/}"; cat "$c/stats"; done > "$1/$2.stats"
}
trap 'restore' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
