"""The private apt setup: confined to the probekit cache, and cached kernels used offline."""
from __future__ import annotations

import os
import time
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
    assert (directory / "manifest.json").is_file() and list(directory.glob(f"linux-image-{directory.name}-amd64*.deb"))

    def no_apt(*_a, **_k):
        raise AssertionError("apt must not run for a cached kernel")

    monkeypatch.setattr(fetch.PrivateApt, "_run", no_apt)
    assert fetch_kernel(directory.name) == directory


def test_not_a_version() -> None:
    with pytest.raises(UserError, match="not a kernel version"):
        fetch_kernel("latest")


def _fake_apt(monkeypatch: pytest.MonkeyPatch, download) -> None:
    """A private apt that offers one kernel ABI (names as the real archive spells them)."""
    monkeypatch.setattr(fetch.PrivateApt, "ensure_indexes", lambda self: None)
    monkeypatch.setattr(fetch.PrivateApt, "indexes_age", lambda self: 10.0)
    monkeypatch.setattr(fetch.PrivateApt, "releases", lambda self: {
        "6.1.0-99": fetch.KernelRelease("6.1.0-99", ("linux-image-6.1.0-99-amd64",))})
    monkeypatch.setattr(fetch.PrivateApt, "split_parts", lambda self, image, abi: [])
    monkeypatch.setattr(fetch.PrivateApt, "download", download)


def test_failed_download_leaves_no_partial(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A fetch that fails half-way (here the download) removes its .partial directory when the command ends."""
    from discover import errors
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path))

    def half_download(self, packages, dest: Path) -> None:
        (dest / "linux-image-6.1.0-99-amd64_6.1.999-1_amd64.deb").write_bytes(b"!<arch>\n")
        raise UserError("apt-get download failed: connection reset")

    _fake_apt(monkeypatch, half_download)
    with pytest.raises(UserError, match="connection reset"):
        fetch_kernel("6.1.0-99", refresh=True)
    assert list((tmp_path / "kernels").glob(".*.partial"))  # still there until the boundary's undo steps run
    assert not errors.run_cleanups()
    assert not list((tmp_path / "kernels").iterdir())


def test_stale_lists_are_said(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """apt-get update exits 0 when the mirror is unreachable: the answer says the lists are old."""
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path))
    _fake_apt(monkeypatch, None)
    monkeypatch.setattr(fetch.PrivateApt, "indexes_age", lambda self: 86400.0 * 30)

    def offline_run(self, tool: str, args, cwd=None) -> str:  # what apt-get update prints offline, exit 0
        assert args == ["update"]
        self.warnings = ["W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  "
                         "Temporary failure resolving 'deb.debian.org'",
                         "W: Some index files failed to download. They have been ignored, or old ones used instead."]
        return ""
    monkeypatch.setattr(fetch.PrivateApt, "_run", offline_run)
    with pytest.raises(UserError, match=r"no Debian amd64 kernel 9\.99 .*updating them failed \(Failed to fetch"):
        fetch_kernel("9.99")


@pytest.mark.parametrize("seconds, said", [(5, "0 minutes old"), (61, "1 minute old"), (7200, "2 hours old"),
                                           (86400 * 3 + 600, "3 days old")])
def test_the_age_of_package_lists_reads_at_once(seconds: float, said: str) -> None:
    assert fetch.describe_age(seconds) == said


def test_an_answer_from_package_lists_says_how_old_they_are(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Also when apt-get update said nothing (offline it can keep old lists without a word)."""
    apt = PrivateApt(tmp_path)
    assert apt.staleness() == "; no package lists"
    lists = tmp_path / "state" / "lists"
    lists.mkdir(parents=True)
    index = lists / "deb.debian.org_debian_dists_sid_main_binary-amd64_Packages.lz4"
    index.touch()
    stamp = time.time() - 86400 * 3 - 600
    os.utime(index, (stamp, stamp))
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))
    assert apt.staleness() == f"; package lists from {when} (3 days old)"
    apt.update_failed = "Failed to fetch http://deb.debian.org/debian/dists/sid/InRelease"
    assert apt.staleness() == (f"; package lists from {when} (3 days old): updating them failed "
                               "(Failed to fetch http://deb.debian.org/debian/dists/sid/InRelease)")
