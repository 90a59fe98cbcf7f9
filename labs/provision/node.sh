#!/bin/sh
# Build-time set-up of a lab node, run inside the image root (chroot) by labs/images.py,
# or on a running Debian box by a Vagrant provisioner. Idempotent.
# Usage: node.sh VAGRANT_PUBLIC_KEY_FILE
# Gives: root without password on the console, a `vagrant` user with passwordless sudo
# and the lab's SSH key, systemd-networkd (DHCP on user-mode NICs, static lab links
# from the kernel command line), the guest agent, the 9p shares, and the NFS server
# set-up (server.sh): every node can serve, so one image serves both topologies.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
pubkey=${1:?usage: node.sh VAGRANT_PUBLIC_KEY_FILE}

echo probekit-lab > /etc/hostname
passwd -d root >/dev/null

# vagrant user: Vagrant logs in with a key only, then uses passwordless sudo
id vagrant >/dev/null 2>&1 || useradd -m -s /bin/bash vagrant
install -d -m 700 -o vagrant -g vagrant /home/vagrant/.ssh
install -m 600 -o vagrant -g vagrant "$pubkey" /home/vagrant/.ssh/authorized_keys
install -d -m 700 /root/.ssh
install -m 600 "$pubkey" /root/.ssh/authorized_keys
printf 'vagrant ALL=(ALL) NOPASSWD: ALL\nDefaults:vagrant !requiretty\n' > /etc/sudoers.d/vagrant
chmod 440 /etc/sudoers.d/vagrant

# networking: systemd-networkd only. User-mode NICs get DHCP; a static lab link is
# described by probekit.link=MAC,ADDRESS/PREFIX on the kernel command line.
install -d /etc/systemd/network
cat > /etc/systemd/network/80-probekit-dhcp.network <<'NET'
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
LinkLocalAddressing=no
IPv6AcceptRA=no
NET
install -m 755 "$here/lab-link.sh" /usr/local/sbin/probekit-lab-link
cat > /etc/systemd/system/probekit-lab-link.service <<'UNIT'
[Unit]
Description=probekit lab link address from the kernel command line
DefaultDependencies=no
Before=systemd-networkd.service
After=local-fs.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/probekit-lab-link

[Install]
WantedBy=multi-user.target
UNIT
systemctl enable systemd-networkd.service probekit-lab-link.service qemu-guest-agent.service ssh.service 2>/dev/null || \
    systemctl enable systemd-networkd.service probekit-lab-link.service ssh.service
# nothing in the lab waits for "online": the client mounts by itself and retries
systemctl mask systemd-networkd-wait-online.service >/dev/null 2>&1 || true
# boot straight to multi-user; e2scrub_reap alone took 90 s of a TCG boot
systemctl set-default multi-user.target >/dev/null
# timers and jobs that would compete for the single TCG CPU during boot or a capture
for unit in e2scrub_reap.service apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer \
            logrotate.timer dpkg-db-backup.timer systemd-tmpfiles-clean.timer; do
    systemctl mask "$unit" >/dev/null 2>&1 || true
done

# servers the tests start themselves: nothing of theirs runs at boot
for unit in prometheus.service prometheus-node-exporter.service smbd.service nmbd.service samba-ad-dc.service; do
    systemctl disable "$unit" >/dev/null 2>&1 || true
done
# the SMB share the fs checks mount, and its user (its Samba password is set at run time:
# labs/guest/smb_share.sh)
install -d /srv/probekit-smb
id probekit >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin probekit
grep -q '^\[probekit\]' /etc/samba/smb.conf 2>/dev/null || cat >> /etc/samba/smb.conf <<'SMB'

[probekit]
   path = /srv/probekit-smb
   read only = no
   valid users = probekit
   force user = root
SMB

# QEMU lab shares (absent under Vagrant: nofail keeps boot going)
install -d /opt/probekit /results
grep -q ' /opt/probekit ' /etc/fstab 2>/dev/null || cat >> /etc/fstab <<'FSTAB'
/dev/vda / ext4 rw,relatime 0 1
probekit /opt/probekit 9p trans=virtio,version=9p2000.L,ro,nofail,msize=262144 0 0
results /results 9p trans=virtio,version=9p2000.L,rw,nofail,msize=262144 0 0
FSTAB
printf '9p\n9pnet_virtio\n' > /etc/modules-load.d/probekit-9p.conf

# journald: keep logs in memory, small
install -d /etc/systemd/journald.conf.d
printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=32M\n' > /etc/systemd/journald.conf.d/probekit.conf

sh "$here/server.sh"
