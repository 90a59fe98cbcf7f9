"""The lab checks, one folder per suite: the host's verdicts (and what the host does during the
run) beside the guest script it judges. A host module reaches a guest script only through
labs.checks.shared, the one module both sides import."""
