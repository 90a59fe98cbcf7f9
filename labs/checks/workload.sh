#!/bin/sh
# The lab's known NFS workload, in small named steps (guest side, any mount).
# Usage: workload.sh STEP MOUNT
#   prepare  create MOUNT/work/probekit/{read.bin (256 KiB), small.txt}
#   write    256 KiB in 64 KiB blocks + fsync, then 8 x 4 KiB O_SYNC writes
# PROBEKIT_WORKLOAD_BLOCKS (default 4) sets the number of 64 KiB blocks written and read.
#   read     drop caches, then read read.bin in 64 KiB blocks
#   stat     5 x stat small.txt, each asking the server (statx AT_STATX_FORCE_SYNC: nfs_getattr
#            revalidates with a GETATTR whatever the attribute cache holds)
#   open     3 x cat small.txt
#   meta     the namespace and attribute calls: mkdir, create, link, symlink, rename, chmod,
#            a listing, remove, rmdir (in MOUNT/work/probekit/meta)
#   all      write, read, stat, open
set -eu
step=${1:?usage: workload.sh STEP MOUNT}
d=${2:?usage: workload.sh STEP MOUNT}/work/probekit
blocks=${PROBEKIT_WORKLOAD_BLOCKS:-4}

case "$step" in
prepare)
    mkdir -p "$d"
    dd if=/dev/urandom of="$d/read.bin" bs=64k count=$blocks conv=fsync status=none
    echo hello > "$d/small.txt"
    ;;
write)
    dd if=/dev/zero of="$d/write.bin" bs=64k count=$blocks conv=fsync status=none
    i=0
    while [ $i -lt 8 ]; do
        dd if=/dev/zero of="$d/sync.bin" bs=4k count=1 seek=$i oflag=sync conv=notrunc status=none
        i=$((i + 1))
    done
    ;;
read)
    sync
    echo 3 > /proc/sys/vm/drop_caches
    dd if="$d/read.bin" of=/dev/null bs=64k status=none
    ;;
stat)
    for i in 1 2 3 4 5; do stat --cached=never "$d/small.txt" > /dev/null; done
    ;;
open)
    for i in 1 2 3; do cat "$d/small.txt" > /dev/null; done
    ;;
meta)
    m="$d/meta"
    mkdir "$m"
    : > "$m/f"
    ln "$m/f" "$m/hard"
    ln -s f "$m/soft"
    mv "$m/f" "$m/g"
    chmod 600 "$m/g"
    ls -l "$m" > /dev/null
    rm "$m/g" "$m/hard" "$m/soft"
    rmdir "$m"
    ;;
all)
    for s in write read stat open; do sh "$0" "$s" "${2}"; done
    ;;
*)
    echo "workload.sh: unknown step $step" >&2
    exit 2
    ;;
esac
