#!/bin/sh
# The lab's SMB share over loopback: Samba from Debian (the image's [probekit] share,
# labs/provision/node.sh) mounted by the kernel's cifs client with SMB 3.1.1.
#   smb_share.sh mount MOUNTPOINT CACHE   start smbd if needed, set the user's Samba
#                                         password, mount with cache=CACHE (strict, loose, none)
#   smb_share.sh umount MOUNTPOINT        unmount; smbd stops with the last lab mount
set -eu
export PATH=/usr/local/sbin:/usr/sbin:/sbin:$PATH
PASSWORD=probekit-lab
case "${1:-}" in
mount)
    systemctl start smbd
    printf '%s\n%s\n' "$PASSWORD" "$PASSWORD" | smbpasswd -a -s probekit >/dev/null
    mkdir -p "$2"
    mount -t cifs //127.0.0.1/probekit "$2" \
        -o "username=probekit,password=$PASSWORD,vers=3.1.1,cache=$3"
    ;;
umount)
    umount "$2" 2>/dev/null || true
    rmdir "$2" 2>/dev/null || true
    grep -q ' cifs ' /proc/mounts || systemctl stop smbd
    ;;
*)
    echo "usage: smb_share.sh mount MOUNTPOINT CACHE | umount MOUNTPOINT" >&2
    exit 2
    ;;
esac
