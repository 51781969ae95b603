"""v48b's FMA stream of a few tokens (``few_fma.bare_forward``) against the float64 reference without LoRA, in
Triton's interpreter (float32): random small shapes, 1-8 tokens, both gate/up layouts, steps that leave remainders of
``H`` and ``F``, both forms of the step's sum."""
import torch
from hypothesis import given, settings, strategies as st

from interpreted import import_interpreted, interpreter_on, without_overflow_checks
from inkling_lab import records

few = import_interpreted("few_fma")


def forward(T, n, H, F, interleaved, seed, told=None, **tiles):
    """The kernels' output (told the gate/up layout ``told``, by default the weights' own) and the float64 forward
    written out here with einsum, on random weights of layout ``interleaved``."""
    gen = torch.Generator().manual_seed(seed)
    w13, w2 = torch.randn(n, 2 * F, H, generator=gen), torch.randn(n, H, F, generator=gen)
    x, gammas = torch.randn(T, H, generator=gen), torch.rand(T, n, generator=gen)
    with interpreter_on(), without_overflow_checks():
        got = few.bare_forward(x, gammas, w13, w2, interleaved if told is None else told, **tiles)
    gate, up = (w13[:, 0::2], w13[:, 1::2]) if interleaved else (w13[:, :F], w13[:, F:])
    g, u = (torch.einsum("th,efh->tef", x.double(), m.double()) for m in (gate, up))
    act = torch.nn.functional.silu(g) * u * gammas.double()[:, :, None]
    return got, torch.einsum("tef,ehf->th", act, w2.double())


@settings(max_examples=12, deadline=None)
@given(T=st.integers(1, 8), n=st.integers(1, 3), H=st.sampled_from([24, 40, 64]), F=st.sampled_from([8, 12, 20]),
       interleaved=st.booleans(), v=st.sampled_from([1, 4]), seed=st.integers(0, 2**16))
def test_the_fma_stream_is_the_forward_without_lora(T, n, H, F, interleaved, v, seed):
    got, want = forward(T, n, H, F, interleaved, seed, bf=2, bk=16, bh=4, dk=8, v=v, stages=3)
    assert records.relative_error(got, want, "fro") < 1e-5


def test_a_wrong_gate_up_layout_is_caught():
    """The reference reads the layout it is told: the kernel told the other one is far off (so the test above can
    fail)."""
    tiles = dict(bf=2, bk=16, bh=4, dk=8, v=1, stages=3)
    got, want = forward(4, 2, 40, 12, True, 3, **tiles)
    assert records.relative_error(got, want, "fro") < 1e-5
    other, _ = forward(4, 2, 40, 12, True, 3, told=False, **tiles)
    assert records.relative_error(other, want, "fro") > 1e-2


def test_the_scripts_contenders_are_the_forward_without_lora(monkeypatch):
    """``h200_few_fma.contenders`` at 8 tokens of a tiny shape (the interpreter, float32): the kit's launches without
    an adapter, each FMA config and the upstream class's base, each the reference forward without LoRA."""
    import sys
    from dataclasses import replace
    from pathlib import Path

    from inkling_lab import profile as pr
    from inkling_lab.forward.reference import reference_forward
    from inkling_lab.geometry import PRESETS

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
    tb = import_interpreted("inkling_lab.forward.kernels", "inkling_lab.forward.triton_backend")
    pdl = import_interpreted("h200_pdl")
    script = import_interpreted("h200_few_fma")
    for name in ("h200_pdl", "h200_few_fma"):
        sys.modules.pop(name, None)
    monkeypatch.setattr(pdl, "tb", tb)
    monkeypatch.setattr(script, "h200_pdl", pdl)
    monkeypatch.setattr(script, "tb", tb)
    monkeypatch.setattr(script, "few_fma", few)
    monkeypatch.setattr(script, "CONFIGS", {"fma_small": dict(bf=2, bk=16, bh=4, dk=8, stages=3)})
    monkeypatch.setitem(PRESETS, "A", PRESETS["A"].with_(n=2, hidden=32, intermediate=16))

    class Base:
        def __init__(self, sink, batch, min_slots):
            self.sink = sink

        def forward(self, x, gammas, lora):
            return self.sink.base_forward(x, gammas)

    sc = replace(pr.Case.of("A", 16, 1, 8), dtype="float32").scenario("cpu")
    ops = sc.sink.operands()
    with interpreter_on(), without_overflow_checks():
        fns = script.contenders(Base)(sc.sink, ops, sc.x, sc.gammas, sc.batch)
        assert set(fns) == {"auto_bare_base", "fma_small_base", "sglang_base"}
        want = reference_forward(ops, sc.x, sc.gammas, None)
        for name, fn in fns.items():
            assert records.relative_error(fn(), want, "fro") < 1e-5, name
