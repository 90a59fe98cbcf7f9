"""Labs: NFS server/client VMs (QEMU and Vagrant) that prove probekit on real kernels."""
