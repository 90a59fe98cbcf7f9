"""Log2 histograms as bcc prints them, and percentiles from their buckets.

Why our own: users compare nfsdist with bcc's tools line by line, so the layout follows
bcc's `print_log2_hist` (header, `low -> high : count |stars|`, 40-star width, the wide
variant past bucket 32), but the per-op buckets come from our own maps.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing's constant without typing (discover/records.py)
if TYPE_CHECKING:
    from typing import Dict, List, Sequence


STARS_MAX = 40


def stars(val: int, val_max: int, width: int) -> str:
    """bcc's bar: width*val/val_max stars, '+' at the end when val exceeds val_max."""
    count = 0
    while count <= width - 1 and count <= (width * val / val_max) - 1:
        count += 1
    text = "*" * count
    if val > val_max:
        text = text[:-1] + "+"
    return text


def format_log2(vals: Sequence[int], val_type: str) -> List[str]:
    """Lines of one histogram; vals[i] counts values v with floor(log2(v)) + 1 == i."""
    idx_max = -1
    val_max = 0
    for i, val in enumerate(vals):
        if val > 0:
            idx_max = i
        val_max = max(val_max, val)
    if idx_max <= 32:
        header, body, width = "     %-19s : count     distribution", "%10d -> %-10d : %-8d |%-*s|", STARS_MAX
    else:
        header, body, width = ("               %-29s : count     distribution",
                               "%20d -> %-20d : %-8d |%-*s|", STARS_MAX // 2)
    lines = [header % val_type] if idx_max > 0 else []
    for i in range(1, idx_max + 1):
        low, high = (1 << i) >> 1, (1 << i) - 1
        if low == high:
            low -= 1
        lines.append(body % (low, high, vals[i], width, stars(vals[i], val_max, width)))
    return lines


def buckets(slots: Dict[int, int]) -> List[int]:
    """Dense bucket list (index = slot) from a sparse slot -> count map."""
    if not slots:
        return []
    out = [0] * (max(slots) + 1)
    for slot, count in slots.items():
        out[slot] = count
    return out


def percentile(slots: Dict[int, int], pct: float) -> int:
    """Upper bound of the bucket holding the pct-th percentile (0 when empty).

    A log2 bucket only bounds a value, so p99 is reported as that bound, like
    reading it off bcc's histogram.
    """
    total = sum(slots.values())
    if total == 0:
        return 0
    need = total * pct / 100.0
    seen = 0
    for slot in sorted(slots):
        seen += slots[slot]
        if seen >= need:
            return (1 << slot) - 1 if slot > 0 else 0
    return (1 << max(slots)) - 1
