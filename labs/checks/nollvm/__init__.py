"""The no-LLVM check: a client without bcc, LLVM, clang or kernel headers runs the tools on core."""
