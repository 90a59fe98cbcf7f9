"""The coexistence check: discover callgraph while trace-cmd records."""
