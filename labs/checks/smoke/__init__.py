"""The Vagrant smoke: one capture and one exact nfsdist count on the pair's client."""
