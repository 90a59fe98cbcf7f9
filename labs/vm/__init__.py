"""The VM machinery: images, the QEMU and Vagrant backends and how the host talks to their guests.

Apart from the checks (labs.checks) and the runner (labs.cli, labs.integration): booting a guest
knows nothing of what is checked in it."""
