"""The private apt setup: confined to the probekit cache, and cached kernels used offline."""
from __future__ import annotations

from pathlib import Path

import pytest

from debian_kernels import ABI_61, kernel_dir
from discover.errors import UserError
from probes import fetch
from probes.fetch import PrivateApt, abi_matches, abi_sort_key, fetch_kernel, pick


def test_apt_options_stay_in_the_private_root(tmp_path: Path) -> None:
    apt = PrivateApt(tmp_path / "apt")
    opts = apt.options()
    values = [o.split("=", 1)[1] for o in opts[1::2] if o.startswith("Dir::")]
    assert values and all(v.startswith(str(tmp_path / "apt")) or v.endswith(".bin") for v in values)
    for key in ("Dir::State", "Dir::State::status", "Dir::Cache", "Dir::Etc::SourceList", "Dir::Etc::SourceParts"):
        assert any(o.startswith(key + "=") for o in opts[1::2]), key


def test_version_matching() -> None:
    abis = ["5.10.0-30", "5.10.0-32", "6.1.0-47", "6.1.0-50", "6.12.95+deb12", "6.12.117+deb13", "7.2.13+deb14"]
    assert pick(abis, "6.1") == "6.1.0-50"
    assert pick(abis, "6.12") == "6.12.117+deb13"
    assert pick(abis, "6.12.95") == "6.12.95+deb12"
    assert pick(abis, "5.10.0-30") == "5.10.0-30"
    assert pick(abis, "7") == "7.2.13+deb14"
    assert pick(abis, "6.2") is None
    assert not abi_matches("6.12.95+deb12", "6.1")
    assert abi_sort_key("6.12.117+deb13") > abi_sort_key("6.12.95+deb12")


def test_cached_kernel_needs_no_apt(monkeypatch: pytest.MonkeyPatch) -> None:
    directory = kernel_dir(ABI_61)
    assert (directory / "manifest.json").is_file() and list(directory.glob("linux-image-6.1.0-50-amd64*.deb"))

    def no_apt(*_a, **_k):
        raise AssertionError("apt must not run for a cached kernel")

    monkeypatch.setattr(fetch.PrivateApt, "_run", no_apt)
    assert fetch_kernel("6.1.0-50") == directory


def test_not_a_version() -> None:
    with pytest.raises(UserError, match="not a kernel version"):
        fetch_kernel("latest")
