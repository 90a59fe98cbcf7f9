"""Discovery: drive tracefs, parse function_graph output, build call graphs."""
