"""``scripts/gpu/h200_pdl.py``'s correctness pass on the CPU: Triton's interpreter, float32, a
tiny shape, the CUDA-only steps stubbed (a graph replays by calling the launch again), PDL off
(the interpreter has no grid dependency control). So the H200 call cannot die of a typo or of
a renamed profile helper, and the pass flags a forward that leaves its output unwritten."""
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from interpreted import import_interpreted, without_overflow_checks
from inkling_lab import profile as pr, records
from inkling_lab.geometry import PRESETS
from inkling_lab.batch import SlotBatch
from inkling_lab.forward.reference import reference_forward

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def script(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.syspath_prepend(str(ROOT / "scripts" / "gpu"))
    tb = import_interpreted("inkling_lab.forward.kernels", "inkling_lab.forward.triton_backend")
    module = import_interpreted("h200_pdl")
    sys.modules.pop("h200_pdl", None)
    monkeypatch.setattr(module, "tb", tb)
    monkeypatch.setitem(module.VARIANTS, "pdl", {"pdl": False})
    monkeypatch.setattr(module, "CHECK_TOKENS", (9,))  # the interpreter is slow: one token count
    monkeypatch.setattr(pr, "SHAPES", {"A": "A"})
    monkeypatch.setitem(PRESETS, "A", PRESETS["A"].with_(n=2, hidden=32, intermediate=16))
    scenario = pr.Case.scenario
    monkeypatch.setattr(pr.Case, "scenario", lambda c, device, **kw: scenario(replace(c, dtype="float32"), "cpu", **kw))
    monkeypatch.setattr(pr, "capture", lambda fn: type("Graph", (), {"replay": staticmethod(fn)})())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    to = SlotBatch.to
    monkeypatch.setattr(SlotBatch, "to", lambda self, device: to(self, "cpu"))
    with without_overflow_checks():  # test_triton.py runs these kernels with the check
        yield module


@pytest.mark.slow
def test_the_correctness_pass_runs_every_check_and_flags_an_unwritten_output(script, monkeypatch):
    rows = script.correctness()
    assert len(rows) == 8  # every layout and dtype of A, one variant
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert {"mixed", "no_adapter", "graph", "resident", "base_only"} <= set(rows[0]["rel_err"])
    assert_unwritten_output_flagged(script, monkeypatch, script.correctness)


def assert_unwritten_output_flagged(script, monkeypatch, correctness) -> None:
    """``correctness()`` (a pass built on ``script``'s ``check``) fails every row once the forward leaves its output
    unwritten (NaN), eagerly and in graph replays."""
    unwritten = lambda ops, x, *a: torch.full_like(x, float("nan"))  # noqa: E731
    monkeypatch.setattr(script, "run", unwritten)
    monkeypatch.setattr(script, "graph_replays", unwritten)
    assert not any(r["ok"] for r in correctness())


@pytest.mark.slow
def test_the_gathered_epilogues_pass_the_same_checks(script, monkeypatch):
    monkeypatch.setitem(script.VARIANTS, "gather", {"pdl": False, "gather": True})
    monkeypatch.setattr(script, "CHECKED", ["gather"])
    rows = script.correctness()
    assert len(rows) == 8 and {r["variant"] for r in rows} == {"gather"}
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]


@pytest.mark.slow
def test_the_up_gemm_with_the_lora_epilogue_passes_the_same_checks(script, monkeypatch):
    """v33's variants (``--up-act``): ``up_act_kernel`` as the up launch (``Tiles.lora_up``), at tiles small enough
    to leave remainders at the tiny shape, through every check of the pass."""
    monkeypatch.setitem(script.VARIANTS, "upact", {"pdl": False, "lora_up": True})
    monkeypatch.setattr(script, "CHECKED", ["upact"])
    monkeypatch.setattr(script.tb, "UP_ACT_TILES", replace(script.tb.UP_ACT_TILES, bf=16, bk=16, stages=2))
    monkeypatch.setattr(script.tb, "UP_ACT_PROGRAMS", 1)  # unsplit at the tiny shape's two feature blocks
    ops = PRESETS["A"]
    assert script.lora_up_tiles(9, SimpleNamespace(n=ops.n, intermediate=ops.intermediate, hidden=ops.hidden)).bf == 16
    rows = script.correctness()
    assert len(rows) == 8 and {r["variant"] for r in rows} == {"upact"}
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]


def test_a_stream_ceiling_record_of_another_card_is_refused(script, monkeypatch):
    """``stream_ceilings``: the record's own card or nothing (h200_gemv_v32.json's fractions came from an H100's
    ceilings on an H200), the rows by shape otherwise."""
    h100 = str(ROOT / "data" / "profiles" / "h100_stream_ceiling_b.json")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    with pytest.raises(SystemExit, match="made on NVIDIA H100 80GB HBM3, this is NVIDIA H200"):
        script.stream_ceilings(h100)
    assert script.stream_ceilings(str(ROOT / script.CEILING_RECORD))["inkling"] == pytest.approx(56.51, abs=0.01)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert script.stream_ceilings(h100)["A"] == pytest.approx(9.90, abs=0.01)


@pytest.mark.slow
def test_the_bare_forwards_are_the_forward_without_its_lora(script):
    """``--bare``'s three contenders (the default kit's launches, ``up_act_kernel`` and the down kernel,
    ``up_act_kernel`` and the down GEMM) give the reference forward without the LoRA, twice in a row (the second
    launch on the workspaces the first left), on the tiny shape where ``up_act_kernel`` runs split."""

    sc = pr.Case.of("A", 16, 2, 9).scenario("cuda")
    ops = sc.sink.operands()
    ref = reference_forward(ops, sc.x, sc.gammas, None)
    fns = script.bare_forwards(ops, sc.x, sc.gammas)
    assert set(fns) == {"kit_bare_base", "upact_bare_base", "upact_cublas_base"}
    for name, fn in fns.items():
        for _ in range(2):
            assert records.relative_error(fn(), ref, "fro") < 1e-5, name
    assert records.relative_error(sc.sink.base_forward(sc.x, sc.gammas), reference_forward(ops, sc.x, sc.gammas, sc.batch),
                                  "fro") > 1e-3  # the batch's LoRA matters, so the bare forwards really left it out


@pytest.mark.slow
def test_the_gemv_scripts_correctness_pass_checks_each_candidate(script, monkeypatch):
    """``scripts/gpu/h200_gemv.py``'s pass (it drives ``h200_pdl``'s checks): every candidate of ``CHECKED`` right on
    every layout of the tiny shape at one token, a rank-0 token included, so its device call cannot die of a typo."""
    gemv = import_interpreted("h200_gemv")
    sys.modules.pop("h200_gemv", None)
    monkeypatch.setattr(gemv, "tb", script.tb)
    monkeypatch.setattr(gemv, "h200_pdl", script)
    monkeypatch.setitem(gemv.CANDIDATES, "f4k1024", dict(bf=4, bk=16, bn=4, dk=8, pdl=False))
    monkeypatch.setitem(gemv.CANDIDATES, "f8k512", dict(bf=8, bk=16, bn=8, dk=16, pdl=False))
    monkeypatch.setitem(gemv.CANDIDATES, "f4k1024n16s4", dict(bf=4, bk=8, bn=16, dk=4, pdl=False, stages=3))
    rows = gemv.correctness()
    assert len(rows) == 24 and {r["variant"] for r in rows} == set(gemv.CHECKED) == {"f4k1024", "f8k512", "f4k1024n16s4"}
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert {"mixed", "no_adapter", "graph", "rank0"} <= set(rows[0]["rel_err"])


@pytest.fixture
def one_slot(script, monkeypatch):
    """``scripts/gpu/h200_one_slot.py`` on the same interpreted backend and stubs (it drives ``h200_pdl``'s checks),
    its correctness shapes shrunk as ``A`` is (both at 2 experts, ``H`` 32, ``F`` 16)."""
    module = import_interpreted("h200_one_slot")
    sys.modules.pop("h200_one_slot", None)
    monkeypatch.setattr(module, "tb", script.tb)
    monkeypatch.setattr(module, "h200_pdl", script)
    monkeypatch.setitem(PRESETS, "inkling-tp8", PRESETS["inkling-tp8"].with_(n=2, hidden=32, intermediate=16))
    monkeypatch.setitem(pr.SHAPES, "Inkling-TP8", "inkling-tp8")
    monkeypatch.setattr(module, "CHECK_TOKENS", (37, 70))  # the interpreter is slow: a partial tile and a few
    monkeypatch.setattr(module, "MULTI_CHECKS", (("A", 45), ("Inkling-TP8", 37)))
    return module


@pytest.mark.slow
def test_the_one_slot_scripts_expand_pass_checks_every_tile(one_slot, monkeypatch):
    """v36's pass (``--expand``): the chain as routed and on each of ``EXPAND_TILES``, at a partial tile and at 70
    tokens, both gate/up layouts, right, graph replays included; a chain that leaves its output unwritten is flagged."""
    rows = one_slot.correctness(one_slot.EXPAND_VARIANTS)
    assert len(rows) == 16 and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert set(rows[0]["rel_err"]) >= {"routed", "routed_graph", *one_slot.EXPAND_TILES}
    monkeypatch.setattr(one_slot.tb, "_launch_single", lambda ops, x, *a: x.fill_(float("nan")))
    assert not any(r["ok"] for r in one_slot.correctness({"routed": one_slot.EXPAND_VARIANTS["routed"]}))


@pytest.mark.slow
def test_the_one_slot_scripts_runs_pass_checks_mixed_and_sorted_tokens(one_slot, monkeypatch):
    """v36c's pass (``--multi --expand``): the several-slot path with ``expand_act_kernel`` over the batch's runs, on
    its mixed tokens and on the same tokens sorted by slot, every layout and outer, right (graph replays included)."""
    monkeypatch.setattr(one_slot.tb, "SMALL_WEIGHTS", 0)  # the tiny TP-8 slice stands for the real one: the cuBLAS path
    rows = one_slot.multi_correctness(expand=True)
    assert len(rows) == 16 and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert {"runs_mixed", "runs_mixed_graph", "runs_sorted", "runs_sorted_graph"} <= set(rows[0]["rel_err"])
    assert one_slot.tb.EXPAND_RUN_TOKENS == 64  # with_runs put the routed constant back


@pytest.mark.slow
def test_the_one_slot_scripts_cats_pass_checks_each_several_slot_path(one_slot, monkeypatch):
    """v37's pass (``--multi --cats``): the down expand as more of the down GEMM's ``K`` on the mixed batch and, in
    slot order, through the grouped GEMMs (``epi``), right (graph replays included) at the shared outer; a
    down side that leaves its output unwritten is flagged; the routed constants are put back."""
    monkeypatch.setattr(one_slot.tb, "SMALL_WEIGHTS", 0)
    rows = one_slot.multi_correctness(cats=True)
    assert len(rows) == 16 and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    shared = [r for r in rows if r["outer"] == 1]
    assert len(shared) == 8 and all({"cats_mixed", "cats_epi", "cats_epi_graph"} <= set(r["rel_err"]) for r in shared)
    assert one_slot.tb.SLOT_CAT_TOKENS == 2048 and one_slot.tb.MERGE_RATIO == 2.0
    monkeypatch.setattr(one_slot.tb, "_down_slot_cats", lambda ops, act_cat, mid, p, out, *a: out.fill_(float("nan")))
    assert not any(r["ok"] for r in one_slot.multi_correctness(cats=True) if r["outer"] == 1)


@pytest.mark.slow
def test_the_one_slot_scripts_down_pass_checks_each_several_slot_path(one_slot, monkeypatch):
    """v38's pass (``--multi --down``): the down expand over the batch's runs on the mixed batch and, in slot order,
    through the grouped GEMMs (``epi``), right (graph replays included) at the shared outer; a down expand that
    leaves its output unwritten is flagged; the routed constant is put back."""
    monkeypatch.setattr(one_slot.tb, "SMALL_WEIGHTS", 0)
    rows = one_slot.multi_correctness(down=True)
    assert len(rows) == 16 and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    shared = [r for r in rows if r["outer"] == 1]
    assert len(shared) == 8 and all({"down_mixed", "down_epi", "down_epi_graph"} <= set(r["rel_err"]) for r in shared)
    assert one_slot.tb.DOWN_RUN_TOKENS == 256
    monkeypatch.setattr(one_slot.tb, "_down_expand", lambda ops, act, out, *a, **k: out.fill_(float("nan")))
    assert not any(r["ok"] for r in one_slot.multi_correctness(down=True) if r["outer"] == 1)


@pytest.mark.slow
def test_the_few_tile_scripts_correctness_pass_checks_each_candidate(script, monkeypatch):
    """``scripts/gpu/h200_few_tiles.py``'s pass (v48; it drives ``h200_pdl``'s checks): every candidate right on every
    layout of the tiny shape at 8 and 32 tokens (a rank-0 slot and base-only tokens in the batch), at steps under the
    tiny ``H``, with 4 features a tile and 8 tokens a tile (a ``tl.dot`` Triton pads to 16 both ways), so its device call cannot
    die of a typo; a forward that leaves its output unwritten is flagged."""
    few = import_interpreted("h200_few_tiles")
    sys.modules.pop("h200_few_tiles", None)
    monkeypatch.setattr(few, "tb", script.tb)
    monkeypatch.setattr(few, "h200_pdl", script)
    small = {"f4k16s2": script.tb.Tiles(8, 4, 8, 16, 128, 4, 2, gather=True),
             "f8k32s3w2": script.tb.Tiles(8, 8, 16, 32, 128, 2, 3, gather=True)}
    monkeypatch.setattr(few, "CANDIDATES", small)
    assert few.tiles("f4k16s2", 8).bm == 8 and few.tiles("f4k16s2", 32).bm == 32  # one token tile of all of them
    rows = few.correctness()
    assert len(rows) == 32 and {r["variant"] for r in rows} == set(small)
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert {"mixed", "no_adapter", "graph", "resident", "base_only"} <= set(rows[0]["rel_err"])
    narrowed = few.correctness(["f4k16s2"], ["A"])  # --check-only's pass: one candidate, the shapes named
    assert [(r["variant"], r["T"], r["dtype"]) for r in narrowed] == [
        (r["variant"], r["T"], r["dtype"]) for r in rows if r["variant"] == "f4k16s2"]
    assert_unwritten_output_flagged(script, monkeypatch, few.correctness)


@pytest.mark.slow
def test_the_few_tile_scripts_sweep_times_every_candidate_with_and_without_its_lora(script, monkeypatch):
    """The sweep's contenders (``h200_few_tiles.contenders``) at 8 tokens of the tiny shape: ``auto``, each candidate
    with the batch's LoRA, ``auto``'s tiles and each candidate without an adapter (``*_bare_base``), and the upstream
    class's no-LoRA base, each the forward it names (the float64 reference with or without the LoRA)."""
    few = import_interpreted("h200_few_tiles")
    sys.modules.pop("h200_few_tiles", None)
    monkeypatch.setattr(few, "tb", script.tb)
    monkeypatch.setattr(few, "h200_pdl", script)
    monkeypatch.setattr(few, "CANDIDATES", {"f4k16s2": script.tb.Tiles(8, 4, 8, 16, 128, 4, 2, gather=True)})

    class Base:  # sglang's no-LoRA base stands in as the sink's own base forward
        def __init__(self, sink, batch, min_slots):
            self.sink = sink

        def forward(self, x, gammas, lora):
            assert lora is False
            return self.sink.base_forward(x, gammas)

    sc = pr.Case.of("A", 16, 4, 8).scenario("cuda")
    ops = sc.sink.operands()
    fns = few.contenders(Base)(sc.sink, ops, sc.x, sc.gammas, sc.batch)
    assert set(fns) == {"auto", "auto_bare_base", "f4k16s2", "f4k16s2_bare_base", "sglang_base"}
    ref, ref_base = (reference_forward(ops, sc.x, sc.gammas, b) for b in (sc.batch, None))
    for name, fn in fns.items():
        want = ref_base if name.endswith("_base") else ref
        assert records.relative_error(fn(), want, "fro") < 1e-5, name
    assert records.relative_error(ref, ref_base, "fro") > 1e-3  # the batch's LoRA matters


@pytest.mark.slow
@pytest.mark.parametrize("flag, field", [("PDL_UP", "pdl_up"), ("DOWN_SHRINK", "down_shrink")])
def test_the_optional_variants_pass_the_same_checks(script, monkeypatch, flag, field):
    """v50b's variant (``--pdl-up``: ``Tiles.pdl_up``) and v52's (``--down-shrink``: ``Tiles.down_shrink`` on each
    chaining) through every check of the pass, the one-slot batch's among them (where the down shrink moves), and at
    tokens the caller names (``--check-tokens``); the interpreter has no grid dependency control, so this holds their
    launches to the same math (the GPU run checks the chaining)."""
    extra = getattr(script, flag)
    for name, fields in extra.items():  # what the flag adds
        monkeypatch.setitem(script.VARIANTS, name, fields)
        assert getattr(script.tiles(name, 5, PRESETS["A"]), field)
    monkeypatch.setattr(script, "CHECKED", list(extra))
    rows = script.correctness(tokens=(5,))
    assert len(rows) == 8 * len(extra) and {r["variant"] for r in rows} == set(extra) and {r["T"] for r in rows} == {5}
    assert all("one_slot" in r["rel_err"] for r in rows)
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
