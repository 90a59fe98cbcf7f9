"""The exporter check: nfs-exporter scraped by Debian's Prometheus beside node_exporter."""
