#!/bin/sh
# The runs docs/examples/ quotes (labs/capture/examples.py): each tool in its text layout (and
# nfsslower's -j, --json, -M and stuck-operation lines, nfsdist --per-mount, nfstop --by
# cgroup, one nfs-exporter scrape) around a known workload, in a single-guest lab.
# NFS runs have netem on lo (50 ms per packet: about 100 ms per round trip, 1.6 s for the
# stuck-operation run); the -t FS runs use a dm `delay` device under XFS, ext4 and btrfs.
# Tools run from the read-only source tree. Output: /results/examples/NAME.{cmd,out,err}
# and env.txt; everything made is removed at the end.
# Usage: capture_examples.sh [nfs] [exporter] [fs]   (default all; a part run again replaces
# its own files and adds a dated `rerun PART` line to env.txt). PROBEKIT_TREE: the source
# tree the tools run from (default /opt/probekit; e.g. a `git archive` of another commit
# unpacked under /results), named in env.txt.
set -eu
O=/results/examples
W=/opt/probekit/labs/checks/workload.sh
TREE=${PROBEKIT_TREE:-/opt/probekit}
cd "$TREE"
mkdir -p $O
if [ $# -eq 0 ]; then
  set -- nfs exporter fs
  rm -f $O/*
fi
if [ ! -e $O/env.txt ]; then
  { uname -r; date -u +%FT%TZ; python3 --version; dpkg-query -W -f '${Version}\n' python3-bpfcc; } > $O/env.txt
else
  for part; do echo "rerun $part $(date -u +%FT%TZ) $TREE" >> $O/env.txt; done
fi

# start NAME 'shown command' TOOL ARGS...: the tool in the background; returns once it
# printed its first line (attached, its signal handlers set: a background job of sh starts
# with SIGINT ignored); stdout/stderr in NAME.out/.err
start() {
  name=$1 shown=$2; shift 2
  echo "$shown" > $O/$name.cmd
  python3 -m probes.commands "$@" > $O/$name.out 2> $O/$name.err &
  P=$!
  until [ -s $O/$name.out ]; do kill -0 $P; sleep 1; done
  sleep 1
}
stop() { sleep 2; kill -INT $P; wait $P || true; }
netem() { tc qdisc del dev lo root 2>/dev/null || true; [ "$1" = 0 ] || tc qdisc add dev lo root netem delay "$1"ms; }

part_nfs() {
  for m in /mnt/nfs3 /mnt/nfs42; do sh $W prepare $m; done
  netem 50
  start nfsslower 'nfsslower 50' nfsslower 50
  sh $W all /mnt/nfs3; stop
  start nfsslower-M 'nfsslower -M 50' nfsslower -M 50
  sh $W write /mnt/nfs3; sh $W write /mnt/nfs42; stop
  start nfsslower-csv 'nfsslower -j 50' nfsslower -j 50
  sh $W write /mnt/nfs3; stop
  start nfsslower-json 'nfsslower --json 50' nfsslower --json 50
  sh $W read /mnt/nfs3; sh $W stat /mnt/nfs3; stop
  start nfsdist 'nfsdist' nfsdist
  sh $W all /mnt/nfs3; stop
  start nfsdist-per-mount 'nfsdist --per-mount -m' nfsdist --per-mount -m
  sh $W all /mnt/nfs3; sh $W all /mnt/nfs42; stop
  start nfstop 'nfstop -C -i 5' nfstop -C -i 5
  sh $W all /mnt/nfs3 & sh $W all /mnt/nfs42; wait $!; sleep 4; stop
  start nfstop-cgroup 'nfstop --by cgroup -C -i 5' nfstop --by cgroup -C -i 5
  systemd-run --quiet --unit=backup --wait /bin/sh $W all /mnt/nfs3 &
  B=$!
  systemd-run --quiet --unit=report --wait /bin/sh $W read /mnt/nfs42
  wait $B; sleep 4; stop
  netem 800
  start nfsslower-stall 'nfsslower --stall-interval 1 1000' nfsslower --stall-interval 1 1000
  sh $W stat /mnt/nfs3; stop
  netem 0
}

part_exporter() {  # one scrape after the workload, once the probe is attached
  sh $W prepare /mnt/nfs3
  echo 'nfs-exporter' > $O/nfs-exporter.cmd
  python3 -m probes.exporter 2> $O/nfs-exporter.err &
  P=$!
  until python3 -c 'import urllib.request as u; assert b"\nprobekit_nfs_probe_attached 1.0" in u.urlopen("http://127.0.0.1:19910/metrics").read()' 2>/dev/null; do
    kill -0 $P; sleep 1
  done
  sh $W all /mnt/nfs3; sleep 2
  python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:19910/metrics").read().decode(), end="")' > $O/nfs-exporter.out
  kill -INT $P; wait $P || true
}

fs_up() {  # fs_up FS: /mnt/ex-FS on a device adding 20 ms to every I/O
  truncate -s 512M /var/tmp/ex-$1.img
  L=$(losetup -f --show /var/tmp/ex-$1.img); echo $L > /var/tmp/ex-$1.loop
  dmsetup create ex-$1 --table "0 1048576 delay $L 0 20"
  if [ $1 = btrfs ]; then mkfs.btrfs -q -f /dev/mapper/ex-$1; else mkfs.$1 -q /dev/mapper/ex-$1; fi
  mkdir -p /mnt/ex-$1 && mount /dev/mapper/ex-$1 /mnt/ex-$1
}
fs_down() { umount /mnt/ex-$1; dmsetup remove ex-$1; losetup -d $(cat /var/tmp/ex-$1.loop); rm /var/tmp/ex-$1.*; }
fs_work() {  # 512 KiB written with fsync, pages dropped, read back, stat
  dd if=/dev/zero of=$1/f bs=64k count=8 conv=fsync status=none
  echo 3 > /proc/sys/vm/drop_caches
  dd if=$1/f of=/dev/null bs=64k status=none
  stat $1/f > /dev/null
}

part_fs() {
  for t in xfs ext4 btrfs; do fs_up $t; done
  start fsslower 'fsslower -t xfs 1' fsslower -t xfs 1
  fs_work /mnt/ex-xfs; stop
  start fsdist 'fsdist -t ext4 -T --mount-point /mnt/ex-ext4 5 3' fsdist -t ext4 -T --mount-point /mnt/ex-ext4 5 3
  fs_work /mnt/ex-ext4; fs_work /mnt/ex-ext4; wait $P || true
  start fstop 'fstop -t btrfs -C -i 5' fstop -t btrfs -C -i 5
  fs_work /mnt/ex-btrfs & fs_work /mnt/ex-btrfs; wait $!; sleep 4; stop
  for t in xfs ext4 btrfs; do fs_down $t; done
}

for part; do part_$part; done
echo done >> $O/env.txt
