"""The fault check: the tools on a pair's client while its server stops, restarts or loses packets."""
