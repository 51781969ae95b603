import hashlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as Fn
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.adapters import NAMINGS, load_adapter, save_adapter, synthetic_adapter
from inkling_lab.batch import SlotBatch
from inkling_lab.convert import convert, load_pool
from inkling_lab.errors import expect_error
from inkling_lab.lora import SharedSinkLoRA
from inkling_lab.parallel import shard_sink
from inkling_lab.sink import gate_up_rows
from inkling_lab.validate import diagnose_pool, validate_pool

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "adapters"
MANIFEST = json.loads((SAMPLES / "MANIFEST.json").read_text())


def peft_sink_output(sink, adapter, naming, x, gammas):
    """The sink with one adapter applied straight from its PEFT 2D factors, float64.

    Flat factors: gate/up B ``[n*F, r]`` (experts stacked), fused B ``[n*2F, r]`` (per
    expert gate then up), down A ``[r, n*F]`` (experts side by side); per-expert
    factors: one ``[F, r]``/``[r, F]`` per expert. No pool, no normalization.
    """
    d = torch.float64
    n, F = sink.n_shared_experts, sink.intermediate_size
    W = {k: v.to(d) for k, v in adapter.weights.items()}
    module = adapter.modules[0]
    gate, up, down = NAMINGS[naming]
    s = adapter.scaling
    x, gammas = x.to(d), gammas.to(d)

    def A(proj, e=None):
        return W[f"{module}{'' if e is None else f'.{e}'}.{proj}.lora_A.weight"]

    def B(proj, e=None):
        return W[f"{module}{'' if e is None else f'.{e}'}.{proj}.lora_B.weight"]

    per_expert = f"{module}.0.{down}.lora_A.weight" in W
    gate_delta, up_delta = [], []
    for e in range(n):
        if per_expert:
            g_b, u_b = (B(gate, e)[:F], B(gate, e)[F:]) if up is None else (B(gate, e), B(up, e))
            g_a, u_a = (A(gate, e), A(gate, e)) if up is None else (A(gate, e), A(up, e))
        else:
            rows = 2 * F if up is None else F
            g_b = B(gate)[e * rows:e * rows + F]
            u_b = B(gate)[e * rows + F:(e + 1) * rows] if up is None else B(up)[e * F:(e + 1) * F]
            g_a, u_a = (A(gate), A(gate)) if up is None else (A(gate), A(up))
        gate_delta.append(s * (x @ g_a.T) @ g_b.T)
        up_delta.append(s * (x @ u_a.T) @ u_b.T)
    gate_rows, up_rows = gate_up_rows(F, sink.interleaved)
    w13, w2 = sink.w13.detach().to(d), sink.w2.detach().to(d)
    out = torch.zeros(x.shape, dtype=d)
    acts = []
    for e in range(n):
        y = x @ w13[e].T
        act = Fn.silu(y[:, gate_rows] + gate_delta[e]) * (y[:, up_rows] + up_delta[e]) * gammas[:, e:e + 1]
        acts.append(act)
        out += act @ w2[e].T
    if per_expert:
        for e in range(n):
            out += s * (acts[e] @ A(down, e).T) @ B(down, e).T
    else:
        out += s * (torch.cat(acts, dim=1) @ A(down).T) @ B(down).T  # [T, n*F], expert-major
    return out


def _adapter(n, H, F, r, naming, per_expert, seed):
    return synthetic_adapter(n, H, F, r, naming=naming, per_expert=per_expert, lora_alpha=r + 1, seed=seed,
                             dtype=torch.float64)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3), H=st.integers(1, 6), F=st.integers(1, 4), interleaved=st.booleans(),
       specs=st.lists(st.tuples(st.integers(1, 4), st.sampled_from(sorted(NAMINGS)), st.booleans()),
                      min_size=1, max_size=3),
       extra_rank=st.integers(0, 2), seed=st.integers(0, 999))
def test_converted_pool_validates_and_computes_the_peft_delta(n, H, F, interleaved, specs, extra_rank, seed):
    adapters = [_adapter(n, H, F, r, naming, pe, seed + i) for i, (r, naming, pe) in enumerate(specs)]
    R = max(r for r, _, _ in specs) + extra_rank
    pool = convert(adapters, n, max_rank=R, dtype=torch.float64)
    bufs = pool.buffers()
    layout = validate_pool(*bufs, n_shared_experts=n)
    assert layout.rank == R and layout.slots == len(adapters)
    assert layout.outer == (n if any(pe for _, _, pe in specs) else 1)
    assert diagnose_pool(*bufs, n_shared_experts=n, hidden_size=H, intermediate_size=F,
                         lora_ranks=pool.lora_ranks).ok

    sink = SharedSinkLoRA(n, H, F, interleaved=interleaved, dtype=torch.float64, seed=seed)
    sink.set_lora_info(*bufs)
    g = torch.Generator().manual_seed(seed)
    T = 2 * len(adapters) + 1
    x, gammas = torch.randn(T, H, generator=g, dtype=torch.float64), torch.rand(T, n, generator=g, dtype=torch.float64)
    slots = [t % (len(adapters) + 1) - 1 for t in range(T)]  # every slot, and base-only tokens
    batch = SlotBatch.from_token_slots(slots, num_slots=len(adapters), lora_ranks=pool.lora_ranks)
    pool_delta = sink(x, gammas, batch=batch, backend="reference") - sink(x, gammas, backend="reference")
    for t, s in enumerate(slots):
        if s < 0:
            assert (pool_delta[t] == 0).all()
            continue
        base = sink(x[t:t + 1], gammas[t:t + 1], backend="reference")
        want = peft_sink_output(sink, adapters[s], specs[s][1], x[t:t + 1], gammas[t:t + 1]) - base
        torch.testing.assert_close(pool_delta[t:t + 1], want, rtol=1e-9, atol=1e-10)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 3), F=st.sampled_from([2, 4, 6]), tp=st.sampled_from([1, 2]), naming=st.sampled_from(sorted(NAMINGS)),
       per_expert=st.booleans(), seed=st.integers(0, 99))
def test_each_tensor_parallel_rank_gets_the_shard_of_the_full_pool(n, F, tp, naming, per_expert, seed):
    adapters = [_adapter(n, 4, F, 2, naming, per_expert, seed), _adapter(n, 4, F, 3, "w", False, seed + 1)]
    full = convert(adapters, n, dtype=torch.float64)
    sink = SharedSinkLoRA(n, 4, F, dtype=torch.float64)
    sink.set_lora_info(*full.buffers())
    for k in range(tp):
        part = convert(adapters, n, tp_rank=k, tp_size=tp, dtype=torch.float64)
        assert part.geometry.intermediate == F // tp and (part.tp_rank, part.tp_size) == (k, tp)
        for mine, theirs in zip(part.buffers(), shard_sink(sink, k, tp).sink.lora_buffers):
            assert torch.equal(mine, theirs)


def test_save_and_load_round_trip_with_metadata(tmp_path):
    paths = [SAMPLES / "gate_up", SAMPLES / "per_expert", SAMPLES / "rank8"]
    before = {p: hashlib.sha256((p / "adapter_model.safetensors").read_bytes()).hexdigest() for p in paths}
    pool = convert([load_adapter(p) for p in paths], 2)
    out = pool.save(tmp_path / "out" / "pool.safetensors")
    assert sorted(p.name for p in out.parent.iterdir()) == ["pool.safetensors"]  # no temporary left behind
    back = load_pool(out)
    assert back.geometry == pool.geometry and back.summary() == pool.summary()
    assert back.layers.keys() == pool.layers.keys() == {f"base_model.model.model.layers.{i}.mlp.shared_experts"
                                                        for i in (0, 1)}
    for m in pool.layers:
        assert all(torch.equal(a, b) for a, b in zip(pool.buffers(m), back.buffers(m)))
    summary = back.summary()
    assert summary["geometry"] == {"n": 2, "hidden": 8, "intermediate": 6, "rank": 8, "slots": 3, "outer": 2}
    assert [s["adapter"] for s in summary["slots"]] == ["gate_up", "per_expert", "rank8"]
    assert [s["sha256"] for s in summary["slots"]] == [before[p] for p in paths]
    assert [s["rank"] for s in summary["slots"]] == back.lora_ranks == [4, 4, 8]
    assert "/" not in json.dumps(summary["slots"])  # no machine paths in the file
    assert {p: hashlib.sha256((p / "adapter_model.safetensors").read_bytes()).hexdigest() for p in paths} == before


def test_save_refuses_to_overwrite_unless_forced_and_never_writes_over_an_input(tmp_path):
    folder = save_adapter(synthetic_adapter(2, 8, 6, 2), tmp_path / "ad")
    pool = convert([load_adapter(folder)], 2)
    out = pool.save(tmp_path / "pool.safetensors")
    with expect_error("ISL-K213", show=False):
        pool.save(out)
    pool.save(out, force=True)
    original = (folder / "adapter_model.safetensors").read_bytes()
    with expect_error("ISL-K213", show=False) as caught:
        pool.save(folder / "adapter_model.safetensors", force=True)
    assert "one of the input adapters' files" in str(caught.exception)
    assert (folder / "adapter_model.safetensors").read_bytes() == original
    with pytest.raises(ValueError, match="not an inkling-lab pool file"):
        load_pool(folder / "adapter_model.safetensors")


def test_layout_rank_and_upstream_errors():
    flat, per = load_adapter(SAMPLES / "gate_up"), load_adapter(SAMPLES / "per_expert")
    assert convert([flat], 2).geometry.outer == 1 and convert([flat, per], 2).geometry.outer == 2
    with expect_error("ISL-E015", show=False) as caught:
        convert([flat, per], 2, outer=1)
    assert "while loading adapter 'per_expert' into slot 1" in caught.exception.__notes__[0]
    with expect_error("ISL-E016", show=False):
        convert([flat], 2, max_rank=2)
    with expect_error("ISL-E012", show=False):
        convert([load_adapter(SAMPLES / "three_experts")], 2)
    with expect_error("ISL-K102", show=False):
        convert([flat], 2, tp_size=4)
    with expect_error("ISL-K101", show=False):
        convert([flat], 2, tp_rank=2, tp_size=2)


def test_progress_bar_when_asked(capsys):
    convert([load_adapter(SAMPLES / "gate_up")], 2, progress=True)
    assert "converting" in capsys.readouterr().err
    convert([load_adapter(SAMPLES / "gate_up")], 2)  # small input: no bar
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("stored", [torch.float64, torch.float32, torch.bfloat16])
def test_the_pool_keeps_the_adapters_dtype_unless_told(stored):
    ad = synthetic_adapter(2, 8, 6, 4, lora_alpha=7, dtype=stored)
    assert convert([ad], 2).buffers()[0].dtype == stored  # lossless by default
    mixed = convert([ad, synthetic_adapter(2, 8, 6, 4, dtype=torch.float64)], 2)
    assert mixed.buffers()[0].dtype == torch.float64  # the dtype that holds both exactly


@settings(max_examples=20, deadline=None)
@given(stored=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       pool=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]), alpha=st.floats(0.5, 50), seed=st.integers(0, 99))
def test_with_a_dtype_b_is_scaled_in_the_stored_dtype_then_cast_as_sglang_does(stored, pool, alpha, seed):
    """sglang's mem_pool.py: ``w = w * lora_adapter.scaling`` on the stored tensor, then
    ``copy_weight_into_buffer`` casts it to the pool's dtype: the pool equals that, bit for bit."""
    ad = synthetic_adapter(2, 8, 6, 3, lora_alpha=alpha, dtype=stored, seed=seed)
    got = convert([ad], 2, dtype=pool)
    f = ad.factors(2)[ad.modules[0]]
    s = ad.scaling
    ga, gb, da, db = got.buffers()
    assert torch.equal(gb[0], (f.gate_up_b * s).to(pool)) and torch.equal(db[0], (f.down_b * s).to(pool))
    assert torch.equal(ga[0, :, :3], f.gate_up_a[:, :3].to(pool)) and torch.equal(da[0], f.down_a.to(pool))
