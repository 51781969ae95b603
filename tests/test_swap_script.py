"""``scripts/gpu/h200_swap.py`` on the CPU (``interpreted.sweep_script``: a tiny A in float32, ``swaps`` brought down to
it): the two arms are the two arrangements of the one-slot chain, each the adapters' forward, so the GPU call cannot
die of a typo or time one arrangement twice."""
import torch

from interpreted import stubbed_sweep, sweep_fixture
from inkling_lab import profile as pr
from inkling_lab.forward.reference import reference_forward


script = sweep_fixture("h200_swap")


def _swaps_at_a(tb, monkeypatch):
    """The tiny A's one slot on the chain (these weights standing for B-sized ones), swapped from 32 tokens."""
    monkeypatch.setattr(tb, "FOLD_TOKENS", 1 << 30)
    monkeypatch.setattr(tb, "SMALL_WEIGHTS", 0)
    monkeypatch.setattr(tb, "MERGE_RATIO", 1e9)  # tiny weights merge from a few tokens
    monkeypatch.setattr(tb, "SWAP_TOKENS", 32)
    monkeypatch.setattr(tb, "SWAP_FEATURES", 8)
    monkeypatch.setattr(tb, "SWAP_SHRINK_ELEMS", 0)


def test_the_arms_are_the_two_arrangements_and_each_is_the_forward(script, monkeypatch):
    module, tb = script
    _swaps_at_a(tb, monkeypatch)
    sc = pr.Case.of("A", 16, 1, 40).scenario("cpu")
    ops = sc.sink.operands()
    arms = module.plans(ops, 40, sc.batch, sc.x.device)
    assert arms["routed"].offs is not None and arms["beside"].offs is None
    assert tb.SWAP_TOKENS == 32  # put back after planning `beside`
    ref = reference_forward(ops, sc.x, sc.gammas, sc.batch)
    for name, fn in module.contenders(sc.sink, sc.x, sc.gammas, sc.batch).items():
        got = fn().double()
        assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4), (name, (got - ref).abs().max())


def test_the_correctness_pass_and_the_sweep_run_every_arm(script, monkeypatch):
    module, tb = script
    _swaps_at_a(tb, monkeypatch)
    monkeypatch.setattr(module, "CHECKS", (("A", 16, 37),))
    rows = module.correctness()
    assert len(rows) == 2 and all(r["ok"] for r in rows), [r["rel_err"] for r in rows]
    assert all(set(r["rel_err"]) == {k + g for k in ("routed", "beside") for g in ("", "_graph")} for r in rows)
    monkeypatch.setattr(module, "RANKS", (16,))
    rows = stubbed_sweep(module, monkeypatch, TOKENS=(40,))
    names = {"routed", "beside", "sglang_base"}
    assert [(r["shape"], r["R"], r["T"]) for r in rows] == [("A", 16, 40)]
    assert set(rows[0]["rel_err"]) == names and max(rows[0]["rel_err"].values()) < 1e-5, rows[0]["rel_err"]
    assert set(rows[0]["us"]) == {k + "@read" for k in names}
