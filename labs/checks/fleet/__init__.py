"""The fleet check: which client slows the server for everyone, on one server and two clients."""
