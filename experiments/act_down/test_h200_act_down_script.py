"""``h200_act_down.py`` (beside this file)'s correctness pass on the CPU (``interpreted.sweep_script``), so
the GPU call cannot die of a typo: every contender of the folds it sweeps (by default the kept copies through
the library's ``up_act_kernel``, split or not) is the adapter's forward at 2, 9 and 32 tokens of one slot, every
swept tile is one the kernels take and computes the adapter's forward at real sizes, and ``decide`` reads the
routing off times made by hand."""
import sys
from pathlib import Path

import pytest

from interpreted import import_interpreted, stubbed_sweep, sweep_script


@pytest.fixture
def script(monkeypatch):
    with sweep_script("h200_act_down", monkeypatch, Path(__file__).resolve().parent) as (module, tb):
        sys.modules.pop("act_down", None)  # imported with the script: no other test sees that copy
        monkeypatch.setattr(module, "ad", import_interpreted("inkling_lab.forward.kernels", "act_down"))
        yield module


def test_the_act_down_pass_checks_every_contender(script):
    rows = script.correctness()
    assert len(rows) == 24  # two shapes, both gate/up layouts, two dtypes, three token counts
    assert all(r["ok"] for r in rows), [r["rel_err"] for r in rows]
    names = ("kit", "kept", "up_act_f32k128s4")
    assert all(set(r["rel_err"]) == {k + g for k in names for g in ("", "_graph")} for r in rows)


def test_every_swept_tile_is_one_the_kernel_takes(script):
    assert set(script.VARIANTS) == {*script.ad.FOLDS, "slot"} == set(script.PREFIX) == set(script.REPLACES)
    assert set(script.SWEPT) <= set(script.VARIANTS)
    for fold, tiles in script.VARIANTS.items():
        for name, v in tiles.items():
            t = script.ad.tiles(8, **v)
            assert (t.bt, t.bh, t.bk, t.stages, t.warps, t.split) == (
                16, v["bh"], v["bk"], v["stages"], v.get("warps", 4), v.get("split", 1)), name
            assert name.endswith(f"x{t.split}") == (t.split > 1), name  # the name says the split


def test_the_sweep_times_every_contender_at_every_point(script, monkeypatch):
    """The sweep on the CPU (``interpreted.stubbed_sweep``): every point has every contender checked
    against the float64 reference and timed."""
    rows = stubbed_sweep(script, monkeypatch, TOKENS=(2, 19))
    every = {"kit", "kept", "sglang_base", *(script.name(f, t) for f in script.SWEPT for t in script.VARIANTS[f])}
    slot_only = {"kit", "sglang_base", *(script.name(f, t) for f in script.SWEPT if f.startswith("slot")
                                         for t in script.VARIANTS[f])}
    assert [(r["R"], r["T"]) for r in rows] == [(16, 2), (16, 19), (64, 2), (64, 19)]
    for r in rows:
        names = every if r["R"] == script.KEPT_RANK else slot_only
        assert set(r["rel_err"]) == names and max(r["rel_err"].values()) < 1e-5, r["rel_err"]
        assert set(r["us"]) == {k + "@read" for k in names}


@pytest.mark.parametrize("shape, rank", [("A", 16), ("A", 64), ("Inkling-TP8", 64)])
def test_every_swept_tile_is_the_adapters_forward_at_the_real_sizes(shape, rank, monkeypatch):
    """The sweep's own tiles at the real sizes of shape A (n 2, H 1536, F 768: whole 128- and 256-wide steps
    in each expert, 12-48 programs, split tiles whose last slices of ``H`` are empty) and of the TP-8 slice
    (F 384, H 6144), 8 and 32 tokens, in float32 under the interpreter: each fold the run sweeps (``SWEPT``),
    the kept ones at rank 16 (the copies carry no rank), the slot fold at both; every workspace left zero."""
    import torch

    import inkling_lab.forward.triton_backend  # noqa: F401  (as test_act_down.py: the library's module first)
    from inkling_lab import profile as pr
    from inkling_lab.batch import SlotBatch
    from inkling_lab.forward.reference import reference_forward
    from inkling_lab.records import relative_error
    from interpreted import gpu_script, without_overflow_checks

    with gpu_script("h200_act_down", Path(__file__).resolve().parent) as module:
        sys.modules.pop("act_down", None)
        ad = import_interpreted("inkling_lab.forward.kernels", "act_down")
        folds = {f: module.VARIANTS[f] for f in module.SWEPT if rank == module.KEPT_RANK or f.startswith("slot")}
        for T in (8, 32):
            sc = pr.Case.of(shape, rank, 2, T, dtype="float32").scenario("cpu", seed=T)
            batch = SlotBatch.from_segments([T], [1], 2, scalings=[1.0, 1.3])
            sc.sink.keep_merged({1: 1.3})
            ops = sc.sink.operands()
            want = reference_forward(ops, sc.x, sc.gammas, batch)
            for fold, tiles in folds.items():
                for name, v in tiles.items():
                    out = torch.full_like(sc.x, float("nan"))
                    t = ad.tiles(T, **v)
                    work = ad.workspace(ops, T, t, "cpu")
                    with without_overflow_checks():
                        if fold == "slot":
                            ad.slot_forward(ops, sc.x, sc.gammas, 1, torch.tensor([1.0, 1.3]), out, t)
                        else:
                            ad.kept_forward(ops, sc.x, sc.gammas, 0, out, t, fold, work)
                    assert relative_error(out, want, "fro") < 1e-5, (fold, name, T)
                    assert not work[0].any() and not work[1].any(), (fold, name, T)


def test_decide_reads_what_to_route_from_the_record(script, monkeypatch):
    """Times made here: the up fold ahead of the kept path at 2 and 8 tokens on A and behind at 32, under the
    base at A T 2 only, and at 8 ahead in one flush only on a second run (not ahead); the slot fold ahead of
    the kit at 2 tokens, judged only when the run swept it."""
    def row(R, T, **us):
        return {"shape": "A", "R": R, "T": T, "us": {f"{k}@{fl}": v * (1.01 if fl == "write" else 1.0)
                                                     for k, v in us.items() for fl in ("read", "write")}}

    up, slot = script.name("up", "f64k128s4x4"), script.name("slot", "h64k64s3")
    points = [row(16, 2, kit=20.0, kept=18.0, sglang_base=17.0, **{up: 16.5, slot: 19.0}),
              row(16, 8, kit=22.0, kept=18.0, sglang_base=17.0, **{up: 17.5, slot: 23.0}),
              row(16, 32, kit=23.0, kept=18.5, sglang_base=18.0, **{up: 19.0, slot: 24.0}),
              row(64, 2, kit=21.0, sglang_base=17.0, **{slot: 20.0})]
    d = script.decide(points)
    assert set(d) == {"up"}
    assert [a["point"] for a in d["up"]["ahead"]] == [("A", 16, 2), ("A", 16, 8)]
    assert d["up"]["up_to"] == {"A": 8} and d["up"]["under_base"] == [("A", 16, 2)]
    assert d["up"]["ahead"][0]["tiles"] == up and d["up"]["ahead"][0]["kept"] == 18.0
    points[1]["us"][f"{up}@write"] = 18.0 * 1.02  # behind kept (18.18) in the write flush
    assert script.decide(points)["up"]["up_to"] == {"A": 2}
    monkeypatch.setattr(script, "SWEPT", ("up", "slot"))
    d = script.decide(points)
    assert [a["point"] for a in d["slot"]["ahead"]] == [("A", 16, 2), ("A", 64, 2)] and d["slot"]["up_to"] == {"A": 2}
