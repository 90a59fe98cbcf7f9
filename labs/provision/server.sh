#!/bin/sh
# NFS server set-up of a lab node. Idempotent; safe in a chroot (no service restarts
# there) and on a running box (exports reloaded, nfs-server started if stopped).
# Exports /srv/nfs to loopback and to the lab link subnet, for NFSv3 and NFSv4.x.
# The NFSv4 grace and lease times drop from 90 s to 10 s: a v4 open right after
# boot would otherwise stall for the whole grace period.
set -eu
subnet=${PROBEKIT_LAB_SUBNET:-10.77.0.0/24}
opts=rw,sync,no_root_squash,no_subtree_check,insecure

install -d -m 1777 /srv/nfs
cat > /etc/exports <<EXPORTS
# probekit lab export (labs/provision/server.sh)
/srv/nfs 127.0.0.1($opts) $subnet($opts)
EXPORTS

# nfs-utils >= 2 reads these; older ones ignore the section
if [ -f /etc/nfs.conf ] && ! grep -q '^grace-time' /etc/nfs.conf; then
    sed -i 's/^\[nfsd\]/[nfsd]\ngrace-time=10\nlease-time=10/' /etc/nfs.conf
fi
# every nfs-utils: write the proc knobs just before nfsd starts
dropin=/etc/systemd/system/nfs-server.service.d/probekit-grace.conf
want="[Service]
ExecStartPre=-/bin/sh -c 'echo 10 > /proc/fs/nfsd/nfsv4gracetime; echo 10 > /proc/fs/nfsd/nfsv4leasetime'"
changed=no
if [ "$(cat "$dropin" 2>/dev/null)" != "$want" ]; then
    install -d "$(dirname "$dropin")"
    printf '%s\n' "$want" > "$dropin"
    changed=yes
fi
systemctl enable nfs-server.service rpcbind.service >/dev/null 2>&1 || true

if [ -d /run/systemd/system ]; then
    # a daemon-reload costs seconds under TCG: only when the drop-in is new
    if [ "$changed" = yes ]; then systemctl daemon-reload; fi
    systemctl is-active -q nfs-server.service || systemctl start nfs-server.service
    exportfs -ra
fi
