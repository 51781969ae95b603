"""``kept_streams`` (v24) on the CPU under Triton's interpreter: one ``torch.mm`` per run on the copies,
the kit's activation between, is the adapters' forward for runs with a kept slot between them and for
either gate/up layout."""
import dataclasses

import pytest
import torch

from interpreted import import_interpreted
from inkling_lab.batch import SlotBatch
from inkling_lab.forward.reference import reference_forward
from inkling_lab.geometry import Geometry
from inkling_lab.scenario import Scenario


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_kept_streams_is_the_reference_forward(interleaved, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    tb = import_interpreted("inkling_lab.forward.kernels", "inkling_lab.forward.triton_backend")
    import kept_streams as ks

    monkeypatch.setattr(ks, "tb", tb)  # the activation launch under the interpreter

    g = Geometry(n=2, hidden=40, intermediate=24, max_rank=8, slots=4)
    sc = Scenario.random(g, tokens=29, seed=3, interleaved=interleaved)
    scalings = [0.6, 1.0, 1.4, 0.8]
    sc.sink.keep_merged(dict(enumerate(scalings)))
    ops = sc.sink.operands()
    batch = SlotBatch.from_segments([7, 22], [0, 3], 4, scalings=scalings)
    cublas = tb.Tiles(bm=16, bf=16, bn=16, bk=16, k_chunk=16, warps=4, stages=2, cublas=True)
    p = tb.plan(ops, 29, batch, sc.x.device, cublas)
    p = dataclasses.replace(p, **tb.kept_operands(p.slots.cpu(), [0, 3], sc.x.device), fast={})
    out = torch.full_like(sc.x, float("nan"))
    ks.kept_streams(ops, sc.x, sc.gammas, p, out)
    ref = reference_forward(ops, sc.x, sc.gammas, batch)
    assert float((out - ref).norm() / ref.norm()) < 1e-5
