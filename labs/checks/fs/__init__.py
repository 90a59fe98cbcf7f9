"""The local-filesystem check: fsslower, fsdist, fstop and nfs-exporter on XFS, ext4, btrfs and SMB."""
