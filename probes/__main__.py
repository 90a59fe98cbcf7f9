"""Allow `python3 -m probes` (tests and machines without the console script)."""
from probes.cli import main

main()
