"""Probe specs, the probe generator and compatibility reports."""
