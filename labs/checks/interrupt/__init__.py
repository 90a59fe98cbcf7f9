"""The interrupt check: discover killed mid-capture leaves tracefs as it found it."""
