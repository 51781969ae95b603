"""The Triton kernels in Triton's CPU interpreter, against the float64 reference.

SPEC §9: the interpreter mishandles bf16, so these run in float32 at small odd sizes
(bf16 and fp16 are checked on the H200 by ``inkling-lab profile``, whose record holds
the errors). Every check draws fresh random inputs and poisons the output with NaN.

Triton decides at decoration time whether a kernel is interpreted, so this module
imports a private copy of the backend with ``TRITON_INTERPRET=1`` set only for that
import; ``sys.modules``, the package attributes and the environment are restored, so
no other test module in the same worker sees an interpreted kernel or the variable.
"""
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interpreted import import_interpreted
from inkling_lab.batch import SlotBatch
from inkling_lab.forward import StaticIO
from inkling_lab.forward.reference import reference_forward
from inkling_lab.geometry import PRESETS, Geometry
from inkling_lab.lora import SharedSinkLoRA
from inkling_lab.records import relative_error
from inkling_lab.scenario import Scenario

tb = import_interpreted("inkling_lab.forward.kernels", "inkling_lab.forward.triton_backend")
tb.MIN_SPLIT_K = 16  # the split-K reduction runs at these tiny sizes too (on the H200 it starts at K >= 2048)


@pytest.fixture(autouse=True)
def _interpreter_on(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def make_case(n, H, F, R, S, T, outer_shared, interleaved, seed):
    g = Geometry(n=n, hidden=H, intermediate=F, max_rank=R, slots=S, outer=1 if outer_shared else n)
    sc = Scenario.random(g, tokens=T, seed=seed, interleaved=interleaved)
    gen = torch.Generator().manual_seed(seed)
    ranks = [R] * S
    if S > 1:
        ranks[1] = 0  # a rank-0 slot is skipped even though its buffers are not zero
    batch = SlotBatch.from_token_slots(sc.batch.token_slots(), S, lora_ranks=ranks,
                                       scalings=(0.5 + torch.rand(S, generator=gen)).tolist())
    return sc.sink, sc.x, sc.gammas, batch


def run(sink, x, gammas, batch, tiles=None):
    out = torch.full_like(x, float("nan"))
    ops = sink.operands()
    p = tb.plan(ops, x.shape[0], batch, x.device, tiles)
    tb.launch(ops, x, gammas, p, out)
    return out, p


def rel(a, b):
    return relative_error(a, b, norm="fro")


# Tiny tiles so the odd sizes below span several tiles and the shrink splits H in three.
FUSED = tb.Tiles(bm=16, bf=16, bn=16, bk=16, k_chunk=16, warps=2, stages=1)
CUBLAS = tb.Tiles(bm=16, bf=16, bn=16, bk=16, k_chunk=16, warps=2, stages=1, cublas=True)


@pytest.mark.parametrize("tiles", [FUSED, CUBLAS], ids=["fused", "cublas_path"])
@pytest.mark.parametrize("outer_shared", [True, False], ids=["shared_outer", "per_expert_outer"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_kernels_match_the_reference(tiles, outer_shared, interleaved):
    sink, x, gammas, batch = make_case(3, 37, 21, 5, 3, 19, outer_shared, interleaved,
                                       seed=int(outer_shared) + 2 * int(interleaved) + 4 * int(tiles.cublas))
    ref = reference_forward(sink.operands(), x, gammas, batch)
    out, _ = run(sink, x, gammas, batch, tiles)
    assert torch.isfinite(out).all(), "some output element was never written"
    assert rel(out, ref) < 1e-5
    assert rel(sink.base_forward(x, gammas), ref) > 0.05  # the LoRA terms matter at this size


def test_a_replayed_launch_gives_the_same_output_and_leaves_the_workspace_zero():
    sink, x, gammas, batch = make_case(2, 40, 24, 3, 3, 23, True, False, seed=9)
    ref = reference_forward(sink.operands(), x, gammas, batch)
    ops = sink.operands()
    p = tb.plan(ops, x.shape[0], batch, x.device, FUSED)
    for _ in range(2):  # what a CUDA graph replay does: the same plan, the same buffers
        out = torch.full_like(x, float("nan"))
        tb.launch(ops, x, gammas, p, out)
        assert rel(out, ref) < 1e-5
        assert torch.count_nonzero(p.sh) == 0
        assert p.split.up > 1 and p.split.down > 1  # split-K reductions ran, and left their workspaces zero
        for t in (p.split.ws_up, p.split.cnt_up, p.split.ws_down, p.split.cnt_down):
            assert torch.count_nonzero(t) == 0


def test_a_graph_replay_reads_each_calls_inputs_and_hands_out_its_own_output():
    """``_replay`` once its graph is captured, on the host: the graph stands in for the
    captured launches, which read the static inputs and write the static output."""
    sink, x, gammas, batch = make_case(2, 20, 10, 3, 3, 6, True, True, seed=13)
    ops = sink.operands()
    p = tb.cached_plan(ops, x.shape[0], batch, x.device)
    xs, gs, outs = torch.zeros_like(x), torch.zeros_like(gammas), torch.zeros_like(x)

    class Graph:
        def replay(self):
            tb.launch(ops, xs, gs, p, outs)

    p.fast[tb.graph_key(ops, x)], p.fast["io"] = Graph(), StaticIO(xs, gs, outs)
    first = tb._replay(ops, x, gammas, p)
    x2 = torch.randn_like(x)
    second = tb._replay(ops, x2, gammas.double(), p)  # gammas of another dtype: copied in as the graph's
    assert rel(first, reference_forward(ops, x, gammas, batch)) < 1e-5  # not overwritten by the next replay
    assert rel(second, reference_forward(ops, x2, gammas, batch)) < 1e-5
    assert len({first.data_ptr(), second.data_ptr(), outs.data_ptr()}) == 3


def test_graphs_are_for_a_batch_of_1_to_graph_tokens_tokens_on_cuda():
    batch = SlotBatch.from_segments([4], [0], 2, lora_ranks=[3, 3])
    cuda = torch.device("cuda")
    assert [tb.takes_graph(batch, cuda, T) for T in (0, 1, 256, 257)] == [False, True, True, False]
    assert tb.GRAPH_TOKENS == 256
    assert not tb.takes_graph(None, cuda, 4) and not tb.takes_graph(batch, torch.device("cpu"), 4)


class GraphPath:
    """The graph path of ``triton_forward`` on the host: ``takes_graph`` says yes for any
    batch, no capture of the caller's runs, and ``_capture`` hands back a stand-in whose
    replay launches around the static tensors it was given (``captured``). ``copies``
    counts the copies the replay path makes (``torch._foreach_copy_``, ``Tensor.copy_``,
    ``Tensor.clone``), by destination, outside the stand-in's launches (the interpreter
    copies its arguments back)."""

    def __init__(self, monkeypatch):
        self.captured, self.shares, self.copies, self._launching = [], [], [], False
        path = self

        class Graph:
            def __init__(self, ops, p, io):
                self.ops, self.p, self.io = ops, p, io

            def replay(self):
                path._launching = True
                try:
                    tb.launch(self.ops, self.io.x, self.io.gammas, self.p, self.io.out)
                finally:
                    path._launching = False

        def capture(ops, p, io, share=None):
            self.captured.append(io)
            self.shares.append(share)
            return Graph(ops, p, io)

        def counted(name, real):
            def wrapper(*args, **kwargs):
                if not self._launching:
                    self.copies.append(name)
                return real(*args, **kwargs)
            return wrapper

        monkeypatch.setattr(tb, "takes_graph", lambda batch, device, tokens: batch is not None)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        monkeypatch.setattr(tb, "_capture", capture)
        monkeypatch.setattr(torch, "_foreach_copy_", counted("foreach_copy", torch._foreach_copy_))
        monkeypatch.setattr(torch.Tensor, "copy_", counted("copy", torch.Tensor.copy_))
        monkeypatch.setattr(torch.Tensor, "clone", counted("clone", torch.Tensor.clone))

    def take(self) -> list[str]:
        seen, self.copies = self.copies, []
        return seen


def test_static_tensors_passed_back_are_neither_copied_in_nor_out(monkeypatch):
    sink, x, gammas, batch = make_case(2, 20, 10, 3, 3, 6, True, True, seed=17)
    ops = sink.operands()
    path = GraphPath(monkeypatch)
    io = tb.static_io(ops, batch, 6)
    assert tb.static_io(ops, batch, 6) is io                       # one set per plan
    assert io.gammas.dtype == torch.float32 and io.x.dtype == x.dtype
    path.take()
    for step in range(3):                                          # launch, capture + replay, replay
        xs, gs = torch.randn_like(x), torch.rand_like(gammas)
        io.x.copy_(xs)                                             # the caller writes its inputs in place
        io.gammas.copy_(gs)
        path.take()
        got = tb.triton_forward(ops, io.x, io.gammas, batch, io.out)
        assert got is io.out
        assert path.take() == []                                   # nothing copied in or out
        assert rel(got, reference_forward(ops, xs, gs, batch)) < 1e-5
        eager = torch.full_like(x, float("nan"))
        tb.launch(ops, xs, gs, tb.cached_plan(ops, 6, batch, x.device), eager)
        assert torch.equal(got, eager)                             # the replay is the eager launch
    assert len(path.captured) == 1 and path.captured[0] is io       # captured around the caller's tensors


def test_a_replay_copies_only_what_the_caller_did_not_write_in_place(monkeypatch):
    sink, x, gammas, batch = make_case(2, 20, 10, 3, 3, 6, False, False, seed=19)
    ops = sink.operands()
    path = GraphPath(monkeypatch)
    out = torch.full_like(x, float("nan"))
    assert tb.triton_forward(ops, x, gammas, batch, out) is out     # first call: launched into out
    assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5
    second = tb.triton_forward(ops, x, gammas, batch)               # captured around copies of x and gammas
    io = path.captured[0]
    assert tb.static_io(ops, batch, 6) is io and io.x is not x and second is not io.out
    path.take()
    x2, g2 = torch.randn_like(x), torch.rand_like(gammas)
    for args, copies in (((x2, g2, None), ["foreach_copy", "copy"]),         # the old call: in, then out
                         ((x2, g2, out), ["foreach_copy", "copy"]),          # out=: a copy, no new tensor
                         ((io.x, g2, out), ["copy", "copy"]),                # x written in place: gammas only
                         ((x2, io.gammas, io.out), ["copy"])):               # x only
        if args[0] is io.x:
            io.x.copy_(x2)
        if args[1] is io.gammas:
            io.gammas.copy_(g2)
        path.take()
        got = tb.triton_forward(ops, *args[:2], batch, args[2])
        assert path.take() == copies
        assert got is args[2] if args[2] is not None else got is not io.out
        assert rel(got, reference_forward(ops, x2, g2, batch)) < 1e-5
    assert len(path.captured) == 1


def test_a_callers_tensors_at_the_same_addresses_get_a_graph_of_their_own(monkeypatch):
    """v57: the second time ``x``, ``gammas`` and ``out`` come at the same addresses, a graph is captured around them
    and later calls copy nothing; new values written into them in place are read by each replay. Up to
    ``OWN_GRAPHS`` address sets (3 here); any other set, an ``out`` that overlaps ``x``, and an ``x`` that is not
    contiguous keep copying in and out, every result the reference's."""
    monkeypatch.setattr(tb, "OWN_GRAPHS", 3)
    sink, x, gammas, batch = make_case(2, 20, 10, 3, 3, 6, True, False, seed=29)
    ops = sink.operands()
    path = GraphPath(monkeypatch)
    outs = [torch.full_like(x, float("nan")) for _ in range(4)]
    tb.triton_forward(ops, x, gammas, batch, outs[0])                   # launched
    tb.triton_forward(ops, x, gammas, batch, outs[0])                   # the static graph captured, copies
    assert len(path.captured) == 1
    gen = torch.Generator().manual_seed(3)
    for i, out in enumerate(outs):
        calls = [] if i == 0 else [["foreach_copy", "copy"]]            # a new address set: copied the first time
        calls += [[], []]                                               # then its own graph, nothing copied
        for copies in calls:
            x.copy_(torch.randn(x.shape, generator=gen))                # new values at the same addresses
            gammas.copy_(torch.rand(gammas.shape, generator=gen))
            path.take()
            got = tb.triton_forward(ops, x, gammas, batch, out)
            want = copies if i < 3 else ["foreach_copy", "copy"]        # OWN_GRAPHS taken: the fourth set copies
            assert path.take() == want and got is out
            assert rel(got, reference_forward(ops, x, gammas, batch)) < 1e-5
    own = path.captured[1:]
    assert len(own) == 3 and all(io.x is x and io.gammas is gammas for io in own)
    assert tb.own_graphs(ops, x, tb.cached_plan(ops, 6, batch, x.device)) == 3
    assert all(io.out is o for io, o in zip(own, outs[:3]))
    static = tb.cached_plan(ops, 6, batch, x.device).fast[tb.graph_key(ops, x)]
    assert path.shares == [None] + [static] * 3                      # one memory pool: the static graph's
    strided = torch.randn(x.shape[1], 2 * x.shape[0], generator=gen)[:, ::2].T   # x's shape, not contiguous
    keep = x.clone()
    for args in ((strided, gammas, torch.empty_like(x)), (x, gammas, x)):           # then out is x itself
        want = reference_forward(ops, args[0].clone(), gammas, batch)
        for _ in range(3):                                          # the same addresses every time
            x.copy_(keep)
            path.take()
            got = tb.triton_forward(ops, args[0], args[1], batch, args[2])
            assert path.take() == ["foreach_copy", "copy"] and got is args[2]
            assert rel(got, want) < 1e-5
    assert len(path.captured) == 4                                  # no graph of their own
    seen = tb.cached_plan(ops, 6, batch, x.device).fast[("own", tb.graph_key(ops, x))][1]
    assert 0 < len(seen) <= 16 * tb.OWN_GRAPHS


def test_the_count_of_address_sets_seen_once_is_bounded_and_starts_again(monkeypatch):
    """A run of new address sets (each seen once) never grows the count past ``16 * OWN_GRAPHS``: it starts again,
    so a set that then comes twice still gets its graph."""
    monkeypatch.setattr(tb, "OWN_GRAPHS", 1)
    sink, x, gammas, batch = make_case(2, 20, 10, 3, 3, 6, True, True, seed=31)
    ops = sink.operands()
    path = GraphPath(monkeypatch)
    outs = [torch.empty_like(x) for _ in range(41)]                 # held: 41 addresses, none twice
    tb.triton_forward(ops, x, gammas, batch, outs[0])               # launched
    for out in outs:                                                # the static graph, then one set each
        tb.triton_forward(ops, x, gammas, batch, out)
    seen = tb.cached_plan(ops, 6, batch, x.device).fast[("own", tb.graph_key(ops, x))][1]
    assert len(seen) == 41 - 16 * 2 and len(path.captured) == 1
    path.take()
    got = tb.triton_forward(ops, x, gammas, batch, outs[-1])        # the last one's second call: its graph
    assert path.take() == [] and len(path.captured) == 2 and path.captured[-1].out is outs[-1]
    assert rel(got, reference_forward(ops, x, gammas, batch)) < 1e-5


def test_a_graph_is_keyed_on_the_storage_it_reads():
    sink, x, _, _ = make_case(2, 20, 10, 3, 3, 6, True, True, seed=15)
    ops = sink.operands()
    key = tb.graph_key(ops, x)
    assert tb.graph_key(ops, x.clone()) == key              # inputs are copied in: any x of its dtype
    assert tb.graph_key(ops, x.double()) != key
    ops.buffers[0].data = ops.buffers[0] * 2                # the same record, a pool buffer's storage swapped
    assert tb.graph_key(ops, x) != key


def test_no_batch_or_no_pool_is_the_base_sink():
    sink, x, gammas, batch = make_case(2, 20, 10, 2, 2, 5, True, True, seed=3)
    base = sink.base_forward(x, gammas)
    assert rel(tb.triton_forward(sink.operands(), x, gammas, None), base.double()) < 1e-5
    bare = SharedSinkLoRA(2, 20, 10, dtype=torch.float32, seed=3)
    assert rel(tb.triton_forward(bare.operands(), x, gammas, batch), base.double()) < 1e-5
    assert tb.triton_forward(sink.operands(), x[:0], gammas[:0], None).shape == (0, 20)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(16, 48), F=st.integers(8, 24), R=st.integers(1, 8), S=st.integers(1, 3),
       T=st.integers(1, 20), outer_shared=st.booleans(), interleaved=st.booleans(), seed=st.integers(0, 10_000))
def test_kernels_match_the_reference_on_random_shapes(n, H, F, R, S, T, outer_shared, interleaved, seed):
    sink, x, gammas, batch = make_case(n, H, F, R, S, T, outer_shared, interleaved, seed)
    out, _ = run(sink, x, gammas, batch)  # the backend's own tile pick
    assert rel(out, reference_forward(sink.operands(), x, gammas, batch)) < 1e-5


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(16, 48), F=st.integers(8, 40), R=st.integers(1, 40), S=st.integers(1, 6),
       T=st.integers(1, 34), outer_shared=st.booleans(), interleaved=st.booleans(), wide=st.booleans(),
       seed=st.integers(0, 10_000))
def test_gathered_epilogues_match_the_reference(n, H, F, R, S, T, outer_shared, interleaved, wide, seed):
    """v28: every token's LoRA from its own slot's factors, 16 or 8 ranks a step (``_gather``), over
    mixed, base-only and rank-0 tokens, either outer layout, with the up and down splits (``MIN_SPLIT_K``)."""
    sink, x, gammas, batch = make_case(n, H, F, R, S, T, outer_shared, interleaved, seed)
    tiles = replace(FUSED, bf=32 if wide else 16, gather=True)
    assert tb._gather(tiles) == (8 if wide else 16)
    ops = sink.operands()
    p = tb.plan(ops, T, batch, x.device, tiles)
    out = torch.full_like(x, float("nan"))
    tb.launch(ops, x, gammas, p, out)
    assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5
    assert p.sh is None or torch.count_nonzero(p.sh) == 0  # the down kernel left the shrink's workspace zero


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(16, 48), F=st.integers(8, 40), R=st.integers(1, 40), S=st.integers(1, 6),
       T=st.integers(2, 32), outer_shared=st.booleans(), interleaved=st.booleans(), ksplit=st.integers(1, 3),
       seed=st.integers(0, 10_000))
def test_the_up_gemm_with_the_lora_epilogue_matches_the_reference(n, H, F, R, S, T, outer_shared, interleaved, ksplit,
                                                                  seed):
    """v33: the up launch is ``up_act_kernel`` on the base ``w13`` with the pool's LoRA in its epilogue (the expand
    from the shrink's ``sh``, the down shrink into ``mid``, per slot of the tile), then the down kernel; mixed,
    base-only and rank-0 tokens, either outer layout, unsplit or ``H`` over ``ksplit`` programs a tile (some with
    an empty slice here), feature blocks and steps that do not divide ``F`` and ``H``. A second launch of the
    same plan gives the same output and both leave every workspace zero."""
    sink, x, gammas, batch = make_case(n, H, F, R, S, T, outer_shared, interleaved, seed)
    up = replace(tb.UP_ACT_TILES, bf=16, bk=16, stages=2, ksplit=ksplit)
    ops = sink.operands()
    p = tb.plan(ops, T, batch, x.device, replace(FUSED, lora_up=up))
    assert p.split.up == ksplit and p.split.cnt_up.numel() == n * -(-F // 16)
    outs = [torch.full_like(x, float("nan")) for _ in range(2)]
    for out in outs:
        tb.launch(ops, x, gammas, p, out)
    assert rel(outs[0], reference_forward(ops, x, gammas, batch)) < 1e-5 and torch.equal(*outs)
    assert p.sh is None or torch.count_nonzero(p.sh) == 0  # the down kernel left the shrink's workspace zero
    assert not p.split.ws_up.any() and not p.split.cnt_up.any()


def launch_recording(ops, x, gammas, p, m) -> tuple[torch.Tensor, dict]:
    """``launch`` of plan ``p`` into a NaN-poisoned output, each kernel's launch options recorded by its name (``m``:
    a ``MonkeyPatch`` whose scope holds the recording) -> (out, options)."""
    seen, launch_ = {}, tb._run
    m.setattr(tb, "_run", lambda kern, grid, args, fast=None, **meta: (
        seen.__setitem__(kern.fn.__name__, meta), launch_(kern, grid, args, fast, **meta)))
    out = torch.full_like(x, float("nan"))
    tb.launch(ops, x, gammas, p, out)
    return out, seen


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(16, 48), F=st.integers(8, 40), R=st.integers(1, 20), S=st.integers(1, 4),
       T=st.integers(2, 34), interleaved=st.booleans(), slot=st.integers(0, 3), split=st.booleans(),
       seed=st.integers(0, 10_000))
def test_the_down_shrink_made_in_the_down_kernel_matches_the_reference(n, H, F, R, S, T, interleaved, slot, split, seed):
    """v52 (``Tiles.down_shrink``): every token on one slot of a host batch, shared outer, the down launch unsplit: the
    down kernel makes the down shrink from the ``act`` tiles it streams (``SHRINK``) and the up kernel adds nothing
    into ``mid`` (``MID=False``); over one or two token tiles, steps that do not divide ``F``, either gate/up layout.
    Where the down launch is split (``MIN_SPLIT_K``) the tiles run as without it. A second launch of the same plan
    gives the same output, and both leave the shrink's workspace zero."""
    sink, x, gammas, _ = make_case(n, H, F, R, S, T, True, interleaved, seed)
    slot = slot % S
    batch = SlotBatch.from_token_slots([slot] * T, S, lora_ranks=[R] * S, scalings=[0.5 + 0.25 * s for s in range(S)])
    ops = sink.operands()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tb, "MIN_SPLIT_K", 16 if split else 1 << 20)
        p = tb.plan(ops, T, batch, x.device, replace(FUSED, down_shrink=True))
        assert p.single_slot == slot and (split or p.split.down == 1)
        (first, seen), (second, _) = (launch_recording(ops, x, gammas, p, m) for _ in range(2))
    folded = p.split.down == 1
    assert seen["down_kernel"]["SHRINK"] is folded and seen["up_kernel"]["MID"] is not folded
    assert rel(first, reference_forward(ops, x, gammas, batch)) < 1e-5 and torch.equal(first, second)
    assert torch.count_nonzero(p.sh) == 0


def test_the_down_shrink_is_planned_in_the_down_kernel_for_one_slot_of_a_few_tokens_on_small_weights():
    """v52's routing read off ``h100_fold_v52*.json`` at the benchmark shapes' real sizes: one slot, 2-16 tokens, A-sized
    weights; not on B, the real model or its TP-8 slice, not with several slots, not at one token (the GEMV) or past
    16; through ``plan`` for a one-slot host batch."""
    a, b, tp8 = (PRESETS[k] for k in ("A", "B", "inkling-tp8"))
    w = {k: g.n * g.intermediate * g.hidden for k, g in (("A", a), ("B", b), ("tp8", tp8))}
    assert tb.down_shrinks(2, w["A"], 1) and tb.down_shrinks(16, w["A"], 1)
    assert not tb.down_shrinks(1, w["A"], 1) and not tb.down_shrinks(17, w["A"], 1)
    assert not tb.down_shrinks(8, w["A"], 2) and not tb.down_shrinks(8, w["B"], 1) and not tb.down_shrinks(8, w["tp8"], 1)
    sink, x, gammas, _ = make_case(2, 40, 24, 3, 3, 8, True, True, seed=3)  # 8 tokens: not v33's up launch either
    one = SlotBatch.from_token_slots([1] * 8, 3, lora_ranks=[3, 3, 3])
    p = tb.plan(sink.operands(), 8, one, x.device)
    assert p.tiles.down_shrink and p.single_slot == 1
    with pytest.MonkeyPatch.context() as m:
        out, seen = launch_recording(sink.operands(), x, gammas, p, m)
    assert seen["down_kernel"]["SHRINK"] is (p.split.down == 1)
    assert rel(out, reference_forward(sink.operands(), x, gammas, one)) < 1e-5


def test_the_down_shrink_stays_in_the_up_kernel_where_the_tokens_use_several_slots_or_experts_own_outers():
    """``Tiles.down_shrink`` needs one slot for every token, a shared outer and the loop epilogues; elsewhere the same
    tiles run the down shrink through ``mid`` as before, and still match the reference (with the gathered epilogues,
    which read ``mid`` themselves, even on one slot)."""
    one = SlotBatch.from_token_slots([2] * 9, 3, lora_ranks=[3, 3, 3])
    for outer_shared, batch_of, gather in ((True, None, False), (False, None, False), (True, one, True)):
        sink, x, gammas, batch = make_case(2, 40, 24, 3, 3, 9, outer_shared, True, seed=3)
        batch = batch_of or batch
        ops = sink.operands()
        with pytest.MonkeyPatch.context() as m:
            m.setattr(tb, "MIN_SPLIT_K", 1 << 20)  # an unsplit down launch: the fold's own condition met
            p = tb.plan(ops, 9, batch, x.device, replace(FUSED, down_shrink=True, gather=gather))
            out, seen = launch_recording(ops, x, gammas, p, m)
        assert p.split.down == 1 and (p.single_slot < 0 or not outer_shared or gather)
        assert not seen["down_kernel"]["SHRINK"] and seen["up_kernel"]["MID"]
        assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5


def test_tile_pick_streams_weights_for_few_tokens_and_uses_cublas_for_many():
    assert not tb.pick_tiles(1).cublas and not tb.pick_tiles(32).cublas
    assert not tb.pick_tiles(128, weight_elems=2 * 768 * 1536).cublas       # shape A
    assert tb.pick_tiles(128, weight_elems=2 * 2048 * 4096).cublas          # shape B
    assert tb.pick_tiles(8192).cublas and tb.pick_tiles(8192).bm >= 64


@pytest.mark.parametrize("T", [129, 512, 2048, 8192])
def test_few_features_take_narrow_epilogue_tiles_on_the_cublas_path(T):
    tp8, a = tb.pick_tiles(T, 2 * 384 * 6144, 6144), tb.pick_tiles(T, 2 * 768 * 1536, 1536)  # n*F 768 and 1536
    assert tp8.cublas and (tp8.bm, tp8.bf, tp8.warps) == (32, 64, 4)
    assert a.cublas and (a.bm, a.bf, a.warps) == (64, 128, 8)
    assert tp8.k_chunk == a.k_chunk and tp8.sbm == a.sbm  # the shrinks as before
    assert tp8.swarps == a.swarps == tb.SHRINK_WARPS == 8  # v42: the shrinks on 8 warps past 128 tokens
    assert tb.pick_tiles(128, 2 * 2048 * 4096).swarps == 4
    assert tb.pick_tiles(T, 2 * 384 * 6144) == tb.pick_tiles(T)  # no hidden size given: no narrowing


def route_one_slot(monkeypatch, path: str) -> None:
    """Send a one-slot batch of these tiny weights down ``path`` of the cuBLAS path."""
    monkeypatch.setattr(tb, "FOLD_TOKENS", 1 if path == "folded_into_cublas" else 1 << 30)
    monkeypatch.setattr(tb, "SMALL_WEIGHTS", 0)  # these tiny weights stand for B-sized ones


@pytest.mark.parametrize("path", ["chain", "folded_into_cublas"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_one_slot_batches_take_cublas_shrinks_on_the_cublas_path(interleaved, path, monkeypatch):
    route_one_slot(monkeypatch, path)
    sink, x, gammas, _ = make_case(2, 37, 21, 5, 3, 19, True, interleaved, seed=21)
    batch = SlotBatch.from_segments([19], [2], 3, lora_ranks=[5, 5, 5], scalings=[1.0, 1.0, 0.7])
    out, p = run(sink, x, gammas, batch, CUBLAS)
    assert p.single_slot == 2
    assert rel(out, reference_forward(sink.operands(), x, gammas, batch)) < 1e-5
    assert torch.count_nonzero(p.sh) == 0


def test_auto_sends_one_slot_batches_past_16_tokens_to_the_cublas_chain(monkeypatch):
    monkeypatch.setattr(tb, "SMALL_WEIGHTS", 0)  # these tiny weights stand for B-sized ones
    sink, x, gammas, _ = make_case(2, 40, 24, 4, 3, 21, True, True, seed=8)
    ops = sink.operands()
    one = SlotBatch.from_segments([21], [1], 3, lora_ranks=[4, 4, 0], scalings=[1.0, 0.6, 1.0])
    p = tb.plan(ops, 21, one, x.device)
    assert p.tiles == tb.ONE_SLOT_TILES and p.split is None and p.single_slot == 1
    out, _ = run(sink, x, gammas, one)
    assert rel(out, reference_forward(ops, x, gammas, one)) < 1e-5
    mixed = SlotBatch.from_segments([10, 11], [1, -1], 3, lora_ranks=[4, 4, 0])
    assert not tb.plan(ops, 21, mixed, x.device).tiles.cublas  # the weight-streaming launches keep it
    assert not tb.plan(ops, 16, one, x.device).tiles.cublas
    small = tb.CHAIN_SMALL_TOKENS  # A-sized weights (0 here): the weight-streaming launches below it
    assert tb.chain_tokens(small, 0) and not tb.chain_tokens(small - 1, 0) and not tb.chain_tokens(tb.FOLD_TOKENS, 1)
    assert tb.folds(tb.FOLD_TOKENS, 1) and not tb.folds(tb.FOLD_TOKENS, 0)  # A-sized weights keep the chain


def test_swaps_follows_the_grouped_gemms_conditions():
    """v56b's arrangement of ``_launch_single`` from ``SWAP_TOKENS`` (512) on up GEMMs from ``SWAP_FEATURES`` (8192)
    wide, as measured (B's ``n * 2F`` is 8192, the TP-8 slice's 1536), where torch's grouped GEMM takes the shrink:
    bfloat16 on CUDA (other dtypes there loop on the host), 16-byte rows (``H``, ``R`` multiples of 8)."""
    ops = SimpleNamespace(max_rank=16, hidden=6144, dtype=torch.bfloat16, n=2, intermediate=2048)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert (tb.SWAP_TOKENS, tb.SWAP_FEATURES) == (512, 8192)
    assert tb.swaps(512, ops, cuda) and not tb.swaps(511, ops, cuda)
    assert not tb.swaps(2048, SimpleNamespace(**{**vars(ops), "intermediate": 2047}), cuda)
    assert not tb.swaps(2048, SimpleNamespace(**{**vars(ops), "intermediate": 384}), cuda)  # the TP-8 slice
    assert not tb.swaps(2048, SimpleNamespace(**{**vars(ops), "dtype": torch.float16}), cuda)
    assert tb.swaps(2048, SimpleNamespace(**{**vars(ops), "dtype": torch.float32}), cpu)
    assert not tb.swaps(2048, SimpleNamespace(**{**vars(ops), "max_rank": 12}), cuda)
    assert not tb.swaps(2048, SimpleNamespace(**{**vars(ops), "hidden": 6148}), cuda)
    assert tb.SWAP_SHRINK_ELEMS == 2 * 16 * 6144                                     # the real model's R 16 swaps
    assert not tb.swaps(2048, SimpleNamespace(**{**vars(ops), "hidden": 4096, "max_rank": 16}), cuda)  # B R 16 does not
    assert tb.swaps(2048, SimpleNamespace(**{**vars(ops), "hidden": 4096, "max_rank": 64}), cuda)      # B R 64 does


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_one_slot_chain_past_swap_tokens_takes_the_grouped_shrink(interleaved, monkeypatch):
    """A routed one-slot batch from ``SWAP_TOKENS`` gets ``offs [1]`` (its token count) at plan time and its shrink as a
    one-group grouped GEMM of its own slot's factor (slot 2 of 3, not the first), to the reference; below the count,
    or at a rank the grouped GEMM does not take, the plan has no ``offs`` and the shrink stays ``torch.mm``."""
    route_one_slot(monkeypatch, "chain")
    monkeypatch.setattr(tb, "SWAP_TOKENS", 20)
    monkeypatch.setattr(tb, "SWAP_FEATURES", 96)  # n * 2F here
    monkeypatch.setattr(tb, "SWAP_SHRINK_ELEMS", 0)
    grouped = []
    real = torch._grouped_mm
    monkeypatch.setattr(torch, "_grouped_mm", lambda *a, **k: grouped.append(a[1].shape) or real(*a, **k))
    sink, x, gammas, _ = make_case(2, 40, 24, 8, 3, 21, True, interleaved, seed=27)
    batch = SlotBatch.from_segments([21], [2], 3, lora_ranks=[8, 8, 8], scalings=[1.0, 1.0, -0.6])
    out, p = run(sink, x, gammas, batch)
    assert p.tiles == tb.ONE_SLOT_TILES and p.single_slot == 2 and p.offs.tolist() == [21]
    assert grouped == [(1, 40, 16)]
    assert rel(out, reference_forward(sink.operands(), x, gammas, batch)) < 1e-5
    assert tb.plan(sink.operands(), 19, SlotBatch.from_segments([19], [2], 3, lora_ranks=[8, 8, 8]), x.device).offs is None
    odd, x5, g5, _ = make_case(2, 40, 24, 5, 3, 21, True, interleaved, seed=27)
    odd_batch = SlotBatch.from_segments([21], [2], 3, lora_ranks=[5, 5, 5])
    out5, p5 = run(odd, x5, g5, odd_batch)
    assert p5.single_slot == 2 and p5.offs is None and len(grouped) == 1
    assert rel(out5, reference_forward(odd.operands(), x5, g5, odd_batch)) < 1e-5


def test_cats_follows_the_measured_tokens_and_rank():
    ops = SimpleNamespace(w2_cat=object(), n=2, intermediate=3072, hidden=6144, max_rank=16)
    assert tb.cats(tb.CAT_TOKENS, ops) and not tb.cats(tb.CAT_TOKENS - 1, ops)
    ops.max_rank = 64                                       # the down shrink it waits for grows with R
    assert tb.cats(4 * tb.CAT_TOKENS, ops) and not tb.cats(4 * tb.CAT_TOKENS - 1, ops)
    ops.intermediate, ops.hidden = 768, 1536                # A: H = n*F, little to save
    assert not tb.cats(8192, ops)
    assert not tb.cats(8192, SimpleNamespace(w2_cat=None, n=2, intermediate=3072, hidden=6144, max_rank=16))


def test_only_a_shared_outer_pool_gets_spare_down_rows():
    shared = make_case(2, 37, 21, 5, 3, 9, True, True, seed=2)[0].operands()
    assert shared.w2_cat.shape == (2 * 21 + 3 * 5, 37) and shared.w2_cat.data_ptr() == shared.w2_lin.data_ptr()
    assert torch.equal(shared.w2_cat[:42], shared.w2_lin)
    assert make_case(2, 37, 21, 5, 3, 9, False, True, seed=2)[0].operands().w2_cat is None


@pytest.mark.parametrize("path", ["chain", "folded_into_cublas"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_one_slot_batches_add_the_down_expand_as_more_k_of_the_down_gemm(interleaved, path, monkeypatch):
    route_one_slot(monkeypatch, path)
    monkeypatch.setattr(tb, "CAT_TOKENS", 4)
    calls = []
    real = tb._down_cat
    monkeypatch.setattr(tb, "_down_cat", lambda *a: calls.append(a[2]) or real(*a))
    sink, x, gammas, _ = make_case(2, 37, 21, 5, 3, 19, True, interleaved, seed=23)
    w2_lin = sink.operands().w2_lin.clone()
    for slot, scale in ((2, 0.7), (0, -1.3)):  # the second call overwrites the first slot's rows
        batch = SlotBatch.from_segments([19], [slot], 3, lora_ranks=[5, 5, 5], scalings=[scale, 1.0, scale])
        out, p = run(sink, x, gammas, batch, CUBLAS)
        assert rel(out, reference_forward(sink.operands(), x, gammas, batch)) < 1e-5
    assert calls == [2, 0]
    assert torch.equal(sink.operands().w2_lin, w2_lin)        # the base rows are never written
    base, _ = run(sink, x, gammas, None, CUBLAS)
    assert rel(base, reference_forward(sink.operands(), x, gammas, None)) < 1e-5


EXPANDS = (CUBLAS, replace(CUBLAS, stages=2), replace(CUBLAS, bf=32, stages=2))
"""``_launch_single``'s activation tiles: ``expand_act_kernel`` on 16 x 16 tiles, one or two row tiles in flight, or
on 32-feature tiles (v36)."""


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(8, 40), F=st.integers(4, 24), R=st.integers(1, 9), T=st.integers(1, 40),
       folded=st.booleans(), interleaved=st.booleans(), tiles=st.sampled_from(EXPANDS),
       scale=st.floats(-2.0, 2.0, allow_nan=False), seed=st.integers(0, 2**16), swapped=st.booleans())
def test_the_down_expand_as_more_k_matches_the_reference_on_random_shapes(n, H, F, R, T, folded, interleaved,
                                                                         tiles, scale, seed, swapped):
    """``swapped``: the chain's v56b arrangement (``offs``: its shrink a one-group grouped GEMM), at ``H`` and ``R``
    rounded up to multiples of 8 as ``swaps`` asks."""
    if swapped:
        H, R = 8 * -(-H // 8), 8 * -(-R // 8)
    sink, x, gammas, _ = make_case(n, H, F, R, 2, T, True, interleaved, seed)
    batch = SlotBatch.from_segments([T], [1], 2, lora_ranks=[R, R], scalings=[1.0, scale])
    ops = sink.operands()
    p = tb.plan(ops, T, batch, x.device, tiles)
    if swapped:
        p = replace(p, offs=torch.tensor([T], dtype=torch.int32))
    out = torch.full_like(x, float("nan"))
    if folded:
        tb._launch_folded(ops, x, gammas, p, out, ops.w2_cat)
    else:
        tb._launch_single(ops, x, gammas, p, out, ops.w2_cat)
    assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5


@pytest.mark.parametrize("programs", [1, 3, 1 << 20], ids=["one_walks_all", "three_walk", "one_tile_each"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_the_expand_kernel_walks_its_row_tiles_to_the_reference(programs, interleaved, monkeypatch):
    """v36: each ``expand_act_kernel`` program keeps its block of gate-up B and walks every ``P``-th row tile;
    with 1 or 3 programs a feature block the loop crosses partial and full tiles of 53 tokens."""
    monkeypatch.setattr(tb, "TARGET_PROGRAMS", programs)
    g = Geometry(n=2, hidden=40, intermediate=24, max_rank=6, slots=3, outer=1)
    sc = Scenario.random(g, tokens=53, seed=31, interleaved=interleaved)
    sink, x, gammas = sc.sink, sc.x, sc.gammas
    batch = SlotBatch.from_segments([53], [1], 3, lora_ranks=[6, 6, 6], scalings=[1.0, -0.8, 1.0])
    ops = sink.operands()
    p = tb.plan(ops, 53, batch, x.device, replace(CUBLAS, stages=2))
    out = torch.full_like(x, float("nan"))
    tb._launch_single(ops, x, gammas, p, out)
    assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5


@pytest.mark.parametrize("programs", [1, 1 << 20], ids=["one_walks_each_run", "one_tile_each"])
@pytest.mark.parametrize("outer_shared", [True, False], ids=["shared_outer", "per_expert_outer"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_the_expand_kernel_walks_each_run_of_several_slots(programs, outer_shared, interleaved, monkeypatch):
    """v36c: on the several-slot cuBLAS path ``expand_act_kernel`` gives each run of one slot its own programs:
    runs of three slots in no order, of base-only and of rank-0 tokens, 1-9 tokens long across 16-token tiles."""
    monkeypatch.setattr(tb, "EXPAND_RUN_TOKENS", 1)
    monkeypatch.setattr(tb, "TARGET_PROGRAMS", programs)
    sink, x, gammas, _ = make_case(3, 37, 21, 5, 4, 45, outer_shared, interleaved, seed=43)
    lengths = [9, 3, 7, 1, 8, 5, 6, 6]
    batch = SlotBatch.from_segments(lengths, [2, -1, 0, 3, 1, 2, 3, 0], 4, lora_ranks=[5, 0, 5, 5],
                                    scalings=[0.7, 1.0, -1.2, 1.5])
    ops = sink.operands()
    p = tb.plan(ops, 45, batch, x.device, CUBLAS)
    assert p.act_runs is None, "tiles given: the caller's path"
    monkeypatch.setattr(tb, "pick_tiles", lambda *a: CUBLAS)
    p = tb.plan(ops, 45, batch, x.device)
    assert p.single_slot == -1 and p.grouped == "" and p.act_runs.longest == 9
    assert p.act_runs.slots.tolist() == [2, -1, 0, 3, -1, 2, 3, 0] and p.act_runs.ends.tolist()[-1] == 45
    out = torch.full_like(x, float("nan"))
    tb.launch(ops, x, gammas, p, out)
    assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5
    assert torch.count_nonzero(p.sh) == 0
    monkeypatch.setattr(tb, "EXPAND_RUN_TOKENS", 6)  # 45 tokens in 8 runs: fewer than 6 a run, up_kernel's epilogue
    assert tb.plan(ops, 45, batch, x.device).act_runs is None


@pytest.mark.parametrize("tiles", [FUSED, CUBLAS], ids=["fused", "cublas_path"])
@pytest.mark.parametrize("grouped", [False, True], ids=["segments", "grouped"])
def test_a_device_resident_batch_follows_in_place_updates(tiles, grouped):
    from dataclasses import replace

    sink, x, gammas, _ = make_case(2, 40, 24, 3, 3, 23, grouped, True, seed=5)
    g = torch.Generator().manual_seed(7)

    def segs(lengths, slots, ranks):
        b = SlotBatch.from_segments(lengths, slots, 3, lora_ranks=ranks)
        return replace(b, permutation=torch.randperm(23, generator=g)) if grouped else b

    first = segs([5, 7, 4, 7], [0, -1, 2, 1], [3, 0, 3])
    resident = first.to("cpu")
    assert resident.tokens == 23 and resident.num_tokens == 23
    ops = sink.operands()
    p = tb.plan(ops, 23, resident, x.device, tiles)
    assert p.batch is resident and p.single_slot == -1
    out = torch.full_like(x, float("nan"))
    tb.launch(ops, x, gammas, p, out)
    assert rel(out, reference_forward(ops, x, gammas, first)) < 1e-5
    # new segments and slots for the same tokens, written into the same tensors
    # (what a CUDA graph replay of this launch sees)
    second = segs([8, 3, 6, 6], [2, 0, 1, -1], [3, 3, 3])
    for name in ("seg_indptr", "weight_indices", "lora_ranks", "permutation"):
        if getattr(first, name) is not None:
            getattr(resident, name).copy_(getattr(second, name))
    out = torch.full_like(x, float("nan"))
    tb.launch(ops, x, gammas, p, out)
    assert rel(out, reference_forward(ops, x, gammas, second)) < 1e-5
    assert torch.count_nonzero(p.sh) == 0


def test_gammas_of_another_floating_dtype_are_read_in_float32():
    sink, x, gammas, batch = make_case(2, 20, 10, 2, 2, 7, True, True, seed=5)
    want, _ = run(sink, x, gammas, batch)
    got, _ = run(sink, x, gammas.double(), batch)  # sglang passes the router's float32 weights
    assert rel(got, want.double()) < 1e-6


def test_pdl_is_planned_only_where_the_h200_measured_it_faster(monkeypatch):
    a, b = 2 * 768 * 1536, 2 * 2048 * 4096  # n*F*H of shapes A and B
    with monkeypatch.context() as m:
        m.setattr(tb, "interpreting", lambda: False)
        assert tb.use_pdl(1, a, 1) and tb.use_pdl(32, a, 1) and tb.use_pdl(8, a, 4)
        assert not tb.use_pdl(32, a, 4) and not tb.use_pdl(8, a, 8)  # more slots: the overlap cost more than it gave
        assert not tb.use_pdl(32, b, 1)  # B's 32-token grids do not fit beside each other
        assert not tb.use_pdl(64, a, 1)  # not measured there
        assert not tb.use_pdl(1, a, 0)   # no shrink to overlap
        assert tb.use_pdl(16, a, 8, gather=True) and not tb.use_pdl(17, a, 8, gather=True)  # v28
        assert not tb.use_pdl(8, b, 8, gather=True)
        assert tb.use_pdl(16, b, 1, lora_up=True)  # v33: up_act_kernel's 96 programs leave room for the down kernel
        inkling = 2 * 3072 * 6144
        assert tb.use_pdl(16, b, 1) and not tb.use_pdl(17, b, 1) and not tb.use_pdl(8, b, 2)  # v33: B, one slot
        assert not tb.use_pdl(8, inkling, 1) and tb.PDL_ONE_SLOT_WEIGHTS < inkling
        # v50b: at the real model's weights only the up launch is the shrink's dependent, one slot, 2-16 tokens
        ops = {k: SimpleNamespace(n=g.n, intermediate=g.intermediate, hidden=g.hidden, max_rank=16)
               for k, g in PRESETS.items() if k in ("B", "inkling", "inkling-tp8")}
        assert tb.use_pdl_up(2, ops["inkling"], 1) and tb.use_pdl_up(16, ops["inkling"], 1)
        assert not tb.use_pdl_up(17, ops["inkling"], 1) and not tb.use_pdl_up(1, ops["inkling"], 1)  # 32: level or behind
        assert not tb.use_pdl_up(8, ops["inkling"], 4)  # a shrink grid S times larger: 2-11 µs over the unchained launches
        assert not tb.use_pdl_up(8, ops["B"], 1)        # B chains all three (use_pdl)
        eight = tb._streaming_tiles(tb.pick_tiles(8, inkling, 6144), 8, ops["inkling"], 1)
        assert eight.pdl_up and not eight.pdl
        assert not tb._streaming_tiles(tb.pick_tiles(8, inkling, 6144), 8, ops["inkling"], 4).pdl_up
        # v51b: the TP-8 slice's one slot at 2-8 tokens, pdl_up on up_kernel in place of v33's up_act_kernel
        tp8, w = ops["inkling-tp8"], 2 * 384 * 6144
        assert tb.use_pdl_up(2, tp8, 1) and tb.use_pdl_up(8, tp8, 1) and not tb.use_pdl_up(9, tp8, 1)
        assert not tb.use_pdl_up(8, tp8, 2)
        eight, nine = (tb._streaming_tiles(tb.pick_tiles(t, w, 6144), t, tp8, 1) for t in (8, 9))
        assert eight.pdl_up and not eight.pdl and eight.lora_up is None
        assert nine.lora_up is not None and nine.pdl and not nine.pdl_up  # v33's kernel from 9 tokens, as before
    assert not tb.use_pdl(1, a, 1)       # the interpreter has no grid dependency control
    assert not tb.use_pdl_up(8, SimpleNamespace(n=2, intermediate=3072, hidden=6144), 1)
    sink, x, gammas, batch = make_case(2, 40, 24, 3, 3, 7, True, True, seed=4)
    assert not tb.plan(sink.operands(), 7, batch, x.device).tiles.pdl


def test_gathered_epilogues_are_planned_for_several_slots_at_a_low_rank_and_few_tokens():
    ops = SimpleNamespace(max_rank=16)
    few = tb.pick_tiles(8)
    assert tb.gathers(8, ops, few, 2) and tb.gathers(tb.GATHER_TOKENS, ops, tb.pick_tiles(16), 8)
    assert not tb.gathers(8, ops, few, 1)                        # one slot: no loop to save (level)
    assert not tb.gathers(tb.GATHER_TOKENS + 1, ops, tb.pick_tiles(17), 7)  # 32-feature tiles at S 4: level
    assert tb.gathers(17, ops, tb.pick_tiles(17), 8) and tb.gathers(32, ops, tb.pick_tiles(32), 8)  # S 8: faster
    assert not tb.gathers(33, ops, tb.pick_tiles(33), 8)                  # not measured past 32 tokens
    assert not tb.gathers(8, SimpleNamespace(max_rank=17), few, 8)        # a second step of ranks costs more
    assert not tb.gathers(1, ops, tb.pick_tiles(1), 8) and not tb.gathers(8, ops, replace(few, cublas=True), 8)
    sink, x, gammas, _ = make_case(2, 40, 24, 3, 3, 9, True, True, seed=4)
    two = SlotBatch.from_token_slots([0, 0, 1, 1, -1, 0, 2, 1, 0], 3, lora_ranks=[3, 3, 0])  # slot 2: rank 0
    p = tb.plan(sink.operands(), 9, two, x.device)
    assert p.tiles.gather and not p.tiles.pdl  # the interpreter: no PDL
    out, _ = run(sink, x, gammas, two)
    assert rel(out, reference_forward(sink.operands(), x, gammas, two)) < 1e-5
    one = SlotBatch.from_token_slots([0, 0, 2, -1, 0, 0, 0, 2, 0], 3, lora_ranks=[3, 3, 0])  # one slot with rank
    assert not tb.plan(sink.operands(), 9, one, x.device).tiles.gather
    assert tb.plan(sink.operands(), 9, two.to("cpu"), x.device).tiles.gather  # resident: the pool's 3 slots


def test_the_up_gemm_with_the_lora_epilogue_is_planned_for_one_slot_of_the_tp8_slice():
    """v33's routing read off ``h100_up_act_v33.json`` at the benchmark shapes' real sizes: one slot, 9-16 tokens
    (2-8 take ``pdl_up`` since v51b), where ``up_act_kernel`` runs split (the TP-8 slice), with PDL; not on A, B or
    Inkling (level or behind), not with several slots, not past 16 tokens, and through ``plan`` for a host batch and
    a device-resident one."""
    def routed(preset, tokens, slots=1):
        g = PRESETS[preset]
        ops = SimpleNamespace(n=g.n, intermediate=g.intermediate, hidden=g.hidden)
        return tb.lora_ups(tokens, ops, tb.pick_tiles(tokens, g.n * g.intermediate * g.hidden), slots)

    assert [routed("inkling-tp8", t) for t in (1, 2, 8, 9, 16, 17)] == [None, None, None, tb.UP_ACT_SPLIT_TILES,
                                                                         tb.UP_ACT_SPLIT_TILES, None]
    assert all(routed(p, t) is None for p in ("A", "B", "inkling") for t in (2, 8, 16))
    assert routed("inkling-tp8", 8, slots=2) is None and routed("inkling-tp8", 8, slots=0) is None
    sink, x, gammas, batch = make_case(2, 40, 24, 3, 1, 9, True, True, seed=5)
    with pytest.MonkeyPatch.context() as m:  # this tiny sink's 2 feature blocks are fewer than UP_ACT_PROGRAMS
        m.setattr(tb, "UP_ACT_SPLIT_TILES", replace(tb.UP_ACT_SPLIT_TILES, bf=16, bk=16, stages=2))
        plans = [tb.plan(sink.operands(), 9, b, x.device) for b in (batch, batch.to("cpu"))]
    for p in plans:
        assert p.tiles.lora_up is not None and p.split.up == tb.UP_ACT_SPLIT and not p.tiles.pdl  # interpreter
        out = torch.full_like(x, float("nan"))
        tb.launch(sink.operands(), x, gammas, p, out)
        assert rel(out, reference_forward(sink.operands(), x, gammas, batch)) < 1e-5
    assert tb.plan(sink.operands(), 17, *make_case(2, 40, 24, 3, 1, 17, True, True, seed=5)[3:], x.device).tiles.lora_up is None


@pytest.mark.parametrize("stages", [1, 3], ids=["double_buffered", "pipelined"])
@pytest.mark.parametrize("outer_shared, interleaved", [(True, True), (False, False)],
                         ids=["shared_outer_interleaved", "per_expert_outer_contiguous"])
def test_one_token_takes_the_gemv_kernels_and_matches_the_reference(outer_shared, interleaved, stages):
    """One token on small weights routes to the GEMV launches (``pick_tiles``); here with
    steps smaller than the sizes, so the K loops run several steps and mask a partial one;
    ``stages``: the register double buffer, or v47's pipelined streams (3 up steps, 6 down, against 3 stages;
    routed from Inkling's ``H``)."""
    assert tb.pick_tiles(1, weight_elems=2 * 768 * 1536).gemv and not tb.pick_tiles(2).gemv
    assert tb.pick_tiles(1, weight_elems=2 * 3072 * 6144, hidden=6144).gemv  # Inkling-sized too (v31)
    tp8, inkling = tb.pick_tiles(1, 2 * 384 * 6144, 6144), tb.pick_tiles(1, 2 * 3072 * 6144, 6144)
    assert (tp8.bf, tp8.bk, tp8.bn, tp8.dk) == (4, 1024, 16, 256)  # v35: the TP-8 slice's short down rows
    b, kept = tb.pick_tiles(1, 2 * 2048 * 4096, 4096), tb.gemv_for(6144)  # B; the kept copies' stream at Inkling's H
    assert (inkling.bf, inkling.bk, inkling.bn, inkling.dk, inkling.stages) == (4, 1024, 16, 256, 4)  # v47
    assert (kept.bf, kept.bk, kept.bn, kept.dk, kept.stages) == (8, 512, 8, 512, 4)
    assert (b.bf, b.bk, b.bn, b.dk, b.stages) == (8, 512, 8, 512, 1)  # B: the double buffer (v47 lost there)
    assert tp8.stages == 4 and tb.gemv_for(1536).stages == 1
    sink, x, gammas, _ = make_case(2, 37, 21, 5, 3, 1, outer_shared, interleaved, seed=31 + int(outer_shared))
    ops = sink.operands()
    tiles = tb.gemv_tiles(bf=8, bk=16, bn=8, dk=8, stages=stages)  # 3 feature and 5 row tiles, the last of each partial
    for slot in (2, -1, 1):  # a LoRA token (scaled), base only, a rank-0 slot
        batch = SlotBatch.from_token_slots([slot], 3, lora_ranks=[5, 0, 5], scalings=[1.0, 1.0, 0.6])
        p = tb.plan(ops, 1, batch, x.device, tiles)
        for _ in range(2):  # a repeat launch on the plan (a graph replay's): sh left zero, mid re-zeroed
            out = torch.full_like(x, float("nan"))
            tb.launch(ops, x, gammas, p, out)
            assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5
            assert p.sh is None or torch.count_nonzero(p.sh) == 0  # no pool slot in use: no workspace


@pytest.mark.parametrize("runs", [0, 1], ids=["up_kernel", "expand_act_runs"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_slots_in_order_take_grouped_gemms_and_match_the_reference(interleaved, runs, monkeypatch):
    monkeypatch.setattr(tb, "grouped_mode", lambda *a: "epi")
    monkeypatch.setattr(tb, "EXPAND_RUN_TOKENS", runs)
    monkeypatch.setattr(tb, "pick_tiles", lambda *a: CUBLAS)  # as at 512+ tokens on the H200
    sink, x, gammas, _ = make_case(2, 40, 24, 8, 4, 29, True, interleaved, seed=5)
    ops = sink.operands()
    # slot 1 has no tokens (an empty group); uneven runs; scalings per slot
    batch = SlotBatch.from_segments([7, 12, 10], [0, 2, 3], 4, lora_ranks=[8, 8, 8, 8], scalings=[0.6, 1.0, 1.4, 0.8])
    p = tb.plan(ops, 29, batch, x.device)
    assert p.grouped == "epi" and p.offs.tolist() == [7, 7, 19, 29]
    assert (p.act_runs is not None) == (runs > 0)
    out, _ = run(sink, x, gammas, batch)
    assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5
    assert torch.count_nonzero(p.sh) == 0


@pytest.mark.parametrize("programs", [1, 1 << 20], ids=["one_walks_each_run", "one_tile_each"])
@pytest.mark.parametrize("mode", ["", "epi"], ids=["triton_shrinks", "grouped_epi"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_the_down_expand_walks_each_run_of_several_slots(interleaved, mode, programs, monkeypatch):
    """v38: ``expand_down_kernel`` adds each run's down expand onto cuBLAS's ``out``, one slot's ``down_B`` block kept a
    program: runs of three slots in no order with base-only and rank-0 runs on the Triton shrinks' path (whose
    workspace it re-zeroes), in slot order with an empty slot through the grouped GEMMs (``epi``)."""
    monkeypatch.setattr(tb, "DOWN_RUN_TOKENS", 1)
    monkeypatch.setattr(tb, "TARGET_PROGRAMS", programs)
    monkeypatch.setattr(tb, "grouped_mode", lambda *a: mode)
    monkeypatch.setattr(tb, "pick_tiles", lambda *a: CUBLAS)
    sink, x, gammas, _ = make_case(2, 40, 24, 8, 4, 45, True, interleaved, seed=47)
    if mode:
        batch = SlotBatch.from_segments([9, 20, 16], [0, 2, 3], 4, lora_ranks=[8, 8, 8, 8],
                                        scalings=[0.6, 1.0, -1.4, 0.8])
    else:
        batch = SlotBatch.from_segments([9, 3, 7, 1, 8, 5, 6, 6], [2, -1, 0, 3, 1, 2, 3, 0], 4,
                                        lora_ranks=[8, 0, 8, 8], scalings=[0.7, 1.0, -1.2, 1.5])
    ops = sink.operands()
    p = tb.plan(ops, 45, batch, x.device)
    assert p.grouped == mode and p.down_runs is not None and p.cats is None
    for _ in range(2):  # a repeat launch on the plan: the workspace left zero
        out = torch.full_like(x, float("nan"))
        tb.launch(ops, x, gammas, p, out)
        assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5
        assert torch.count_nonzero(p.sh) == 0
    monkeypatch.setattr(tb, "DOWN_RUN_TOKENS", 0)
    assert tb.plan(ops, 45, batch, x.device).down_runs is None
    per_expert, *_ = make_case(2, 40, 24, 8, 4, 45, False, interleaved, seed=47)
    monkeypatch.setattr(tb, "DOWN_RUN_TOKENS", 1)
    assert tb.plan(per_expert.operands(), 45, batch, x.device).down_runs is None  # shared outer only


def test_the_down_runs_are_planned_from_the_measured_run_length(monkeypatch):
    """v38 as ``h100_multi_v38.json`` measured it: runs averaging ``DOWN_RUN_TOKENS`` (256) tokens or more on the
    several-slot cuBLAS path take ``expand_down_kernel``; shorter ones, and batches ``slot_cats`` takes, do not."""
    monkeypatch.setattr(tb, "pick_tiles", lambda *a: CUBLAS)
    sink, x, gammas, _ = make_case(2, 40, 24, 8, 4, 768, True, True, seed=3)
    ops = sink.operands()
    ranks = [8, 8, 8, 8]
    even = SlotBatch.from_segments([256, 256, 256], [2, 0, 3], 4, lora_ranks=ranks)
    assert tb.DOWN_RUN_TOKENS == 256 and tb.plan(ops, 768, even, x.device).down_runs.longest == 256
    short = SlotBatch.from_segments([256, 255, 1, 256], [2, 0, 1, 3], 4, lora_ranks=ranks)  # 192 a run
    assert tb.plan(ops, 768, short, x.device).down_runs is None
    monkeypatch.setattr(tb, "SLOT_CAT_TOKENS", 1)
    assert tb.plan(ops, 768, even, x.device).down_runs is None  # the down GEMM's K carries it instead (v37)


def test_the_activation_tiles_follow_v54s_measurements():
    """v54 (``h100_activation_v54*.json``): the activation with the expand keeps a second buffer in flight (three
    stages) at every measured point but several slots' runs at rank 64 on A's and the TP-8 slice's features, which
    keep two; the one-slot chain takes it on those shapes too."""
    def ops(shape: str, R: int) -> SimpleNamespace:
        g = PRESETS[shape]
        return SimpleNamespace(n=g.n, intermediate=g.intermediate, max_rank=R)
    for shape in ("A", "B", "inkling", "inkling-tp8"):
        for R in (16, 64):
            assert tb.expand_tiles(ops(shape, R), False).stages == 3
            deep = R == 16 or shape in ("B", "inkling")
            assert tb.expand_tiles(ops(shape, R), True).stages == (3 if deep else 2), (shape, R)
    assert tb.expand_tiles(ops("B", 64), True) == replace(tb.ONE_SLOT_TILES, stages=3)


def route_slot_cats(monkeypatch) -> None:
    """Send several-slot batches of these tiny weights down the cuBLAS path with v37's down side."""
    monkeypatch.setattr(tb, "pick_tiles", lambda *a: CUBLAS)
    monkeypatch.setattr(tb, "SLOT_CAT_TOKENS", 1)
    monkeypatch.setattr(tb, "SLOT_CAT_RANKS", 1 << 30)


@pytest.mark.parametrize("mode", ["", "epi"], ids=["triton_shrinks", "grouped_epi"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_several_slots_add_the_down_expand_as_more_k_of_the_down_gemm(interleaved, mode, monkeypatch):
    """v37: each used slot's ``B^T`` a block of rows after ``w2_lin``'s, each token's scaled down shrink in its own
    slot's block of ``act_cat``: one GEMM writes ``out``. Slot 1 has no tokens and gets no block; the Triton
    shrinks' batch (``""``) also has base-only tokens, a rank-0 slot and its runs out of order."""
    route_slot_cats(monkeypatch)
    monkeypatch.setattr(tb, "grouped_mode", lambda *a: mode)
    sink, x, gammas, _ = make_case(2, 40, 24, 8, 4, 29, True, interleaved, seed=11)
    ops = sink.operands()
    w2_lin = ops.w2_lin.clone()
    if mode:
        batch = SlotBatch.from_segments([7, 12, 10], [0, 2, 3], 4, lora_ranks=[8, 8, 8, 8],
                                        scalings=[0.6, 1.0, -1.4, 0.8])
    else:
        batch = SlotBatch.from_segments([5, 6, 4, 9, 5], [3, -1, 0, 1, 3], 4, lora_ranks=[8, 0, 8, 8],
                                        scalings=[0.6, 1.0, -1.4, 0.8])
    p = tb.plan(ops, 29, batch, x.device)
    assert p.grouped == mode and p.cats is not None
    assert p.cats.slots.tolist() == ([0, 2, 3] if mode else [0, 3])     # slot 1: no tokens, or rank 0
    assert p.cats.block.tolist() == ([0, -1, 1, 2] if mode else [0, -1, -1, 1])
    for _ in range(2):  # a repeat launch on the plan: the shrink workspace left zero
        out = torch.full_like(x, float("nan"))
        tb.launch(ops, x, gammas, p, out)
        assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5
        assert torch.count_nonzero(p.sh) == 0
    assert torch.equal(ops.w2_lin, w2_lin)  # the base rows are never written
    G, R = p.cats.slots.numel(), 8
    rows = ops.w2_cat[48:48 + G * R].view(G, R, 40)
    assert torch.equal(rows, ops.buffers[3][p.cats.slots, 0].transpose(1, 2))


def test_the_spread_copies_each_used_slots_down_b_in_column_blocks_every_forward(monkeypatch):
    """v55: ``spread_kernel`` writes the used slots' ``B_s^T`` rows of ``w2_cat`` itself, ``SPREAD_ROWS_H`` columns a
    program (16 here: three blocks of ``H = 40``, the last one short), at every launch: a pool slot written in place
    between two launches of one plan (an adapter loaded into it) is the one the second forward reads."""
    route_slot_cats(monkeypatch)
    monkeypatch.setattr(tb, "grouped_mode", lambda *a: "")
    monkeypatch.setattr(tb, "SPREAD_ROWS_H", 16)
    sink, x, gammas, _ = make_case(2, 40, 24, 8, 4, 29, True, True, seed=5)
    batch = SlotBatch.from_segments([9, 11, 9], [2, 0, 3], 4, lora_ranks=[8, 8, 8, 8], scalings=[0.6, 1.0, -1.4, 0.8])
    ops = sink.operands()
    p = tb.plan(ops, 29, batch, x.device)
    assert p.cats is not None and p.cats.slots.tolist() == [0, 2, 3]
    rows = ops.w2_cat[48:48 + 3 * 8].view(3, 8, 40)
    for step in range(2):
        if step:
            with torch.no_grad():
                ops.buffers[3][2].copy_(torch.randn_like(ops.buffers[3][2]) * 3)  # slot 2 refilled in place
        rows.fill_(float("nan"))
        out = tb.launch(ops, x, gammas, p, torch.empty_like(x))
        assert torch.equal(rows, ops.buffers[3][p.cats.slots, 0].transpose(1, 2))
        assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(8, 40), F=st.integers(4, 24), R=st.integers(1, 9), S=st.integers(2, 5),
       T=st.integers(2, 40), interleaved=st.booleans(), seed=st.integers(0, 2**16))
def test_the_several_slot_down_k_matches_the_reference_on_random_batches(n, H, F, R, S, T, interleaved, seed):
    """v37 on random shapes, pools and batches (tokens of any slot in any order, base-only ones, a rank-0 slot)."""
    with pytest.MonkeyPatch.context() as m:
        route_slot_cats(m)
        sink, x, gammas, batch = make_case(n, H, F, R, S, T, True, interleaved, seed)
        ops = sink.operands()
        p = tb.plan(ops, T, batch, x.device)
        used = sorted({s for s in p.slots.tolist() if s >= 0})
        assert (p.cats is not None) == (len(used) > 1 and p.grouped == "")
        out = torch.full_like(x, float("nan"))
        tb.launch(ops, x, gammas, p, out)
        assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5


def test_slot_cats_follows_the_measured_tokens_and_ranks():
    """v37 as ``h100_multi_v37.json`` measured it: from 2048 tokens where the used slots' ranks add up to 64, from
    8192 where they add up to 128, never beyond; one slot is ``cats``' (v27), not this."""
    ops = SimpleNamespace(w2_cat=torch.empty(6144 + 8 * 64, 1), n=2, intermediate=3072, hidden=6144, max_rank=16,
                          shared_outer=True)
    assert tb.slot_cats(2048, ops, 4) and not tb.slot_cats(2047, ops, 4) and not tb.slot_cats(8192, ops, 1)
    assert tb.slot_cats(8192, ops, 8) and not tb.slot_cats(8191, ops, 8)   # G R = 128
    assert not tb.slot_cats(8192, ops, 9)                                 # G R = 144: not measured ahead
    ops.max_rank = 64
    assert not tb.slot_cats(1 << 20, ops, 4)                               # G R = 256: never
    assert tb.slot_cats(8192, ops, 2)                                     # G R = 128
    assert not tb.slot_cats(8192, SimpleNamespace(**{**vars(ops), "shared_outer": False}), 2)
    assert not tb.slot_cats(8192, SimpleNamespace(**{**vars(ops), "w2_cat": None}), 2)
    assert not tb.slot_cats(8192, SimpleNamespace(**{**vars(ops), "w2_cat": torch.empty(6144 + 100, 1)}), 2)


def test_slot_cats_comes_before_the_merge_where_both_route():
    """A and TP8 R 16 S 4 T 8192: ``merges`` routes them, v37 was faster there (0.97-0.98x the merge)."""
    for shape in ("A", "inkling-tp8"):
        g = PRESETS[shape]
        ops = SimpleNamespace(w2_cat=torch.empty(g.n * g.intermediate + 64, 1), n=g.n, intermediate=g.intermediate,
                              hidden=g.hidden, max_rank=16, shared_outer=True, dtype=torch.bfloat16)
        assert tb.merges(8192, ops, 4) and tb.grouped_mode(8192, ops, torch.device("cuda"), 4) == "epi"
        ops.max_rank = 64                                                  # G R = 256: the merge, as before
        assert tb.grouped_mode(8192, ops, torch.device("cuda"), 4) == "merge"


def test_grouped_gemms_only_where_every_token_has_a_slot_in_order(monkeypatch):
    monkeypatch.setattr(tb, "GROUPED_TOKENS", 20)
    monkeypatch.setattr(tb, "pick_tiles", lambda *a: CUBLAS)
    sink, x, gammas, _ = make_case(2, 40, 24, 8, 4, 29, True, True, seed=6)
    ops = sink.operands()
    ranks = [8, 8, 8, 8]
    for segs, slots, why in (([10, 19], [2, 0], "out of order"), ([10, 19], [-1, 1], "base-only tokens")):
        b = SlotBatch.from_segments(segs, slots, 4, lora_ranks=ranks)
        assert tb.plan(ops, 29, b, x.device).offs is None, why
    zero = SlotBatch.from_segments([10, 19], [0, 1], 4, lora_ranks=[8, 0, 8, 8])  # slot 1 at rank 0: no LoRA
    assert tb.plan(ops, 29, zero, x.device).offs is None
    assert tb.plan(ops, 19, SlotBatch.from_segments([9, 10], [0, 1], 4, lora_ranks=ranks), x.device).offs is None
    b = SlotBatch.from_segments([10, 19], [0, 1], 4, lora_ranks=ranks)
    assert tb.plan(ops, 29, b, x.device).grouped == "epi"
    odd, *_ = make_case(2, 40, 24, 5, 4, 29, True, True, seed=6)
    assert tb.plan(odd.operands(), 29, b, x.device).offs is None  # rank 5: rows of 10 bytes


@pytest.mark.parametrize("shape", ["A", "B", "inkling", "inkling-tp8"])
def test_grouped_mode_follows_the_measured_grid(shape):
    """``grouped_mode`` as KERNEL_NOTES v20 and v41 measured it, four slots with tokens: rank 64 from 512
    tokens on every shape (v41; v21 had 2048 but on Inkling's weights), rank 16 from 8192 (v20's ``fold`` at rank
    64 from 4096 tokens on B and Inkling left in v39); merged weights at 8192 tokens on A and TP-8 (``merges``) at
    rank 64, where at rank 16 the down expand as more ``K`` (v37, ``slot_cats``) comes first."""
    g = PRESETS[shape]
    def ops(rank, **kw):
        return SimpleNamespace(**{"shared_outer": True, "max_rank": rank, "dtype": torch.bfloat16, "n": g.n,
                                  "intermediate": g.intermediate, "hidden": g.hidden,
                                  "w2_cat": torch.empty(g.n * g.intermediate + 8 * 64, 1), **kw})
    cuda = torch.device("cuda")
    merged = shape in ("A", "inkling-tp8")
    assert [tb.grouped_mode(T, ops(64), cuda, 4) for T in (511, 512, 2047, 2048, 4096, 8192)] == \
        ["", "epi", "epi", "epi", "epi", "merge" if merged else "epi"]
    assert [tb.grouped_mode(T, ops(16), cuda, 4) for T in (2048, 8191, 8192)] == ["", "", "epi"]
    assert [tb.grouped_mode(T, ops(16, w2_cat=None), cuda, 4) for T in (2048, 8191, 8192)] == \
        ["", "merge" if merged else "", "merge" if merged else "epi"]  # A and TP-8 merge from 6144 and 5462
    assert tb.grouped_mode(8192, ops(16), cuda, 8) == "epi"  # eight merges cost more than the LoRA they replace
    assert tb.grouped_mode(8192, ops(64, dtype=torch.float16), cuda, 4) == ""  # torch's host-side loop
    assert tb.grouped_mode(8192, ops(64, dtype=torch.float16), torch.device("cpu"), 4) != ""
    assert tb.grouped_mode(8192, ops(64, shared_outer=False), cuda, 4) == ""
    # rows of 120 bytes: not 16-byte aligned for the grouped LoRA GEMMs; the merged weights have no rank rows
    assert tb.grouped_mode(8192, ops(60), cuda, 4) == ("merge" if merged else "")
    assert tb.grouped_mode(8192, ops(60), cuda, 8) == ""


@pytest.mark.parametrize("shape", ["A", "B", "inkling", "inkling-tp8"])
def test_one_slot_merges_from_the_measured_token_count(shape):
    """``merges`` for one slot as v21 measured it (``history/h200_merge_v21c.json``): A and TP-8 from 2048 tokens, B
    from 4096, Inkling from 8192; never for the per-expert outer (no merged operands there)."""
    g = PRESETS[shape]
    ops = SimpleNamespace(shared_outer=True, n=g.n, intermediate=g.intermediate, hidden=g.hidden)
    first = {"A": 2048, "inkling-tp8": 2048, "B": 4096, "inkling": 8192}[shape]
    assert [tb.merges(T, ops, 1) for T in (1024, 2048, 4096, 8192)] == [T >= first for T in (1024, 2048, 4096, 8192)]
    assert not tb.merges(8192, SimpleNamespace(**{**vars(ops), "shared_outer": False}), 1)
    assert not tb.merges(1 << 20, ops, 0)


def _merge_case(monkeypatch, interleaved, seed):
    """A pool whose merges route at 29 tokens (``MERGE_RATIO`` small), tiles as on the cuBLAS path, and
    ``merge_kernel`` steps small enough that its row blocks, column steps and splits all run."""
    monkeypatch.setattr(tb, "MERGE_RATIO", 0.1)
    monkeypatch.setattr(tb, "pick_tiles", lambda *a: CUBLAS)
    monkeypatch.setattr(tb, "MERGE_TILE", (16, 16, 1))  # several row and column tiles
    return make_case(2, 40, 24, 8, 4, 29, True, interleaved, seed=seed)


@pytest.mark.parametrize("segments, slots", [([7, 12, 10], [0, 2, 3]), ([29], [2])], ids=["three_runs", "one_slot"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_merged_weights_match_the_reference(segments, slots, interleaved, monkeypatch):
    sink, x, gammas, _ = _merge_case(monkeypatch, interleaved, seed=11 + int(interleaved))
    ops = sink.operands()
    w13, w2 = ops.w13.clone(), ops.w2.clone()
    batch = SlotBatch.from_segments(segments, slots, 4, lora_ranks=[8, 8, 8, 8], scalings=[0.6, 1.0, 1.4, 0.8])
    p = tb.plan(ops, 29, batch, x.device)
    assert p.grouped == "merge" and p.merge_slots.tolist() == slots
    assert p.runs == tuple(zip([0, *torch.tensor(segments).cumsum(0).tolist()[:-1]], torch.tensor(segments).cumsum(0).tolist()))
    ref = reference_forward(ops, x, gammas, batch)
    for _ in range(2):  # a repeat launch on the plan: nothing of the last one is reused
        out, _ = run(sink, x, gammas, batch)
        assert rel(out, ref) < 1e-5
    assert torch.equal(ops.w13, w13) and torch.equal(ops.w2, w2)  # the base weights are read, never written
    assert rel(sink.base_forward(x, gammas), ref) > 0.05


def test_merged_weights_follow_an_in_place_pool_update(monkeypatch):
    """The merge is made at every launch from the pool as it is then: an adapter written into its slot
    between two launches on one plan (in place, then ``on_lora_slots_updated``, as sglang 0.5.23's
    ``srt/lora/lora_manager.py``: ``LoRAManager.fetch_new_loras`` -> ``_notify_lora_slots_updated``
    does) changes the second forward (nothing merged is cached)."""
    sink, x, gammas, _ = _merge_case(monkeypatch, True, seed=13)
    ops = sink.operands()
    batch = SlotBatch.from_segments([29], [1], 4, lora_ranks=[8] * 4)
    p = tb.plan(ops, 29, batch, x.device)
    assert p.grouped == "merge"
    first = tb.launch(ops, x, gammas, p)
    for buf in ops.buffers:
        buf[1].mul_(-0.5)
    sink.on_lora_slots_updated([1])
    second = tb.launch(ops, x, gammas, p)
    assert rel(second, reference_forward(ops, x, gammas, batch)) < 1e-5
    assert rel(first, second) > 1e-3


def test_merges_only_where_every_token_has_a_slot_in_order(monkeypatch):
    sink, x, gammas, _ = _merge_case(monkeypatch, True, seed=14)
    ops = sink.operands()
    ranks = [8, 8, 8, 8]
    for segs, slots, why in (([10, 19], [2, 0], "out of order"), ([10, 19], [-1, 1], "base-only tokens")):
        p = tb.plan(ops, 29, SlotBatch.from_segments(segs, slots, 4, lora_ranks=ranks), x.device)
        assert p.grouped != "merge" and p.merge_slots is None, why
    resident = SlotBatch.from_segments([29], [1], 4, lora_ranks=ranks).to(x.device)
    assert tb.plan(ops, 29, resident, x.device).grouped == ""  # its slots are not read on the host
    explicit = tb.plan(ops, 29, SlotBatch.from_segments([29], [1], 4, lora_ranks=ranks), x.device, CUBLAS)
    assert explicit.grouped == ""  # tiles given: the caller's path, not the router's


@settings(max_examples=6, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4), first=st.integers(0, 2),
       gaps=st.lists(st.integers(1, 2), min_size=3, max_size=3), R=st.integers(1, 6), n=st.integers(1, 3),
       interleaved=st.booleans(), scalings=st.lists(st.floats(0.25, 2.0), min_size=9, max_size=9),
       seed=st.integers(0, 10_000))
def test_merged_weights_match_the_reference_on_random_runs(lengths, first, gaps, R, n, interleaved, scalings, seed):
    """Any runs of one slot each in slot order (empty slots between them, any rank, scalings and
    expert count, one expert's transposed ``w2_lin`` view among them): ``merge_operands`` covers the
    tokens run by run, and the merged forward is the reference's. Routed by ``merges`` with its
    constant made small, as at 2048+ tokens on the H200."""
    slots = [first]
    for gap in gaps[:len(lengths) - 1]:
        slots.append(slots[-1] + gap)
    S = slots[-1] + 1
    T = sum(lengths)
    g = Geometry(n=n, hidden=24, intermediate=12, max_rank=R, slots=S, outer=1)  # rows of 16 bytes' multiples
    sc = Scenario.random(g, tokens=T, seed=seed, interleaved=interleaved)
    batch = SlotBatch.from_segments(lengths, slots, S, lora_ranks=[R] * S, scalings=scalings[:S])
    ops = sc.sink.operands()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tb, "MERGE_RATIO", 1e-3)
        m.setattr(tb, "pick_tiles", lambda *a: CUBLAS)
        m.setattr(tb, "MERGE_TILE", (16, 16, 1))
        p = tb.plan(ops, T, batch, sc.x.device)
        assert p.grouped == "merge" and p.merge_slots.tolist() == slots
        ends = torch.tensor(lengths).cumsum(0).tolist()
        assert p.runs == tuple(zip([0, *ends[:-1]], ends)) and p.offs.tolist() == ends
        out = torch.full_like(sc.x, float("nan"))
        tb.launch(ops, sc.x, sc.gammas, p, out)
    assert rel(out, reference_forward(ops, sc.x, sc.gammas, batch)) < 1e-5


def _kept_case(monkeypatch, seed, S=4, T=29):
    """``_merge_case``'s pool with merges kept (``SharedSinkLoRA.keep_merged``) and no merge routed
    at launch, so a ``"kept"`` plan can only come from the kept copies."""
    monkeypatch.setattr(tb, "MERGE_RATIO", float("inf"))
    monkeypatch.setattr(tb, "pick_tiles", lambda *a: CUBLAS)
    return make_case(2, 40, 24, 8, S, T, True, True, seed=seed)


@pytest.mark.parametrize("segments, slots", [([29], [2]), ([7, 22], [0, 3]), ([5, 9, 15], [1, 2, 3])],
                         ids=["one_slot", "two_runs_a_kept_slot_between", "three_runs"])
def test_kept_merges_run_the_base_gemms_on_the_copies(segments, slots, monkeypatch):
    sink, x, gammas, _ = _kept_case(monkeypatch, seed=21)
    monkeypatch.setattr(tb, "KEEP_TOKENS", 0.01)
    scalings = [0.6, 1.0, 1.4, 0.8]
    sink.keep_merged(dict(enumerate(scalings)))
    ops = sink.operands()
    batch = SlotBatch.from_segments(segments, slots, 4, lora_ranks=[8] * 4, scalings=scalings)
    p = tb.plan(ops, 29, batch, x.device)
    ends = torch.tensor(segments).cumsum(0).tolist()
    assert p.grouped == "kept" and p.merge_rows == tuple(slots) and p.runs == tuple(zip([0, *ends[:-1]], ends))
    # offs over the kept rows the runs span; a kept row between them without tokens ends where the one before does
    span = list(range(slots[0], slots[-1] + 1))
    assert p.offs.tolist() == [sum(n for n, s in zip(segments, slots) if s <= r) for r in span]
    out = torch.full_like(x, float("nan"))
    tb.launch(ops, x, gammas, p, out)
    assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5


def test_kept_merges_route_only_where_every_used_slot_is_kept_at_the_batchs_scaling(monkeypatch):
    sink, x, gammas, _ = _kept_case(monkeypatch, seed=22)
    monkeypatch.setattr(tb, "KEEP_TOKENS", 0.01)
    sink.keep_merged({1: 0.5, 2: 1.25})
    ops = sink.operands()

    def routed(segments, slots, scalings=(1.0, 0.5, 1.25, 1.0), tokens=29, tiles=None, ranks=(8, 8, 8, 8)):
        batch = SlotBatch.from_segments(segments, slots, 4, lora_ranks=list(ranks), scalings=list(scalings))
        p = tb.plan(ops, tokens, batch, x.device, tiles)
        if tokens == 29:  # every plan, kept or not, is the adapters' forward
            out = torch.full_like(x, float("nan"))
            tb.launch(ops, x, gammas, p, out)
            assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5
        return p.grouped == "kept"

    assert routed([29], [1]) and routed([10, 19], [1, 2])
    assert not routed([29], [1], scalings=(1.0, 0.75, 1.25, 1.0)), "another scaling than the kept one"
    assert not routed([10, 19], [1, 3]), "slot 3 is not kept"
    assert not routed([10, 19], [2, 1]), "runs out of slot order"
    assert not routed([10, 19], [-1, 1]), "base-only tokens"
    assert not routed([29], [1], tiles=CUBLAS), "tiles given: the caller's path"
    assert not routed([29], [1], ranks=(8, 0, 8, 8)), "a rank-0 slot has no LoRA to merge"
    monkeypatch.setattr(tb, "pick_tiles", lambda *a: replace(FUSED, gemv=True))
    assert routed([1], [1], tokens=1), "one token streams its slot's copies (GEMV, no LoRA)"
    assert not routed([1], [3], tokens=1), "one token of a slot not kept: the GEMV with its LoRA"
    monkeypatch.setattr(tb, "pick_tiles", lambda *a: FUSED)
    assert routed([29], [1]), "a one-slot batch on the Triton tiles takes the kept copies on cuBLAS"
    monkeypatch.setattr(tb, "KEEP_TOKENS", 1e6)
    assert routed([29], [1]) and not routed([10, 19], [1, 2]), "several slots: from keeps' token count"


@pytest.mark.parametrize("n, interleaved, per_expert, tiles", [
    (2, True, False, "cublas"), (3, False, False, "fused"), (1, True, True, "gemv"), (2, False, True, "cublas")],
    ids=["two_interleaved", "three_contiguous", "one_per_expert", "two_contiguous_per_expert"])
def test_one_token_streams_its_kept_copies_through_the_gemv_kernels(n, interleaved, per_expert, tiles, monkeypatch):
    """One token of a kept slot takes the GEMV tiles whatever ``pick_tiles`` gives for its weights (v23):
    the up kernel on the slot's ``w13`` copy, the down kernel on its ``w2`` copy read at the copy's row
    strides (``[H, n*F]``: experts ``F`` apart, rows ``n*F`` apart); the forward is the reference's for the
    kept row past the first (the copies' offset), and the base weights' own GEMV is unchanged."""
    small_gemv = tb.gemv_tiles(bf=8, bk=16, bn=8, dk=8)  # several feature and row tiles at these sizes
    picked = {"cublas": CUBLAS, "fused": FUSED, "gemv": small_gemv}[tiles]
    monkeypatch.setattr(tb, "pick_tiles", lambda *a: picked)
    g = Geometry(n=n, hidden=40, intermediate=24, max_rank=8, slots=4, outer=n if per_expert else 1)
    sc = Scenario.random(g, tokens=1, seed=31 + n, interleaved=interleaved)
    scalings = [0.6, 1.0, 1.4, 0.8]
    sc.sink.keep_merged({0: scalings[0], 2: scalings[2]})
    ops = sc.sink.operands()
    batch = SlotBatch.from_segments([1], [2], 4, scalings=scalings)
    p = tb.plan(ops, 1, batch, sc.x.device)
    assert p.grouped == "kept" and p.tiles.gemv and p.merge_rows == (1,)
    out = torch.full_like(sc.x, float("nan"))
    tb.launch(ops, sc.x, sc.gammas, p, out)
    assert rel(out, reference_forward(ops, sc.x, sc.gammas, batch)) < 1e-5
    assert rel(out, sc.sink.base_forward(sc.x, sc.gammas)) > 0.05  # the copies hold the adapter
    base = tb.plan(ops, 1, None, sc.x.device, small_gemv)
    assert rel(tb.launch(ops, sc.x, sc.gammas, base), reference_forward(ops, sc.x, sc.gammas, None)) < 1e-5


def test_up_acts_routes_one_kept_slot_by_its_programs_and_tokens():
    """v25's and v26's routing read off ``h100_act_down.json`` and ``h100_act_down_v26_tp8.json``: unsplit from 2 to
    32 tokens (64 on weights over ``SMALL_WEIGHTS``) where ``up_act_kernel`` has ``UP_ACT_PROGRAMS`` programs or
    more, else split up to 16 tokens; at the benchmark shapes' real sizes."""
    def routed(preset, tokens):
        g = PRESETS[preset]
        return tb.up_acts(tokens, SimpleNamespace(n=g.n, intermediate=g.intermediate, hidden=g.hidden))

    unsplit, split = tb.UP_ACT_TILES, tb.UP_ACT_SPLIT_TILES
    for preset in ("A", "B", "inkling"):
        assert [routed(preset, t) for t in (1, 2, 32)] == [None, unsplit, unsplit], preset
    assert [routed(p, 64) for p in ("A", "B", "inkling")] == [None, unsplit, unsplit]  # A's weights are small
    assert all(routed(p, 65) is None for p in ("A", "B", "inkling"))
    assert [routed("inkling-tp8", t) for t in (1, 2, 16, 17, 32)] == [None, split, split, None, None]
    assert split.up_act and split.bf == 32 and split.ksplit == tb.UP_ACT_SPLIT == 4  # 12 tiles of 64 features: 96 programs


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 3), H=st.sampled_from([24, 40]), F=st.sampled_from([16, 24, 40]), T=st.integers(2, 32),
       interleaved=st.booleans(), per_expert=st.booleans(), second=st.booleans(), split=st.booleans(),
       seed=st.integers(0, 10_000))
def test_a_few_tokens_of_a_kept_slot_run_the_activation_in_the_up_gemm(n, H, F, T, interleaved, per_expert, second,
                                                                       split, seed):
    """``up_act_kernel`` then the down GEMM on a kept slot's copies (v25): any expert count, layout and outer
    layout, the first kept row or one past it, 2-32 tokens (16- and 32-token tiles), tiles whose features and
    steps do not divide ``F`` and ``H``, unsplit or split (v26: ``H`` over ``UP_ACT_SPLIT`` programs a tile, some
    of them with an empty slice here); the forward is the reference's, and a second launch of the same plan
    (the repeat-launch path, on the workspace the first left zero) gives the same output."""
    g = Geometry(n=n, hidden=H, intermediate=F, max_rank=4, slots=3, outer=n if per_expert else 1)
    sc = Scenario.random(g, tokens=T, seed=seed, interleaved=interleaved)
    scalings = [0.7, 1.3, -0.6]
    slot = 2 if second else 0
    sc.sink.keep_merged({0: scalings[0], 2: scalings[2]})
    ops = sc.sink.operands()
    batch = SlotBatch.from_segments([T], [slot], 3, scalings=scalings)
    with pytest.MonkeyPatch.context() as m:  # small tiles that leave remainders here; split: no program count is enough
        m.setattr(tb, "UP_ACT_PROGRAMS", 10 ** 6 if split else 1)
        m.setattr(tb, "UP_ACT_SPLIT_TOKENS", 32)
        m.setattr(tb, "UP_ACT_TILES", replace(tb.UP_ACT_TILES, bf=16, bk=16, stages=2))
        m.setattr(tb, "UP_ACT_SPLIT_TILES", replace(tb.UP_ACT_SPLIT_TILES, bf=16, bk=16, stages=2))
        p = tb.plan(ops, T, batch, sc.x.device)
    assert p.grouped == "kept" and p.tiles.up_act and p.merge_rows == (int(second),)
    assert (p.split is not None and p.split.up == tb.UP_ACT_SPLIT) == split
    outs = [torch.full_like(sc.x, float("nan")) for _ in range(2)]
    for out in outs:
        tb.launch(ops, sc.x, sc.gammas, p, out)
    assert rel(outs[0], reference_forward(ops, sc.x, sc.gammas, batch)) < 1e-5 and torch.equal(*outs)
    if split:
        assert not p.split.ws_up.any() and not p.split.cnt_up.any()
    assert rel(outs[0], sc.sink.base_forward(sc.x, sc.gammas)) > 1e-2  # the copy holds the adapter


@pytest.mark.parametrize("segments, slots, streams", [
    ([12, 17], [0, 3], True), ([5, 9, 15], [1, 2, 3], True), ([3, 4, 5, 6, 11], [0, 1, 2, 3, 4], False),
    ([29], [2], False), ([2, 27], [0, 3], True)],
    ids=["two_runs", "three_runs", "five_runs_past_RUN_STREAMS", "one_run", "uneven_runs"])
def test_kept_runs_take_a_stream_each_up_to_run_streams(segments, slots, streams, monkeypatch):
    """v24: up to ``RUN_STREAMS`` kept runs averaging ``RUN_STREAM_TOKENS`` tokens each run one GEMM per run
    and side (on a stream each on CUDA, one after another here), and the forward is the adapters'."""
    sink, x, gammas, _ = _kept_case(monkeypatch, seed=24, S=5)
    monkeypatch.setattr(tb, "KEEP_TOKENS", 0.01)
    monkeypatch.setattr(tb, "RUN_STREAM_TOKENS", 5)
    scalings = [0.6, 1.0, 1.4, 0.8, 1.1]
    sink.keep_merged(dict(enumerate(scalings)))
    ops = sink.operands()
    batch = SlotBatch.from_segments(segments, slots, 5, lora_ranks=[8] * 5, scalings=scalings)
    p = tb.plan(ops, 29, batch, x.device)
    assert p.grouped == "kept" and p.run_streams == streams
    out = torch.full_like(x, float("nan"))
    tb.launch(ops, x, gammas, p, out)
    assert rel(out, reference_forward(ops, x, gammas, batch)) < 1e-5
    monkeypatch.setattr(tb, "RUN_STREAM_TOKENS", 1024)
    assert not tb.plan(ops, 29, batch, x.device).run_streams  # 29 tokens: too few a run


def test_kept_merges_follow_a_slot_write_through_the_same_plan(monkeypatch):
    """After ``on_lora_slots_updated`` the plan made before the write is reused (same kept record, same
    storage: a graph captured on it replays the new merge) and gives the new adapter's forward."""
    sink, x, gammas, _ = _kept_case(monkeypatch, seed=23)
    sink.keep_merged({2: 1.0})
    batch = SlotBatch.from_segments([29], [2], 4, lora_ranks=[8] * 4)
    ops = sink.operands()
    p = tb.cached_plan(ops, 29, batch, x.device)
    first = tb.launch(ops, x, gammas, p)
    for buf in ops.buffers:
        buf[2].mul_(-0.5)
    sink.on_lora_slots_updated([2])
    assert sink.operands() is ops and tb.cached_plan(sink.operands(), 29, batch, x.device) is p
    second = tb.launch(ops, x, gammas, p)
    assert rel(second, reference_forward(ops, x, gammas, batch)) < 1e-5 and rel(first, second) > 1e-3
    sink.keep_merged({2: 1.0, 3: 1.0})  # another kept record: plans of the last one are not reused
    assert tb.cached_plan(sink.operands(), 29, batch, x.device) is not p


@settings(max_examples=8, deadline=None)
@given(lengths=st.lists(st.integers(1, 7), min_size=1, max_size=4), first=st.integers(0, 2),
       gaps=st.lists(st.integers(1, 2), min_size=3, max_size=3), extra=st.lists(st.integers(0, 8), max_size=3),
       n=st.integers(1, 3), per_expert=st.booleans(), scalings=st.lists(st.floats(0.25, 2.0), min_size=9, max_size=9),
       seed=st.integers(0, 10_000))
def test_kept_merges_match_the_reference_on_random_runs(lengths, first, gaps, extra, n, per_expert, scalings, seed):
    """Runs of one slot each in slot order, every used slot kept and some unused ones too (rows with no
    tokens inside the span and outside it), any expert count, either outer layout: the kept forward is
    the reference's."""
    slots = [first]
    for gap in gaps[:len(lengths) - 1]:
        slots.append(slots[-1] + gap)
    S, T = 9, sum(lengths)
    g = Geometry(n=n, hidden=24, intermediate=12, max_rank=4, slots=S, outer=n if per_expert else 1)
    sc = Scenario.random(g, tokens=T, seed=seed)
    sc.sink.keep_merged({s: scalings[s] for s in {*slots, *extra}})
    batch = SlotBatch.from_segments(lengths, slots, S, scalings=scalings)
    ops = sc.sink.operands()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tb, "KEEP_TOKENS", 1e-3)
        m.setattr(tb, "pick_tiles", lambda *a: CUBLAS)
        p = tb.plan(ops, T, batch, sc.x.device)
        kept = sorted({*slots, *extra})
        assert p.grouped == "kept" and p.merge_rows == tuple(kept.index(s) for s in slots)
        out = torch.full_like(sc.x, float("nan"))
        tb.launch(ops, sc.x, sc.gammas, p, out)
    assert rel(out, reference_forward(ops, sc.x, sc.gammas, batch)) < 1e-5
