"""Tensor parallelism (SPEC §7): the shards, their sum, and the real gloo runs."""
from __future__ import annotations

import torch
import torch.distributed as dist
import pytest
from hypothesis import given, settings, strategies as st

from inkling_lab.errors import expect_error
from inkling_lab.geometry import Geometry
from inkling_lab.lora import derive_operands
from inkling_lab.parallel import (AllReduceCost, TPCase, check_world_size, demo_cases, main, measure_allreduce,
                                  resolve_dist_backend, run_tp, shard_owners, shard_sink, sum_of_shards,
                                  tp_forward)
from inkling_lab.shard import rank_features
from inkling_lab.records import relative_error
from inkling_lab.scenario import Scenario
from inkling_lab.sink import gate_up_rows

SMALL = Geometry(n=2, hidden=8, intermediate=12, rank=3, slots=3)


def _case(outer: int = 1, interleaved: bool = True, **kw) -> TPCase:
    return TPCase.random(SMALL.with_(outer=outer, **kw), interleaved, torch.float64, tokens=10, seed=3)


def test_a_random_case_is_the_scenario_of_its_ranks_and_keeps_its_seeded_values():
    """TPCase.random is Scenario.random with ranks max(1, R-s) and the last of several
    slots empty; the seeded numbers are the ones it gave before it was built on it."""
    for g, ranks, total in ((SMALL, [3, 2, 0], -5.030527197614611),
                            (SMALL.with_(outer=2, slots=1), [3], 14.3825231718529)):
        case = TPCase.random(g, True, torch.float64, tokens=10, seed=3)
        same = Scenario.random(g, tokens=10, seed=3, dtype=torch.float64, adapters=ranks)
        assert case.batch.lora_ranks.tolist() == ranks
        assert torch.equal(case.x, same.x) and torch.equal(case.gammas, same.gammas)
        assert torch.equal(case.sink.w13, same.sink.w13) and torch.equal(case.sink.w2, same.sink.w2)
        assert all(torch.equal(a, b) for a, b in zip(case.sink.lora_buffers, same.pool.buffers()))
        assert torch.equal(case.batch.token_slots(), same.batch.token_slots())
        assert case.reference().sum().item() == pytest.approx(total, abs=1e-12)


# -- the shards ----------------------------------------------------------------------------
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("outer", [1, 2])
def test_each_rank_holds_its_features_of_every_tensor(interleaved, outer):
    case = _case(outer, interleaved)
    sink, F, tp = case.sink, SMALL.intermediate, 3
    ga, gb, da, db = sink.lora_buffers
    gate, up = gate_up_rows(F, interleaved)
    local_gate, local_up = gate_up_rows(F // tp, interleaved)
    for r in range(tp):
        shard = shard_sink(sink, r, tp)
        f = shard.features
        s = shard.sink
        assert torch.equal(f, torch.arange(r * F // tp, (r + 1) * F // tp))
        # base: the gate and up rows of the rank's features, in the sink's own layout
        assert torch.equal(s.w13[:, local_gate], sink.w13[:, gate[f]])
        assert torch.equal(s.w13[:, local_up], sink.w13[:, up[f]])
        assert torch.equal(s.w2, sink.w2[:, :, f])
        # pool: gate/up B cut in its gate half and its up half, down A along F, outer replicated
        sga, sgb, sda, sdb = s.lora_buffers
        assert torch.equal(sgb, torch.cat([gb[:, :, f], gb[:, :, F + f]], dim=2))
        assert torch.equal(sda, da[..., f])
        assert torch.equal(sga, ga) and torch.equal(sdb, db)
        assert s.intermediate_size == F // tp and s.interleaved == interleaved
        if outer == 1:  # the shared-outer operands are rebuilt from the rank's own shards
            w1, a_cat = derive_operands(sgb, sda, interleaved)
            assert s.w1_delta.shape == (SMALL.slots, SMALL.n * 2 * F // tp, 2 * SMALL.rank)
            assert torch.equal(s.w1_delta, w1) and torch.equal(s.a_cat, a_cat)
        else:
            assert s.w1_delta is None


def test_sharding_copies_and_leaves_the_module_alone():
    case = _case()
    before = [t.clone() for t in (case.sink.w13, case.sink.w2, *case.sink.lora_buffers)]
    shard = shard_sink(case.sink, 1, 2)
    with torch.no_grad():
        for t in (shard.sink.w13, shard.sink.w2, *shard.sink.lora_buffers):
            t.fill_(7.0)
    after = (case.sink.w13, case.sink.w2, *case.sink.lora_buffers)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_tp_1_is_a_full_copy():
    case = _case(outer=2)
    full = shard_sink(case.sink, 0, 1).sink
    assert torch.equal(full.w13, case.sink.w13) and torch.equal(full.w2, case.sink.w2)
    assert all(torch.equal(a, b) for a, b in zip(full.lora_buffers, case.sink.lora_buffers))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3), per_rank=st.integers(1, 3), tp=st.sampled_from([1, 2, 3, 4]),
       rank=st.integers(1, 4), slots=st.integers(1, 3), per_expert=st.booleans(),
       interleaved=st.booleans(), seed=st.integers(0, 1000))
def test_sum_of_shards_is_the_unsharded_module(n, per_rank, tp, rank, slots, per_expert, interleaved, seed):
    g = Geometry(n=n, hidden=6, intermediate=per_rank * tp, rank=rank, slots=slots, outer=n if per_expert else 1)
    case = TPCase.random(g, interleaved, torch.float64, tokens=7, seed=seed)
    out = sum_of_shards(case.sink, tp, case.x, case.gammas, case.batch)
    assert relative_error(out, case.reference()) < 1e-12


def test_features_partition_F_and_owners_show_the_two_cuts():
    n, F, tp = 2, 8, 4
    owners = shard_owners(n, F, tp, interleaved=True)
    for r in range(tp):
        f = rank_features(F, r, tp)
        assert torch.equal((owners["w2"][0] == r).nonzero().flatten(), f)
        assert torch.equal((owners["down_a"][1] == r).nonzero().flatten(), f)
        # interleaved w13: one block of row pairs; gate/up B: the same slice of each half
        assert torch.equal((owners["w13"][0] == r).nonzero().flatten(), torch.arange(2 * f[0], 2 * f[-1] + 2))
        assert torch.equal((owners["gate_up_b"][0] == r).nonzero().flatten(), torch.cat([f, F + f]))
    contiguous = shard_owners(n, F, tp, interleaved=False)
    assert torch.equal(contiguous["w13"], contiguous["gate_up_b"])
    assert (owners["w13"] >= 0).all()


# -- refusals --------------------------------------------------------------------------------
def test_a_tp_that_does_not_split_F_is_refused_with_the_catalog_error():
    case = _case()  # F = 12
    with expect_error("ISL-K102", show=False):
        shard_sink(case.sink, 0, 5)
    with expect_error("ISL-K102", show=False):
        run_tp([case], 5, "gloo")  # refused before any process starts


def test_a_rank_outside_the_group_is_refused():
    with expect_error("ISL-K101", show=False):
        shard_sink(_case().sink, 2, 2)


def test_backend_choice():
    assert resolve_dist_backend("gloo", 4) == "gloo"
    if not torch.cuda.is_available():
        assert resolve_dist_backend("auto", 2) == "gloo"
        with pytest.raises(ValueError, match=r"NCCL needs one GPU per rank: tp=2, but this machine shows 0"):
            resolve_dist_backend("nccl", 2)
    with pytest.raises(ValueError, match="dist_backend must be"):
        resolve_dist_backend("mpi", 2)


def test_torchrun_world_size_must_be_tp(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    check_world_size(4)
    with pytest.raises(ValueError, match=r"torchrun started 4 process\(es\) .* but tp=2 was asked: "
                                         r"run torchrun --nproc-per-node 2"):
        check_world_size(2)


def test_the_command_line_explains_a_bad_tp(capsys):
    assert main(["--tp", "4"]) == 2  # toy F = 6
    assert "intermediate size 6 is not divisible by tp_size=4" in capsys.readouterr().err


def test_a_shard_refuses_a_group_of_another_size(tmp_path):
    case = _case()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"this shard is rank 0 of tp=2, but the process group has world "
                                             r"size 1 and this process is rank 0"):
            tp_forward(shard_sink(case.sink, 0, 2), case.x, case.gammas, case.batch)
        out = tp_forward(shard_sink(case.sink, 0, 1), case.x, case.gammas, case.batch)
        assert relative_error(out, case.reference()) < 1e-12
    finally:
        dist.destroy_process_group()


def test_allreduce_cost_per_token():
    cost = AllReduceCost(hidden=4096, dtype=torch.bfloat16, tp=2)
    assert cost.payload == 8192 and cost.sent_per_rank == 8192 and cost.lora_extra == 0
    assert AllReduceCost(1536, torch.float32, 4).sent_per_rank == 1.5 * 1536 * 4
    assert AllReduceCost(1536, torch.float32, 1).sent_per_rank == 0


# -- the real thing: one gloo process group per tp, every case in it ----------------------------
@pytest.mark.parametrize("tp", [2, 4])
def test_gloo_ranks_sum_to_the_unsharded_module(tp):
    cases = demo_cases(SMALL, torch.float64, tokens=10, seed=tp) + [
        TPCase.random(SMALL.with_(slots=1, outer=2), True, torch.float64, tokens=5, seed=9)]
    results = run_tp(cases, tp, "gloo")
    assert [r.case for r in results] == [c.name for c in cases]
    for result, case in zip(results, cases):
        check = result.check(case.reference())
        assert check["passed"] and check["ranks_agree"], check
        assert check["rel_err_tp"] < 1e-12 and check["rel_err_tp_vs_unsharded"] < 1e-12
        assert result.out.dtype == torch.float64 and result.out.shape == case.x.shape
        assert result.shapes["w2"] == (SMALL.n, SMALL.hidden, SMALL.intermediate // tp)
        assert result.allreduce_bytes == case.x.numel() * 8
        assert check["allreduce_bytes_per_token"] == SMALL.hidden * 8


def test_a_failing_rank_is_reported_not_hung():
    with pytest.raises(Exception, match="unknown backend 'nope'"):
        run_tp([_case()], 2, "gloo", forward_backend="nope", timeout_s=600)


def test_the_earliest_rank_failure_is_raised_not_its_echo():
    """A rank's failure breaks its peers' collectives; whichever report arrives first, the failure that
    happened first is the one raised (CI once saw rank 0's 'connection closed by peer' raised in place of
    rank 1's 'unknown backend', which had caused it)."""
    import queue
    from types import SimpleNamespace

    from inkling_lab import parallel

    later_echo = (0, 20.0, "RuntimeError: Gloo connectFullMesh failed ... Connection closed by peer")
    cause = ("error", 1, 10.0, "ValueError: unknown backend 'nope'")
    results = queue.Queue()
    results.put(cause)
    idle = SimpleNamespace(processes=[SimpleNamespace(is_alive=lambda: False)] * 2)
    with pytest.raises(RuntimeError, match=r"rank 1 failed:\nValueError: unknown backend 'nope'\n\(then rank\(s\) \[0\]"):
        parallel._raise_first_failure(later_echo, results, idle, pending=2)
    results.put(("ok", 1, []))  # the peer finished: the one failure is raised alone
    with pytest.raises(RuntimeError, match=r"rank 0 failed:\nRuntimeError: Gloo") as raised:
        parallel._raise_first_failure(later_echo, results, idle, pending=2)
    assert "then rank" not in str(raised.value)


def test_measure_allreduce_reports_bytes_per_token():
    records = measure_allreduce(2, [(3, 16)], torch.float32, "gloo", iters=2)
    assert [(r["tokens"], r["hidden"], r["bytes"], r["bytes_per_token"]) for r in records] == [(3, 16, 192, 64)]
    assert records[0]["median_s"] > 0
