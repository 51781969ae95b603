"""The kit against a model of upstream's control flow, over random stateful sequences.

``UpstreamV1``/``UpstreamV2`` restate, as plainly as possible, what the two wrapper
generations of sglang 0.5.23 do (``srt/models/inkling_common/lora.py``:
``InklingBatchDenseMLPWithLoRA`` and ``...WithLoRAV2``; SPEC §3, §7): which check comes
first, what is adopted when, which view or copy fails. They are test helpers written
from the SPEC and the source, not the kit's code. Hypothesis drives the kit and the
model with the same calls: ``set_lora_info`` with random (often broken) buffers, again
with other shapes, slot refreshes with random ids, in-place pool updates, per-expert
pools in between; and random tensor-parallel slicing inputs. Every step must end the
same way: the same exception type and message for upstream's own raises, the same type
for torch's and Python's, the same derived operands otherwise. Two differences are the
kit's improvements (SPEC §3, §7), and the test holds the kit to them instead:

* a failing ``set_lora_info`` leaves the kit's module exactly as it was (upstream's
  first generation may have adopted the new buffers by then): the model is rolled back
  to its state before the call, and the kit must show that state;
* a ``tp_rank`` outside ``0..tp_size-1`` is refused (``ISL-K101``).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inkling_lab.errors import expect_error
from inkling_lab.lora import LoRABackend, SharedSinkLoRA
from inkling_lab.shard import slice_lora_a, slice_lora_b


def _raise(exc_type: type[BaseException], message: str):
    """Raise as upstream's code does itself: the message is part of the contract."""
    exc = exc_type(message)
    exc.upstream_raise = True
    raise exc


# -- the first generation ------------------------------------------------------------------
class UpstreamV1:
    """``InklingBatchDenseMLPWithLoRA`` after ``initialize_lora``: no pool, no operands."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.set_lora = False
        self.shared = False
        self.buffers = None
        self.w1 = self.acat = None

    def set_lora_info(self, ga, gb, da, db) -> None:
        n = self.n
        if any(t.ndim != 4 for t in (ga, gb, da, db)):
            _raise(ValueError, "Inkling shared-sink LoRA requires four 4D MoE buffers")
        if ga.shape[1] not in (1, n) or db.shape[1] not in (1, n):
            _raise(ValueError, f"Inkling shared-sink LoRA outer factors must have expert dimension 1 or {n}")
        if ga.shape[1] != db.shape[1]:
            _raise(ValueError, "Inkling shared-sink gate-up A and down B must use the same expert layout")
        if gb.shape[1] != n or da.shape[1] != n:
            _raise(ValueError, "Inkling shared-sink LoRA expert count does not match")
        r = gb.shape[-1]
        if ga.shape[2] != 2 * r or da.shape[2] != r or db.shape[-1] != r:
            _raise(ValueError, "Inkling shared-sink LoRA rank dimensions do not match")
        # adopted before anything else can fail
        self.set_lora, self.buffers, self.shared = True, (ga, gb, da, db), ga.shape[1] == 1
        if not self.shared:
            self.w1 = self.acat = None
            return
        slots, experts, rows, rank = gb.shape
        want_w1, want_acat = (slots, experts * rows, 2 * rank), (slots, rank, experts * da.shape[3])
        if self.w1 is None:
            self.w1, self.acat = gb.new_empty(want_w1), da.new_empty(want_acat)
        elif tuple(self.w1.shape) != want_w1 or tuple(self.acat.shape) != want_acat:
            _raise(RuntimeError, "Shared-sink LoRA pool shape changed after initialization: "
                                 f"gate-up {tuple(self.w1.shape)} -> {want_w1}, "
                                 f"down-A {tuple(self.acat.shape)} -> {want_acat}")
        self.refresh(None)

    def refresh(self, ids) -> None:
        if not self.set_lora or self.w1 is None or self.acat is None:
            return
        _, gb, da, _ = self.buffers
        slots, experts, rows, rank = gb.shape
        half = rows // 2
        if ids is None:
            ids = set(range(slots))
        elif any(i < 0 or i >= slots for i in ids):
            _raise(IndexError, f"Shared-sink LoRA slot out of range: {sorted(ids)}")
        pairs = self.w1.view(slots, experts, half, 2, 2 * rank)  # row 2f: gate, 2f+1: up
        cat = self.acat.view(slots, rank, experts, da.shape[3])
        for i in ids:
            pairs[i].zero_()
            pairs[i, :, :, 0, :rank].copy_(gb[i, :, :half, :])
            pairs[i, :, :, 1, rank:].copy_(gb[i, :, half:, :])
            cat[i].copy_(da[i].permute(1, 0, 2))

    def operands(self):
        return {"w1_delta": self.w1, "a_cat": self.acat}


# -- the second generation -----------------------------------------------------------------
class UpstreamV2:
    """``InklingBatchDenseMLPWithLoRAV2`` after ``initialize_lora``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.set_lora = False
        self.down_cat = None
        self.pair = None  # (source, target) of the refresh

    def set_lora_info(self, ga, gb, da, db) -> None:
        n = self.n
        slots, outer, two_rank, _ = ga.shape
        _, _, rows, rank = gb.shape
        hidden = db.shape[2]
        if (outer not in (1, n) or db.shape[1] != outer or gb.shape[1] != n or da.shape[1] != n
                or two_rank != 2 * rank or da.shape[2] != rank or db.shape[-1] != rank):
            _raise(ValueError, "Inkling shared-sink LoRA pool buffers do not agree: expected gate-up A "
                               f"[slots, 1 or {n}, 2R, H], gate-up B [slots, {n}, 2F, R], down A "
                               f"[slots, {n}, R, F], down B [slots, 1 or {n}, H, R] with one layout")
        shared = outer == 1
        want = (slots, rank, n * (rows // 2)) if shared else (slots, hidden, n * rank)
        down_cat = self.down_cat
        if down_cat is None:
            down_cat = da.new_empty(want)
        elif tuple(down_cat.shape) != want:
            _raise(RuntimeError, f"Shared-sink LoRA pool shape changed after initialization: "
                                 f"{tuple(down_cat.shape)} -> {want}")
        # the engine's GEMM sites
        ga[:, 0] if shared else ga.reshape(slots, n * 2 * rank, -1)
        gb.view(slots, n * rows, rank)
        tuple(range(0, n * rows + 1, rows // 2))
        db[:, 0] if shared else da.view(slots, n * rank, -1)
        source = (da if shared else db).permute(0, 2, 1, 3)
        self.pair = (source, down_cat.view_as(source))
        self.down_cat, self.shared, self.set_lora = down_cat, shared, True
        self.refresh(None)

    def refresh(self, ids) -> None:
        if not self.set_lora:
            return
        source, target = self.pair
        for i in range(source.shape[0]) if ids is None else ids:
            target[i].copy_(source[i])

    def operands(self):
        return {"down_cat": self.down_cat}


# -- driving both ----------------------------------------------------------------------------
def _outcome(fn):
    """``None`` on success, else ``(type, message or None)``: the message of upstream's
    own raises counts; for torch's and Python's own errors only the type does."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 -- any exception is an outcome to compare
        return type(exc), str(exc) if getattr(exc, "upstream_raise", False) else None
    return None


def _same_outcome(model_fn, kit_fn):
    want = _outcome(model_fn)
    try:
        kit_fn()
    except Exception as exc:  # noqa: BLE001
        assert want is not None, f"the kit raised {type(exc).__name__}: {exc}; upstream passes"
        assert type(exc) is want[0], f"the kit raised {type(exc).__name__}: {exc}; upstream {want}"
        if want[1] is not None:
            assert str(exc) == want[1]
        return False
    assert want is None, f"upstream raises {want}; the kit passes"
    return True


def _kit_state(sink: SharedSinkLoRA):
    tensors = {k: getattr(sink, k) for k in ("w1_delta", "a_cat", "down_cat")}
    return (sink.lora_buffers, sink.layout,
            {k: None if t is None else (t.data_ptr(), t.clone()) for k, t in tensors.items()})


def _assert_kit_state(sink: SharedSinkLoRA, state) -> None:
    buffers, layout, tensors = state
    assert sink.lora_buffers is buffers and sink.layout == layout
    for k, kept in tensors.items():
        t = getattr(sink, k)
        if kept is None:
            assert t is None, k
        else:
            assert t is not None and t.data_ptr() == kept[0] and t.device == kept[1].device, k
            if t.device.type != "meta":
                assert torch.equal(t, kept[1]), k


def _assert_same_operands(sink: SharedSinkLoRA, model) -> None:
    for name, want in model.operands().items():
        got = getattr(sink, name)
        assert (got is None) == (want is None), name
        if got is not None:
            assert got.shape == want.shape and got.dtype == want.dtype and got.device == want.device, name
            if got.device.type != "meta":
                assert torch.equal(got, want), name
    if isinstance(model, UpstreamV2) and model.set_lora:
        assert (sink.a_cat is sink.down_cat) == model.shared  # V2 shared outer: a_cat is down_cat


def _snapshot(model):
    """The model's attributes, and a copy of the tensors it writes in place."""
    attrs = dict(model.__dict__)
    return attrs, {k: v.clone() for k, v in attrs.items() if isinstance(v, torch.Tensor)}


def _restore(model, snapshot) -> None:
    """Roll the model back to ``snapshot`` (in place: the refresh's views stay valid)."""
    attrs, kept = snapshot
    model.__dict__.clear()
    model.__dict__.update(attrs)
    with torch.no_grad():
        for k, v in kept.items():
            attrs[k].copy_(v)


def _module(generation: str, n: int) -> SharedSinkLoRA:
    sink = SharedSinkLoRA(n, 4, 2, interleaved=generation == "v1", dtype=torch.bfloat16)
    sink.initialize_lora(LoRABackend("triton_v2" if generation == "v2" else "triton", 4), generation)
    return sink


sizes = st.integers(0, 3)


@st.composite
def pools(draw, n: int):
    """Four buffers, mostly consistent, often broken in one way upstream does not check
    (odd 2F, slot counts, F of down A, zero sizes) and sometimes in one it does."""
    S, R, H, F = draw(sizes), draw(sizes), draw(sizes), draw(sizes)
    two_f = 2 * F + draw(st.sampled_from([0, 0, 0, 1]))
    outer = draw(st.sampled_from([1, 1, n, 3]))
    slots = [S] * 4
    if draw(st.integers(0, 4)) == 0:
        slots[draw(st.integers(0, 3))] = draw(sizes)
    f_down = F if draw(st.integers(0, 4)) else draw(sizes)
    shapes = [[slots[0], outer, 2 * R, H], [slots[1], n, two_f, R], [slots[2], n, R, f_down], [slots[3], outer, H, R]]
    if draw(st.integers(0, 5)) == 0:  # one check upstream makes (an axis count, an expert count, a rank)
        which, axis = draw(st.integers(0, 3)), draw(st.integers(0, 4))
        broken = shapes[which]
        if axis == 4:
            broken.append(1)
        elif draw(st.booleans()):
            del broken[min(axis, len(broken) - 1)]
        else:
            broken[min(axis, 3)] += 1
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    buffers = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
    twist = draw(st.integers(0, 9))
    if twist == 0 and buffers[2].dim() == 4:  # issue 14: down A on the meta device
        buffers[2] = buffers[2].to("meta")
    elif twist == 1 and buffers[1].dim() == 4:  # a non-contiguous gate-up B (V2 views it)
        buffers[1] = buffers[1].transpose(2, 3).contiguous().transpose(2, 3)
    return buffers


slot_ids = st.one_of(st.none(), st.sets(st.integers(-2, 5), max_size=4))


@pytest.mark.parametrize("generation", ["v1", "v2"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 2))
def test_the_kit_ends_every_step_as_upstream(generation, data, n):
    sink = _module(generation, n)
    model = (UpstreamV1 if generation == "v1" else UpstreamV2)(n)
    for _ in range(data.draw(st.integers(1, 6), label="steps")):
        op = data.draw(st.sampled_from(["set", "set", "refresh", "update"]), label="op")
        if op == "set":
            buffers = data.draw(pools(n), label="buffers")
            before_model, before_kit = _snapshot(model), _kit_state(sink)
            ok = _same_outcome(lambda: model.set_lora_info(*buffers), lambda: sink.set_lora_info(*buffers))
            if not ok:  # the kit's improvement: a failed call leaves the module as it was
                _restore(model, before_model)
                _assert_kit_state(sink, before_kit)
        elif op == "refresh":
            ids = data.draw(slot_ids, label="ids")
            _same_outcome(lambda: model.refresh(ids), lambda: sink.on_lora_slots_updated(ids))
        else:  # the pool rewrites its buffers in place, then the engine refreshes every slot
            if sink.lora_buffers is None or any(b.device.type == "meta" for b in sink.lora_buffers):
                continue
            with torch.no_grad():
                for b in sink.lora_buffers:
                    b.add_(1.0)
            _same_outcome(lambda: model.refresh(None), lambda: sink.on_lora_slots_updated(None))
        _assert_same_operands(sink, model)


def test_an_empty_v2_pool_with_a_three_dimensional_down_b_is_taken_as_upstream_takes_it():
    """The property test's find (at 88bc030): upstream's dense engine takes an empty pool whose down B
    has three dimensions; the kit's operands read the rank off gate-up B, as its forward does."""
    sink, model = _module("v2", 1), UpstreamV2(1)
    buffers = (torch.empty(0, 1, 0, 0, dtype=torch.bfloat16), torch.empty(0, 1, 2, 0, dtype=torch.bfloat16),
               torch.empty(0, 1, 0, 1, dtype=torch.bfloat16, device="meta"), torch.empty(0, 1, 0, dtype=torch.bfloat16))
    assert _same_outcome(lambda: model.set_lora_info(*buffers), lambda: sink.set_lora_info(*buffers))
    _assert_same_operands(sink, model)


def test_the_model_sees_the_spec_examples():
    """The model itself, on SPEC §3's examples (so that a wrong model cannot pass quietly)."""
    model = UpstreamV1(3)
    with pytest.raises(RuntimeError, match=r"^shape '\[2, 3, 2, 2, 4\]' is invalid for input of size 120$"):
        model.set_lora_info(torch.zeros(2, 1, 4, 5), torch.zeros(2, 3, 5, 2), torch.zeros(2, 3, 2, 2),
                            torch.zeros(2, 1, 5, 2))
    v2 = UpstreamV2(3)
    v2.set_lora_info(torch.zeros(3, 1, 8, 5), torch.zeros(3, 3, 8, 4), torch.zeros(3, 3, 4, 4),
                     torch.zeros(3, 1, 5, 4))
    with pytest.raises(RuntimeError, match=r"^Shared-sink LoRA pool shape changed after initialization: "
                                           r"\(3, 4, 12\) -> \(3, 5, 12\)$"):
        v2.set_lora_info(torch.zeros(3, 1, 10, 5), torch.zeros(3, 3, 8, 5), torch.zeros(3, 3, 5, 4),
                         torch.zeros(3, 1, 5, 5))


# -- tensor-parallel slicing -----------------------------------------------------------------
class UpstreamSlicing:
    """The slicing methods both generations share, on a module of ``n`` experts whose
    per-rank intermediate size is ``per`` over ``tp`` ranks."""

    def __init__(self, n: int, tp: int, per: int) -> None:
        self.n, self.tp, self.per = n, tp, per

    def a(self, w, rank, module):
        if isinstance(w, torch.Tensor) and w.dim() == 2:
            if module == "gate_up_proj_moe":
                w = w.unsqueeze(0)
            else:
                r, flat = w.shape
                if flat % self.n != 0:
                    _raise(ValueError, f"Shared-sink down LoRA-A width must be divisible by {self.n}, got {flat}")
                w = w.view(r, self.n, flat // self.n).transpose(0, 1).contiguous()
        if self.tp <= 1 or module != "down_proj_moe":
            return w
        cut = lambda t: t[..., rank * self.per:(rank + 1) * self.per].contiguous()  # noqa: E731
        return {k: cut(t) for k, t in w.items()} if isinstance(w, dict) else cut(w)

    def b(self, w, rank, module):
        if isinstance(w, torch.Tensor) and w.dim() == 2:
            if module == "down_proj_moe":
                w = w.unsqueeze(0)
            else:
                flat, r = w.shape
                if flat % self.n != 0:
                    _raise(ValueError, f"Shared-sink gate/up LoRA-B height must be divisible by {self.n}, got {flat}")
                w = w.view(self.n, flat // self.n, r)
        if self.tp <= 1 or module != "gate_up_proj_moe":
            return w

        def cut(t):
            lo, half = rank * self.per, t.shape[0] // 2
            return torch.cat([t[lo:lo + self.per], t[half + lo:half + lo + self.per]], dim=0).contiguous()

        if isinstance(w, dict):
            return {k: cut(t) for k, t in w.items()}
        if w.dim() == 3:
            return torch.stack([cut(w[i]) for i in range(w.shape[0])])
        return cut(w)


def _same(got, want) -> None:
    assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _same(got[k], want[k])
        return
    assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 3), tp=st.integers(1, 4), per=st.integers(0, 3), r=sizes,
       rank=st.integers(-1, 4), factor=st.sampled_from(["a", "b"]),
       module=st.sampled_from(["gate_up_proj_moe", "down_proj_moe"]),
       form=st.sampled_from(["2d", "2d", "3d", "dict", "4d"]), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_slicing_is_upstreams(data, n, tp, per, r, rank, factor, module, form, dtype):
    F = per * tp  # the full per-expert F of a module that upstream can build
    # per expert: down A [r, F], gate/up B [2F (+1: odd), r], gate/up A [r, H], down B [H, r]
    rows = 2 * F + data.draw(st.sampled_from([0, 0, 1]), label="odd")
    one = {("a", "down_proj_moe"): (r, F), ("b", "gate_up_proj_moe"): (rows, r),
           ("a", "gate_up_proj_moe"): (r, 3), ("b", "down_proj_moe"): (3, r)}[factor, module]
    experts = max(n, 1) + data.draw(st.sampled_from([0, 0, 1]), label="extra expert")  # sometimes not divisible
    if form == "2d":  # PEFT's flat matrices: experts side by side (A) or stacked (B)
        flat = (one[0], one[1] * experts) if (factor, module) == ("a", "down_proj_moe") else \
            (one[0] * experts, one[1]) if (factor, module) == ("b", "gate_up_proj_moe") else one
        weights = torch.randn(flat).to(dtype)
    elif form == "3d":
        weights = torch.randn(experts, *one).to(dtype)
    elif form == "4d":  # no factor has four axes: upstream cuts gate/up B along axis 0 regardless
        weights = torch.randn(2, experts, *one).to(dtype)
    else:
        weights = {e: torch.randn(one).to(dtype) for e in data.draw(st.lists(st.integers(0, 5), unique=True,
                                                                                     max_size=3), label="ids")}
    kit = slice_lora_a if factor == "a" else slice_lora_b
    model = getattr(UpstreamSlicing(n, tp, per), factor)
    if not 0 <= rank < tp:  # the kit's improvement: refused, with the rank named
        with expect_error("ISL-K101", show=False):
            kit(weights, rank, module, tp, n, F)
        return
    want = _outcome(lambda: model(weights, rank, module))
    if want is not None:
        with pytest.raises(want[0]) as info:
            kit(weights, rank, module, tp, n, F)
        assert want[1] is None or str(info.value) == want[1]
        return
    got = kit(weights, rank, module, tp, n, F)
    _same(got, model(weights, rank, module))
    if form != "4d" and rows == 2 * F and experts == max(n, 1):  # the factor fits the module: F read off it
        _same(kit(weights, rank, module, tp, n), got)
    if tp == 1 or (factor, module) in (("a", "gate_up_proj_moe"), ("b", "down_proj_moe")):
        if not (isinstance(weights, torch.Tensor) and weights.dim() == 2):
            assert got is weights  # passed through: the very object
