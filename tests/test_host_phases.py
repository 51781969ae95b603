"""``profile.host_phases``: recorded host windows split into the CPU's phases by the fixed loop."""
from pathlib import Path

import pytest

from inkling_lab import profile as pr, records


def window(loop, plain, out, static, host_shift=2.0):
    w = {"python_loop_us": loop}
    for batch, extra in (("resident", 0.0), ("host_batch", host_shift)):
        w |= {f"{batch}_us": plain + extra, f"{batch}_out_us": out + extra, f"{batch}_static_us": static + extra}
    return w


WINDOWS = [window(1.0, 30.0, 29.0, 14.0), window(1.1, 34.0, 31.0, 16.0), window(2.2, 50.0, 47.0, 25.0),
           window(1.2, 32.0, 30.0, 15.0), window(2.0, 44.0, 39.0, 24.0)]
"""Three fast windows (the loop 1.0-1.2 µs) and two slow ones (2.0-2.2: at least 1.5x the fastest)."""


def test_windows_split_by_the_fixed_loop_against_the_fastest():
    phases = pr.phase_windows(WINDOWS)
    assert [w["python_loop_us"] for w in phases["fast"]] == [1.0, 1.1, 1.2]
    assert [w["python_loop_us"] for w in phases["slow"]] == [2.2, 2.0]
    assert list(pr.phase_windows(WINDOWS[:2])) == ["fast"]         # a phase with no window is left out
    assert pr.phase_windows([]) == {}
    assert list(pr.phase_windows([window(1.0, 1, 1, 1), window(1.49, 1, 1, 1)])) == ["fast"]
    assert list(pr.phase_windows([window(1.0, 1, 1, 1), window(1.5, 1, 1, 1)])) == ["fast", "slow"]


def test_each_phase_batch_and_way_gets_its_range_median_and_target():
    rows = {(r["phase"], r["batch"], r["way"]): r for r in pr.host_phase_rows(WINDOWS)}
    assert len(rows) == 12
    fast = rows[("fast", "resident", "plain")]
    assert (fast["windows"], fast["min"], fast["median"], fast["max"], fast["loop"], fast["met"]) == \
        (3, 30.0, 32.0, 34.0, 1.1, True)
    slow = rows[("slow", "resident", "out=")]
    assert (slow["min"], slow["median"], slow["max"], slow["met"]) == (39.0, 43.0, 47.0, False)  # one window over 40
    assert rows[("slow", "host_batch", "static")]["max"] == 27.0 and rows[("slow", "host_batch", "static")]["met"]
    assert rows[("fast", "host_batch", "plain")]["median"] == 34.0


def test_the_table_names_each_phase_and_every_way():
    text = pr.host_phase_table(WINDOWS)
    lines = text.splitlines()
    assert lines[0] == "fast phase: 3 windows, the fixed loop 1.1 µs"
    assert lines[7] == "slow phase: 2 windows, the fixed loop 2.1 µs"
    assert "  resident   out=    39.0- 47.0 µs (median  43.0)  target 4 not met" in lines
    assert sum("target 4 met" in line for line in lines) == 8         # the six fast, the two slow static


@pytest.mark.parametrize("name", ["h200_host_v15.json", "h100_host_v53_a.json"])
def test_the_recorded_runs_split_into_both_phases(name):
    """The two recorded host runs each saw both of their CPU's phases (v15: 40 windows, v53 a: 4 fast, 8 slow)."""
    rec = records.load_record(Path(__file__).parent.parent / "data" / "profiles" / name, ("host_phases",), "host record")
    phases = pr.phase_windows(rec["host_phases"])
    assert set(phases) == {"fast", "slow"}
    assert sum(map(len, phases.values())) == len(rec["host_phases"])
