"""The NFS server check: nfsdtop's counts against the server's own counters."""
