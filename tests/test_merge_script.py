"""``scripts/gpu/h200_merge.py``'s correctness pass on the CPU (``interpreted.sweep_script``). So the
H200 call cannot die of a typo or a renamed helper, and the pass flags a merged launch that misreads a
slot's run (a slot's LoRA on another slot's tokens, or rows left unwritten), merged in the forward or kept. A module of its own: each
of the two passes takes about a minute under the interpreter, and the CI's workers take a module each."""
from dataclasses import replace

import pytest

from interpreted import sweep_script


@pytest.fixture
def script(monkeypatch):
    with sweep_script("h200_merge", monkeypatch) as loaded:
        yield loaded


@pytest.mark.slow
def test_the_merge_pass_checks_runs_and_one_slot_and_flags_a_misread_run(script, monkeypatch):
    module, tb = script
    monkeypatch.setattr(module, "CHECK_SHAPES", ("A",))  # the TP-8 slice runs the same code
    monkeypatch.setattr(tb, "MERGE_TILE", (16, 16, 1))  # several row and column tiles
    rows = module.correctness()
    assert len(rows) == 8  # two dtypes, both gate/up layouts, uneven runs and one slot
    assert all(r["ok"] for r in rows), [r["rel_err"] for r in rows]
    assert all(set(r["rel_err"]) == {k + g for k in ("kit", "merge", "kept") for g in ("", "_graph")}
               for r in rows if r["runs"] == 1 or r["dtype"] == "bfloat16")
    assert all(set(r["rel_err"]) == {"kit", "kit_graph"}  # the grouped GEMM is bfloat16-only on CUDA
               for r in rows if r["runs"] > 1 and r["dtype"] == "float16")
    merged = tb._launch_merged

    def shifted(ops, x, gammas, p, out):  # each run's rows one token late (merged now or kept)
        late = tuple((a + 1, min(b + 1, x.shape[0])) for a, b in p.runs)
        return merged(ops, x, gammas, replace(p, runs=late, offs=(p.offs + 1).clamp(max=x.shape[0])), out)

    monkeypatch.setattr(tb, "_launch_merged", shifted)
    rows = module.correctness()
    checked = [r for r in rows if "merge" in r["rel_err"]]
    assert len(checked) == 6 and all(r["rel_err"]["kit"] < 1e-5 for r in rows)
    assert not any(r["ok"] for r in checked)
    assert not any(r["rel_err"][k] < 1e-4 for r in checked for k in ("merge", "kept"))


def test_the_keep_crossover_is_where_kept_stays_ahead_to_the_end_of_the_grid(script):
    """``keep_crossovers`` reads the sweep's points: a group where the copies win from 2048 tokens but
    lose again at 8192 crosses at none of them (so the suggested ratio routes nothing measured as lost);
    a group that wins from 1024 on crosses there, at ``keeps``' ratio of 1024 tokens."""
    module, _ = script

    def point(shape, S, T, kept, kit):
        return {"shape": shape, "R": 64, "S": S, "T": T, "n": 2, "F": 768, "H": 1536,
                "us": {"kept@read": kept, "kit@read": kit}}

    points = [point("A", 4, 512, 30.0, 25.0), point("A", 4, 1024, 40.0, 41.0), point("A", 4, 2048, 60.0, 70.0),
              point("A", 8, 2048, 60.0, 70.0), point("A", 8, 8192, 200.0, 190.0), point("A", 1, 512, 1.0, 9.0)]
    got = {c["S"]: c for c in module.keep_crossovers(points)}
    assert set(got) == {4, 8} and got[4]["T0"] == 1024 and got[8]["T0"] is None
    assert got[4]["ratio"] == 1024 * (1536 + 1536) / (4 * 1536 * 1536)
    assert module.suggested_keep_ratio(list(got.values())) == float("inf")
    assert module.suggested_keep_ratio([got[4]]) == got[4]["ratio"]
