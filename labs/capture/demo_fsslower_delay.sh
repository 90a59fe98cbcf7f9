#!/bin/sh
# docs/walkthrough.md's last lab step, as run: `fsslower -t xfs 1` (the installed Debian package)
# on XFS over a dm `delay` device while dd writes 512 KiB with fsync, the pages are dropped
# and read back, and stat runs; once without delay, once with 300 ms on every I/O.
# Output in /results: slower.txt (the tool's), marks.txt (when each round began),
# table.txt (the dm table of the delayed round). Everything made is removed at the end.
set -e
export PATH=/usr/sbin:/sbin:$PATH
truncate -s 512M /var/tmp/demo.img
L=$(losetup -f --show /var/tmp/demo.img)
dmsetup create demo-xfs --table "0 1048576 delay $L 0 0"
mkfs.xfs -q /dev/mapper/demo-xfs && mkdir -p /mnt/demo && mount /dev/mapper/demo-xfs /mnt/demo
work() {
  dd if=/dev/zero of=/mnt/demo/f bs=64k count=8 conv=fsync 2>/dev/null
  echo 3 > /proc/sys/vm/drop_caches
  dd if=/mnt/demo/f of=/dev/null bs=64k 2>/dev/null
  stat /mnt/demo/f > /dev/null
}
cd / && env -u PYTHONPATH fsslower -t xfs 1 > /results/slower.txt 2> /results/slower.err &
P=$!
while [ ! -s /results/slower.txt ]; do sleep 1; done; sleep 1
echo "## no delay" >> /results/marks.txt; date +%T >> /results/marks.txt
work; sleep 2
dmsetup suspend demo-xfs; dmsetup reload demo-xfs --table "0 1048576 delay $L 0 300"; dmsetup resume demo-xfs
dmsetup table demo-xfs > /results/table.txt
echo "## 300 ms" >> /results/marks.txt; date +%T >> /results/marks.txt
work; sleep 2
kill -INT $P; wait $P || true
dmsetup suspend demo-xfs; dmsetup reload demo-xfs --table "0 1048576 delay $L 0 0"; dmsetup resume demo-xfs
umount /mnt/demo; dmsetup remove demo-xfs; losetup -d $L; rm /var/tmp/demo.img
