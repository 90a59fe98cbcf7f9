#!/bin/sh
# Write a systemd-networkd config for the static lab link named on the kernel command
# line as probekit.link=MAC,ADDRESS/PREFIX (QEMU socket netdev between two guests).
set -eu
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        probekit.link=*)
            spec=${arg#probekit.link=}
            mac=${spec%%,*}
            addr=${spec#*,}
            install -d /run/systemd/network
            cat > /run/systemd/network/10-probekit-link.network <<NET
[Match]
MACAddress=$mac

[Network]
Address=$addr
LinkLocalAddressing=no
IPv6AcceptRA=no
NET
            ;;
    esac
done
