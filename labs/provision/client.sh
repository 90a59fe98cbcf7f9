#!/bin/sh
# NFS client set-up of a lab node: /mnt/nfs3 (vers=3) and /mnt/nfs42 (vers=4.2) from
# SERVER:/srv/nfs. Idempotent; retries while the server is still starting.
# Usage: client.sh [SERVER]   (default 127.0.0.1: server and client in one guest)
set -eu
server=${1:-127.0.0.1}

mount_one() {  # mount_one DIR VERS
    install -d "$1"
    if mountpoint -q "$1"; then return 0; fi
    tries=0
    until mount -t nfs -o "vers=$2,hard,timeo=600" "$server:/srv/nfs" "$1"; do
        tries=$((tries + 1))
        if [ "$tries" -ge 30 ]; then
            echo "client.sh: cannot mount $server:/srv/nfs vers=$2 on $1" >&2
            return 1
        fi
        sleep 2
    done
}
mount_one /mnt/nfs3 3
mount_one /mnt/nfs42 4.2
# a fresh workload directory per mount, owned by nobody in particular
install -d -m 1777 /mnt/nfs3/work /mnt/nfs42/work
grep ' /mnt/nfs' /proc/mounts
