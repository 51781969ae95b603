"""How two passes of the side by side agree (``profile.passes``, ``inkling-lab profile --show FIRST
--against SECOND``): the spread of each contender's medians and the target verdicts that differ, on
records made here with known times (the expected numbers worked out by hand in each test), the
refusals, and the committed record against its second pass as KERNEL_NOTES quotes it."""
import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from in_process import run_cli
from inkling_lab import profile as pr

PROFILES = Path(__file__).resolve().parents[1] / "data" / "profiles"
RECORDED, SECOND = PROFILES / "h200_side_by_side.json", PROFILES / "history" / "h200_side_by_side_2.json"
PASSES = [(RECORDED, SECOND), (PROFILES / "h100_side_by_side.json", PROFILES / "history" / "h100_side_by_side_2.json")]
"""Each card's recorded side by side and its second pass, as KERNEL_NOTES quotes their agreement."""


def _point(shape, S, T, **us):
    c = pr.Case.of(shape, 16, S, T)
    roof = pr.roofline(c, 4.2, 780)
    return {"case": c.record(), "roofline_us": roof.us, "bound": roof.bound, "rel_err": {},
            "times": {"read": {k: {"median_us": v} for k, v in us.items()}}}


def _record(points, date="2026-12-04T20:00:00+00:00", commit="a" * 40):
    return {"environment": {"device": "NVIDIA H200", "date": date, "git_commit": commit}, "ceilings": {},
            "upstream": {}, "modes": ["read"], "points": points}


def _pair():
    first = _record([_point("A", 4, 1, kit_triton=5.0, sglang_multi=20.0, sglang_base=6.0),
                     _point("A", 4, 8192, kit_triton=200.0, sglang_multi=500.0, sglang_base=185.0)])
    second = copy.deepcopy(first)
    second["environment"]["date"] = "2026-12-04T20:05:00+00:00"
    t1, t2 = (p["times"]["read"] for p in second["points"])
    t1["kit_triton"]["median_us"] = 6.3      # +26 %: now over the base's 6.0 (target 1 lost), under 3x the roofline
    t2["kit_triton"]["median_us"] = 196.0    # -2 %: still within 1.1x of the base
    t2["sglang_base"]["median_us"] = 175.0   # -5.4 %: 196 / 175 = 1.12, over 1.1x (target 3 lost)
    return first, second


def test_the_spread_is_each_contenders_run_to_run_difference_and_the_flips_are_named():
    first, second = _pair()
    ag = pr.pass_agreement(first, second)
    spread = {s["contender"]: s for s in ag["spread"]}
    assert set(spread) == {"kit_triton", "sglang_multi", "sglang_base"}
    kit = spread["kit_triton"]
    assert kit["points"] == 2 and kit["max"] == pytest.approx(0.26) and kit["worst"] == "A R16 S4 T1"
    assert kit["median"] == pytest.approx((0.26 + 0.02) / 2)
    assert spread["sglang_multi"]["max"] == 0 and spread["sglang_base"]["worst"] == "A R16 S4 T8192"
    assert spread["sglang_base"]["max"] == pytest.approx(10.0 / 185.0)
    flips = {(f["point"], f["target"]): f for f in ag["flips"]}
    assert set(flips) == {("A R16 S4 T1", "beats_base"), ("A R16 S4 T8192", "beats_base")}
    one = flips[("A R16 S4 T1", "beats_base")]
    assert one["met_first"] and one["first"] == pytest.approx(5 / 6) and one["second"] == pytest.approx(6.3 / 6)
    assert flips[("A R16 S4 T8192", "beats_base")]["second"] == pytest.approx(196 / 175)
    text = pr.pass_agreement_text(first, second)
    assert "| read | kit_triton | 2 | 14.0% | 26.0% | 26.0% | A R16 S4 T1 |" in text
    assert "- kit_triton, read flush, A R16 S4 T1: vs base 0.833x then 1.050x (met in the first pass only)" in text
    assert "(commit aaaaaaa)" in text and "20:05:00" in text


def test_a_contender_timed_in_one_pass_only_is_counted_where_both_timed_it():
    first, second = _pair()
    first["points"][1]["times"]["read"]["kit_kept"] = {"median_us": 190.0}
    second["points"][1]["times"]["read"]["kit_kept"] = {"median_us": 209.0}
    second["points"][0]["times"]["read"]["kit_kept"] = {"median_us": 11.0}  # no first-pass time: not compared
    kept = next(s for s in pr.pass_agreement(first, second)["spread"] if s["contender"] == "kit_kept")
    assert kept["points"] == 1 and kept["max"] == pytest.approx(0.1)


def test_two_identical_passes_agree_everywhere():
    first, _ = _pair()
    assert "every target verdict is the same in both passes" in pr.pass_agreement_text(first, copy.deepcopy(first))


@settings(max_examples=25, deadline=None)
@given(times=st.lists(st.tuples(st.floats(1.0, 1e4), st.floats(0.5, 2.0)), min_size=1, max_size=12))
def test_the_spread_is_the_median_90th_percentile_and_max_of_the_differences(times):
    """Any medians and any second-pass factors: the spread is computed over ``|f - 1|`` of each point."""
    first = _record([_point("B", 1, 8 * (i + 1), kit_triton=t, sglang_base=t) for i, (t, _) in enumerate(times)])
    second = copy.deepcopy(first)
    for p, (t, f) in zip(second["points"], times):
        p["times"]["read"]["kit_triton"]["median_us"] = t * f
    kit = next(s for s in pr.pass_agreement(first, second)["spread"] if s["contender"] == "kit_triton")
    diffs = sorted(abs(t * f / t - 1) for t, f in times)
    n = len(diffs)
    want_median = diffs[n // 2] if n % 2 else (diffs[n // 2 - 1] + diffs[n // 2]) / 2
    assert kit["median"] == pytest.approx(want_median) and kit["max"] == pytest.approx(diffs[-1])
    assert kit["p90"] == pytest.approx(diffs[min(n - 1, int(0.9 * n))])


def test_records_of_different_grids_are_refused_by_the_first_point_that_differs():
    first, second = _pair()
    second["points"][1] = _point("B", 4, 8192, kit_triton=1.0, sglang_multi=1.0, sglang_base=1.0)
    with pytest.raises(ValueError, match="point 1 is A R16 S4 T8192 in the first and B R16 S4 T8192 in the second"):
        pr.pass_agreement(first, second)
    second["points"].pop()
    with pytest.raises(ValueError, match="2 points in the first, 1 in the second"):
        pr.pass_agreement(first, second)


def test_the_command_prints_the_agreement_and_refuses_what_it_cannot_compare(tmp_path):
    first, second = _pair()
    paths = []
    for name, rec in (("first.json", first), ("second.json", second)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(rec))
    done = run_cli("profile", "--show", str(paths[0]), "--against", str(paths[1]))
    assert done.returncode == 0 and pr.pass_agreement_text(first, second) in done.stdout.decode()
    alone = run_cli("profile", "--against", str(paths[1]))
    assert alone.returncode == 2 and b"--against compares a second pass with the record given to --show" in alone.stderr
    broken = copy.deepcopy(second)
    del broken["points"][0]["times"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    bad = run_cli("profile", "--show", str(paths[0]), "--against", str(tmp_path / "broken.json"))
    assert bad.returncode == 2 and b"is not a side-by-side point (KeyError: 'times')" in bad.stderr
    missing = run_cli("profile", "--show", str(paths[0]), "--against", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and b"cannot compare the passes" in missing.stderr
    assert json.loads(paths[1].read_text()) == second  # the inputs are only read


@pytest.mark.parametrize("recorded, second_pass", PASSES, ids=["h200", "h100"])
def test_kernel_notes_quote_the_recorded_passes_agreement(recorded, second_pass):
    if not (recorded.exists() and second_pass.exists()):
        pytest.skip("no second pass of the side by side")
    notes = (Path(__file__).resolve().parents[1] / "KERNEL_NOTES.md").read_text()
    first, second = pr.load_side_by_side(recorded), pr.load_side_by_side(second_pass)
    assert first["points"][0]["case"] == second["points"][0]["case"]
    assert pr.pass_agreement_text(first, second) in notes
