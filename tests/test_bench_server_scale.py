"""bench/bench_server_scale.py's run kept as a fixture (6.12 lab guest, core, 1/10/100/200 NFSv3
clients of the guest's knfsd, each from a network namespace of its own; bench/README.md):
every size measured, the server saw every client, nfsdtop gave each a row, the exporter's
server series grow by the same count per client, no step costs more per added series (or
client) than the one before it as a quadratic cost would, and Prometheus scraped every
exporter, so that the rules' time is over the series at every size."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_server_scale  # noqa: E402

RUN = Path(__file__).parent / "fixtures" / "6.12.117+deb13-amd64" / "bench" / "bench_server_scale.json"


def recorded() -> Dict[str, Any]:
    return json.loads(RUN.read_text())


def figures(part: str, field: str, form: str = "") -> List[float]:
    return [float((row[part][form] if form else row[part])[field]) for row in recorded()["sizes"]]


def clients() -> List[int]:
    return [row["clients"] for row in recorded()["sizes"]]


def test_every_size_was_measured_and_the_server_saw_every_client() -> None:
    res = recorded()
    assert clients() == list(bench_server_scale.CLIENTS) and "stopped" not in res
    assert res["kernel"].startswith("6.12") and res["limits"] == list(bench_server_scale.LIMITS)
    for row in res["sizes"]:
        assert row["server_clients"] >= row["clients"], row["clients"]  # and 127.0.0.1, the guest's own mounts
        for part in res["limits"] + ["node_exporter"]:
            assert row[part]["samples"] > 0 and row[part]["min_s"] <= row[part]["median_s"] <= row[part]["max_s"]
        for name in res["limits"]:
            rules = row[name]["rules"]
            assert len(rules["evals_s"]) == res["rule_evals"] and rules["rules"] > 0 and rules["failures"] == 0


@pytest.mark.parametrize("name", list(bench_server_scale.LIMITS))
def test_prometheus_scraped_every_exporter_so_the_rules_ran_over_its_series(name: str) -> None:
    """Every scrape succeeded, at an interval above both the bench's slowest scrape and
    Prometheus' own, and the rules produced a sample for each client the exporter labelled."""
    for row in recorded()["sizes"]:
        run, rules = row[name], row[name]["rules"]
        assert bench_server_scale.rules_over_series(run), row["clients"]
        assert rules["scrape_interval_s"] == bench_server_scale.scrape_interval(run["max_s"]) >= 15
        assert rules["scrapes"]["max_s"] < rules["scrape_interval_s"] and rules["scrapes"]["samples"] >= run["samples"] - 10
        assert rules["rule_samples"] >= run["clients_labelled"], row["clients"]
    assert "not scraped" not in bench_server_scale.report(recorded())


def test_nfsdtop_had_a_row_for_every_client_in_every_interval() -> None:
    for row in recorded()["sizes"]:
        count = row["clients"]
        assert all(count <= rows <= count + 1 for rows in row["nfsdtop"]["json"]["rows"]), count  # + 127.0.0.1
        assert all(min(count, 20) <= rows <= min(count + 1, 20) for rows in row["nfsdtop"]["text"]["rows"]), count


def test_without_a_bound_the_server_series_grow_by_the_same_count_per_client() -> None:
    """Every client added from 10 clients on adds the same samples (130 in this run); the rest,
    not per client, is the same at 10, 100 and 200 and smaller at 1, where the guest's own
    127.0.0.1 client had sent nothing while that exporter ran (it labelled one client)."""
    samples = figures("limit4096", "nfsd_samples")
    counts = clients()
    per = (samples[-1] - samples[-2]) / (counts[-1] - counts[-2])
    rest = [total - per * count for total, count in zip(samples, counts)]
    assert per == int(per) and len(set(rest[1:])) == 1 and 0 < rest[0] < rest[1], (per, rest)
    assert [int(n) for n in figures("limit4096", "clients_labelled")] == [1] + [count + 1 for count in counts[1:]]


def test_the_default_limit_labels_64_clients() -> None:
    assert [int(n) for n in figures("limit64", "clients_labelled")] == [2, 11, 64, 64]


def test_node_exporter_serves_as_many_samples_at_every_size() -> None:
    assert len(set(figures("node_exporter", "samples"))) == 1


def marginal(costs: List[float], units: List[float]) -> List[float]:
    """The cost of each step between sizes per unit it added."""
    return [(d - c) / (v - u) for c, d, u, v in zip(costs, costs[1:], units, units[1:])]


def steps(part: str, per: str, form: str = "") -> List[float]:
    """Seconds added per added sample (`per` a sample count) or client, step by step."""
    rows = recorded()["sizes"]
    costs = [(row[part][form] if form else row[part])["median_s"] for row in rows]
    return marginal(costs, [float(row["clients"] if per == "clients" else row[part][per]) for row in rows])


@pytest.mark.parametrize("part,form", [("nfsdtop", "text"), ("nfsdtop", "json"), ("limit4096", "rules")])
def test_no_step_costs_more_per_added_client_than_the_one_before(part: str, form: str) -> None:
    """nfsdtop's interval and the rules' evaluation over every client's series: from 10 to 100
    and from 100 to 200 clients, the time each step adds per added client is below twice that
    of the step before it (a cost quadratic in the clients makes the 100-to-200 step's 2.7
    times the 10-to-100 one's)."""
    added = steps(part, "clients", form)
    assert 0 < added[2] < 2 * added[1], added


def test_the_exporters_scrape_grows_faster_than_its_series_from_100_to_200_clients() -> None:
    """What this run showed: with every client labelled, the 100-to-200 step added more than
    twice the time per added sample of the 10-to-100 step (the scrapes' spread at each size is
    within 15 %), and with the default limit the scrape grew from 100 to 200 clients at the
    same samples: part of the scrape's cost follows the clients, not the series served. Both
    were timed while udev's nfsrahead runs for the new mounts held the guest's CPU; once they
    were waited for, neither held (the tests on SETTLED below; bench/README.md)."""
    added = steps("limit4096", "nfsd_samples")
    assert added[2] > 2 * added[1] > 0, added
    rows = recorded()["sizes"]
    for row in rows[2:]:
        for name in recorded()["limits"]:
            assert row[name]["max_s"] < 1.15 * row[name]["min_s"], (row["clients"], name)
    hundred, two_hundred = rows[2]["limit64"], rows[3]["limit64"]
    assert hundred["samples"] == two_hundred["samples"] and two_hundred["median_s"] > 1.2 * hundred["median_s"]


#: the run after Session.requests() named each key once, with the exporter's scrape also measured
#: in a process of its own at every size (bench_server_scale.exporter_phases; bench/README.md)
PHASES = RUN.with_name("bench_server_scale_phases.json")


def phases_run() -> Dict[str, Any]:
    return json.loads(PHASES.read_text())


def phase_figures(name: str, field: str) -> List[float]:
    return [float(row["exporter_phases"][name][field]) for row in phases_run()["sizes"]]


def test_the_phases_run_measured_every_size_in_process_with_the_exporters_series() -> None:
    """Every size, both limits, in process too; with every client labelled the in-process scrape
    served the very samples the exporter served over HTTP at that size."""
    res = phases_run()
    assert [row["clients"] for row in res["sizes"]] == list(bench_server_scale.CLIENTS) and "stopped" not in res
    for row in res["sizes"]:
        assert row["exporter_phases"]["limit4096"]["samples"] == row["limit4096"]["samples"], row["clients"]
        for name in res["limits"]:
            run = row["exporter_phases"][name]
            assert run["calls"] > 0 and min(run["walls"]["scrape_s"]) <= run["scrape_s"], (row["clients"], name)


def test_the_scrapes_work_and_time_grow_with_its_series_not_faster() -> None:
    """With every client labelled, the function calls of a scrape (the work, whatever the host's
    load does to the guest's speed) added per added sample from 100 to 200 clients are within
    10 % of those from 10 to 100 (9.3 against 9.7), and so is the in-process time's (12.6
    against 11.7 us): nothing grows faster than the series."""
    samples = phase_figures("limit4096", "samples")
    calls = marginal(phase_figures("limit4096", "calls"), samples)
    walls = marginal(phase_figures("limit4096", "scrape_s"), samples)
    assert 0 < calls[2] < 1.1 * calls[1] and 0 < walls[2] < 1.1 * walls[1], (calls, walls)


def test_with_the_default_limit_the_work_left_follows_the_servers_entries() -> None:
    """At the default limit 100 and 200 clients serve the same samples; what the scrape does more
    at 200 is reading and folding the map entries of the clients past the limit: about 60
    calls per added (client, procedure, export), where a sample costs about 10."""
    rows = phases_run()["sizes"]
    hundred, two_hundred = (row["exporter_phases"]["limit64"] for row in rows[2:])
    assert hundred["samples"] == two_hundred["samples"]
    keys = two_hundred["entries"]["server_stats"] - hundred["entries"]["server_stats"]
    assert keys == 400 and 0 < (two_hundred["calls"] - hundred["calls"]) / keys < 100


@pytest.mark.parametrize("name", list(bench_server_scale.LIMITS))
def test_each_server_key_is_named_once_per_scrape(name: str) -> None:
    """The profile at 200 clients: server_key() ran once per server_stats entry, not again for
    each histogram entry (before, 2,420 calls for 1,002 + 1,418 entries at 200 clients)."""
    run = phases_run()["sizes"][-1]["exporter_phases"][name]
    calls = [int(line.split()[0]) for line in run["profile_tottime"].splitlines() if line.endswith("(server_key)")]
    assert calls == [run["entries"]["server_stats"]], calls


#: the run that waited for udev after each size's mounts (udevadm settle) before measuring
SETTLED = RUN.with_name("bench_server_scale_settled.json")


def settled_rows() -> List[Dict[str, Any]]:
    res = json.loads(SETTLED.read_text())
    assert "stopped" not in res
    return res["sizes"]


def test_the_settled_run_measured_every_size_once_udev_was_done() -> None:
    rows = settled_rows()
    assert [row["clients"] for row in rows] == list(bench_server_scale.CLIENTS)
    for row in rows:
        assert row["udev_settle_s"] >= 0 and row["server_clients"] >= row["clients"], row["clients"]
        for name in bench_server_scale.LIMITS:
            assert bench_server_scale.rules_over_series(row[name]), (row["clients"], name)
    assert rows[-1]["udev_settle_s"] > 60  # the nfsrahead runs of 100 more mounts


def test_once_udev_was_done_the_exporters_scrape_grew_with_its_series() -> None:
    """Over HTTP, every client labelled: 15.2 us per added sample from 100 to 200 clients against
    12.7 from 10 to 100 (the first run's 69 against 21), its function calls in process 9.4
    against 9.7 per added sample; at 200 clients 454 ms, where the first run took 1,248."""
    rows = settled_rows()
    http = marginal([row["limit4096"]["median_s"] for row in rows], [row["limit4096"]["samples"] for row in rows])
    calls = marginal([row["exporter_phases"]["limit4096"]["calls"] for row in rows],
                     [row["exporter_phases"]["limit4096"]["samples"] for row in rows])
    assert 0 < http[2] < 1.25 * http[1] and 0 < calls[2] < 1.1 * calls[1], (http, calls)
    assert rows[-1]["limit4096"]["median_s"] < 0.5 * recorded()["sizes"][-1]["limit4096"]["median_s"]


def test_once_udev_was_done_the_default_limit_cost_a_little_per_client_past_it() -> None:
    """With the default limit 100 and 200 clients serve about the same samples (10,901 and
    10,933); the scrape took 255 and 324 ms: 0.7 ms per client added past the limit, the
    reading and folding of its map entries, where the first run added 3.0 ms."""
    hundred, two_hundred = (row["limit64"] for row in settled_rows()[2:])
    assert abs(two_hundred["samples"] - hundred["samples"]) < 0.01 * hundred["samples"]
    assert 0 < (two_hundred["median_s"] - hundred["median_s"]) / 100 < 0.001
