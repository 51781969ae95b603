import pytest
import torch

import inkling_lab as il
from inkling_lab.geometry import PRESETS
from inkling_lab.scenario import Scenario


def test_a_scenario_is_seeded_and_its_pool_is_set(scenario):
    a, b = scenario("toy", tokens=7, seed=5), scenario("toy", tokens=7, seed=5)
    assert torch.equal(a.x, b.x) and torch.equal(a.gammas, b.gammas) and torch.equal(a.sink.w13, b.sink.w13)
    assert all(torch.equal(p, q) for p, q in zip(a.pool.buffers(), b.pool.buffers()))
    assert all(s is p for s, p in zip(a.sink.lora_buffers, a.pool.buffers())) and a.pool.lora_ranks == [2, 2, 2]
    assert (a.x.shape, a.gammas.shape, a.batch.num_tokens, a.x.dtype) == ((7, 8), (7, 2), 7, torch.float64)
    assert not torch.equal(scenario("toy", tokens=7, seed=6).x, a.x)


def test_ranks_and_token_slots_are_what_was_asked(scenario):
    sc = scenario(PRESETS["toy"].with_(max_rank=4, outer=2), tokens=4, adapters=[4, 0, 1], token_slots=[2, 0, -1, 1])
    assert sc.pool.lora_ranks == [4, 0, 1] and sc.batch.token_slots().tolist() == [2, 0, -1, 1]
    assert (sc.pool.gate_up_a.shape[1], sc.batch.lora_ranks.tolist()) == (2, [4, 0, 1])
    assert not any(b[1].any() for b in sc.pool.buffers())                 # rank 0: an empty slot
    torch.testing.assert_close(sc.forward("torch"), sc.forward("reference").to(sc.x.dtype))


def test_given_factors_are_loaded_as_they_are_and_names_name_the_slots(scenario):
    """A notebook's own adapter goes through the factory too: loaded as given (a shared
    outer one broadcast into a per-expert pool), beside a random one, named; the sink,
    ``x`` and ``gammas`` are those of any scenario of the same seed."""
    g = PRESETS["toy"].with_(max_rank=4, outer=2)
    mine = il.LoRAFactors.random(g.n, g.hidden, g.intermediate, rank=3, lora_alpha=6.0, seed=9, name="mine")
    sc = scenario(g, tokens=5, seed=2, adapters=[0, mine, 2], names=[None, None, "chat"])
    alone = il.LoRAPool.from_geometry(g, torch.float64)
    alone.load(1, mine)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(sc.pool.buffers(), alone.buffers()))
    assert (sc.pool.names, sc.pool.lora_ranks, sc.pool.adapter_scalings) == ([None, "mine", "chat"], [0, 3, 2],
                                                                               [0.0, 2.0, 1.0])
    plain = scenario(g, tokens=5, seed=2)
    assert torch.equal(sc.x, plain.x) and torch.equal(sc.gammas, plain.gammas) and torch.equal(sc.sink.w13, plain.sink.w13)
    torch.testing.assert_close(sc.forward("torch"), sc.forward("reference").to(sc.x.dtype))


@pytest.mark.parametrize("kw, message", [
    (dict(adapters=[2, 3, 1]), r"adapters must give each of the 3 slots a rank in 0..2 .*got \[2, 3, 1\]"),
    (dict(adapters=[2]), r"adapters must give each of the 3 slots"),
    (dict(adapters=[2, "1", True]), r"adapters must give each of the 3 slots a rank .*got \[2, '1', True\]"),
    (dict(names=["a"]), r"names must name each of the 3 slots' adapter \(None: the default\), got 1 names"),
    (dict(tokens=3, token_slots=[0, 1]), r"token_slots names 2 tokens but tokens=3"),
])
def test_bad_requests_are_refused_by_name(kw, message):
    with pytest.raises(ValueError, match=message):
        Scenario.random(PRESETS["toy"], **kw)


def test_the_scenario_is_public():
    assert il.Scenario is Scenario
