"""The probe check: nfsslower, nfsdist and nfstop against a known NFS workload."""
