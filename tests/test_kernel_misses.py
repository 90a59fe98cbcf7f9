"""The kernel's own miss counters as the tools read and report them (issue 34): tracefs'
kprobe_profile, bcc's event and program names, and how Session words and sums the counts.
The kprobe_profile lines are the ones a 6.12 and a 5.10 lab guest printed for a bcc
kretprobe made with maxactive 1 under six concurrent sleepers."""
from __future__ import annotations

from probes.backend import Attachment
from probes.bcc_backend import bcc_event_name, bcc_program_attachment, kprobe_profile, profile_missed
from probes.runtime import describe_missed, missed_by_op, missed_json, read_described, unvouched

#: /sys/kernel/tracing/kprobe_profile in the 6.12 guest (bcc 0.31) and the 5.10 one (bcc 0.18)
PROFILE_612 = "  r_hrtimer_nanosleep_bcc_626                               12               7\n"
PROFILE_510 = "  r_hrtimer_nanosleep_bcc_397                               15               6\n"


def test_kprobe_profile_gives_hits_and_misses_per_event() -> None:
    assert kprobe_profile(PROFILE_612) == {"r_hrtimer_nanosleep_bcc_626": (12, 7)}
    assert kprobe_profile(PROFILE_510 + PROFILE_612 + "\n") == {"r_hrtimer_nanosleep_bcc_397": (15, 6),
                                                               "r_hrtimer_nanosleep_bcc_626": (12, 7)}
    assert kprobe_profile("") == {}


def test_a_bcc_attachment_finds_its_count_in_the_profile() -> None:
    """The count of this process's own event; none for a kprobe bcc made through the perf PMU
    (absent from tracefs) nor for a trampoline."""
    profile = kprobe_profile(PROFILE_510 + PROFILE_612)
    assert profile_missed(profile, "kretprobe", "hrtimer_nanosleep", 626) == 7
    assert profile_missed(profile, "kretprobe", "hrtimer_nanosleep", 397) == 6
    assert profile_missed(profile, "kprobe", "hrtimer_nanosleep", 626) is None
    assert profile_missed(profile, "fexit", "hrtimer_nanosleep", 626) is None


def test_bcc_names_its_tracefs_events_and_trampolines() -> None:
    assert bcc_event_name("kretprobe", "hrtimer_nanosleep", 626) in kprobe_profile(PROFILE_612)
    assert bcc_event_name("kprobe", "start_ordered_ops.constprop.0", 7) == "p_start_ordered_ops_constprop_0_bcc_7"
    assert bcc_program_attachment("kfunc__nfs__nfs_file_read") == Attachment("kfunc__nfs__nfs_file_read", "fentry",
                                                                             "nfs_file_read")
    assert bcc_program_attachment("kretfunc__vmlinux__vfs_read").kind == "fexit"
    assert bcc_program_attachment("p3_kprobe") is None


def test_missed_counts_are_summed_per_op_and_name_their_counter() -> None:
    causes = {("write", "kretprobe", "ext4_file_write_iter"): 3, ("write", "start_not_stored", ""): 1,
              ("read", "recursion", "ext4_file_read_iter"): 2}
    assert missed_by_op(causes) == {"write": 4, "read": 2}
    text = describe_missed(causes)
    assert "4 write (kernel: 3 kretprobe misses at ext4_file_write_iter; probe: 1 starts not stored)" in text
    assert "2 read (kernel: 2 runs skipped at ext4_file_read_iter)" in text
    assert missed_json({("read", "kprobe", "nfs_file_read"): 5}) == [
        {"op": "read", "cause": "kprobe", "at": "nfs_file_read", "count": 5}]


def test_what_cannot_be_vouched_for() -> None:
    counted = [Attachment("a", "kretprobe", "nfs_file_read", 0), Attachment("b", "fentry", "nfs_file_write")]
    assert unvouched(counted, kernel_counts_misses=True) == []
    silent = [Attachment("a", "kretprobe", "nfs_file_read", None), Attachment("b", "tracepoint", "nfs:nfs_getattr_enter")]
    assert unvouched(silent, kernel_counts_misses=True) == ["what these miss: kretprobe nfs_file_read"]
    said = unvouched(silent, kernel_counts_misses=False)
    assert said[0].startswith("the runs of kretprobe, tracepoint programs it skips") and len(said) == 2
    assert unvouched([Attachment("b", "fentry", "nfs_file_write")], kernel_counts_misses=False) == []


def test_a_warnings_causes_read_back_are_the_causes_it_was_written_from() -> None:
    """read_described is describe_missed read back (what the benches have of a run is its
    stderr): every op, cause and place with its count, the docs reference after it ignored."""
    causes = {("write", "kretprobe", "xfs_file_write_iter"): 3, ("write", "start_not_stored", ""): 1,
              ("read", "recursion", "nfs_file_read"): 2, ("open", "kprobe", "nfs_file_open"): 5}
    line = f"fsslower: warning: not counted: {describe_missed(causes)} (docs/probes.md, 'Missed operations')"
    assert read_described(line) == causes
