"""Captures for fixtures and docs: guest scripts that record tracefs and the tools' real output
(plain tracefs writes, run by hand in a lab guest), and docs/examples/ written from them."""
