"""Allow `python3 -m discover` (how the lab runs it inside guests, without installing)."""
from discover.cli import main

main()
