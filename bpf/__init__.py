"""Kernel-side C templates of the generated probes (installed as package data)."""
