#!/bin/sh
# Evidence for `discover propose FS`: for each filesystem given, one function_graph
# capture with the filesystem's own tracepoints enabled while a known workload runs on it.
# ext4, xfs, btrfs: a 512 MiB loop file made into that filesystem, mounted at
# /mnt/probekit-FS. cifs:CACHE: the lab's SMB share (smb_share.sh) mounted with
# cache=CACHE at /mnt/probekit-cifs-CACHE (the client enters through other functions per
# mode). The graph starts at the VFS functions of the operations a latency tool times
# (set_graph_function), so the filesystem's entry points are whatever VFS calls there,
# not names guessed in advance; max_graph_depth 5 keeps the text small. Plain tracefs
# writes and coreutils, no probekit code. Also writes `discover snapshot` (the kernel
# profile) and `discover events FS`.
#   OUT/NAME-ops.events.trace  the capture (`cat trace`), .stats and .trace_options beside it
#   OUT/NAME.workload.txt      the workload's commands and output (NAME: ext4, cifs-strict, ...)
#   OUT/profile.json           the kernel profile, OUT/FS.events.json the events
# Usage: capture_fs.sh OUTDIR FS...
# Every tracefs setting, mount, loop device and file it makes is undone on exit, Ctrl-C
# and SIGTERM.
set -eu
export PATH=/usr/local/sbin:/usr/sbin:/sbin:$PATH
out=${1:?usage: capture_fs.sh OUTDIR FS...}
shift
here=$(dirname "$0")
. "$here/tracefs_state.sh"
capture_dir "$out"
made=""
cleanup() {
    for name in $made; do
        case $name in
        cifs-*) sh "$here/../checks/fs/smb_share.sh" umount "/mnt/probekit-$name" ;;
        *)
            umount "/mnt/probekit-$name" 2>/dev/null || true
            dev=$(losetup -j "/var/tmp/probekit-$name.img" -O NAME -n 2>/dev/null || true)
            [ -n "$dev" ] && losetup -d $dev
            rm -f "/var/tmp/probekit-$name.img"
            rmdir "/mnt/probekit-$name" 2>/dev/null || true
            ;;
        esac
    done
    restore
}
trap 'cleanup' EXIT

for fs in "$@"; do
    name=$(echo "$fs" | tr : -) mnt=/mnt/probekit-$(echo "$fs" | tr : -)
    made="$made $name"
    case $fs in
    cifs:*) sh "$here/../checks/fs/smb_share.sh" mount "$mnt" "${fs#cifs:}" ;;
    *)
        img=/var/tmp/probekit-$fs.img
        truncate -s 512M "$img"
        dev=$(losetup -f --show "$img")
        mkfs."$fs" -q "$dev" 2>/dev/null || mkfs."$fs" "$dev" > /dev/null
        mkdir -p "$mnt"
        mount "$dev" "$mnt"
        ;;
    esac
done
cd /opt/probekit
python3 -m discover snapshot -o "$out/profile.json"

echo 0 > "$T/tracing_on"
echo nop > "$T/current_tracer"
for f in vfs_read vfs_write vfs_open vfs_fsync_range vfs_getattr vfs_statx; do
    echo "$f" >> "$T/set_graph_function" 2>/dev/null || true
done
echo 5 > "$T/max_graph_depth"
echo 8192 > "$T/buffer_size_kb"
for fs in "$@"; do
    name=$(echo "$fs" | tr : -) mnt=/mnt/probekit-$(echo "$fs" | tr : -) system=${fs%%:*}
    [ -f "$out/$system.events.json" ] || python3 -m discover events "$system" --json > "$out/$system.events.json"
    echo function_graph > "$T/current_tracer"
    saved_graph_options=$(cat "$T/trace_options")
    [ -d "$T/events/$system" ] && echo 1 > "$T/events/$system/enable"
    : > "$T/trace"
    echo 1 > "$T/tracing_on"
    {
        echo "== dd 256 KiB in 4 KiB writes, fsync"; dd if=/dev/zero of="$mnt/f" bs=4k count=64 conv=fsync 2>&1
        echo "== stat x2"; stat "$mnt/f" > /dev/null; stat "$mnt/f" > /dev/null
        echo "== drop caches, read in 64 KiB"; echo 3 > /proc/sys/vm/drop_caches
        dd if="$mnt/f" of=/dev/null bs=64k 2>&1
        echo "== 2 x 4 KiB O_SYNC"; dd if=/dev/zero of="$mnt/g" bs=4k count=2 oflag=sync 2>&1
        echo "== O_DIRECT read"; dd if="$mnt/f" of=/dev/null bs=64k iflag=direct 2>&1
    } > "$out/$name.workload.txt"
    echo 0 > "$T/tracing_on"
    [ -d "$T/events/$system" ] && echo 0 > "$T/events/$system/enable"
    save_capture "$out" "$name-ops.events"
    for opt in $saved_graph_options; do echo "$opt" > "$T/trace_options" 2>/dev/null || true; done
    saved_graph_options=""
    echo nop > "$T/current_tracer"
    echo "$name: $(wc -l < "$out/$name-ops.events.trace") lines"
done
