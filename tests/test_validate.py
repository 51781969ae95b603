import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.catalog import CATALOG
from inkling_lab.errors import find_entry
from inkling_lab.pool import LoRAFactors, LoRAPool
from inkling_lab.validate import MSG_V2_DISAGREE, diagnose_pool, validate_pool

N = 3
GOOD = [(2, 1, 8, 16), (2, 3, 20, 4), (2, 3, 4, 10), (2, 1, 16, 4)]


def _with(i, shape):
    shapes = list(GOOD)
    shapes[i] = shape
    return shapes


CASES = [  # (shapes, upstream message), one per check, in upstream's order
    (_with(0, (1, 8, 16)), "Inkling shared-sink LoRA requires four 4D MoE buffers"),
    (_with(3, (2, 1, 16, 4, 1)), "Inkling shared-sink LoRA requires four 4D MoE buffers"),
    (_with(0, (2, 2, 8, 16)), "Inkling shared-sink LoRA outer factors must have expert dimension 1 or 3"),
    (_with(3, (2, 4, 16, 4)), "Inkling shared-sink LoRA outer factors must have expert dimension 1 or 3"),
    (_with(0, (2, 3, 8, 16)), "Inkling shared-sink gate-up A and down B must use the same expert layout"),
    (_with(1, (2, 1, 60, 4)), "Inkling shared-sink LoRA expert count does not match"),
    (_with(2, (2, 2, 4, 10)), "Inkling shared-sink LoRA expert count does not match"),
    (_with(0, (2, 1, 4, 16)), "Inkling shared-sink LoRA rank dimensions do not match"),
    (_with(2, (2, 3, 10, 4)), "Inkling shared-sink LoRA rank dimensions do not match"),
    (_with(3, (2, 1, 16, 8)), "Inkling shared-sink LoRA rank dimensions do not match"),
]


@pytest.mark.parametrize("shapes,message", CASES)
def test_upstream_messages_and_first_finding(shapes, message):
    with pytest.raises(ValueError) as info:
        validate_pool(*shapes, n_shared_experts=N)
    assert str(info.value) == message
    d = diagnose_pool(*shapes, n_shared_experts=N)
    assert d.upstream_error == message
    assert d.findings[0].upstream and d.findings[0].code == find_entry(message).code
    assert d.findings[0].fix


def test_first_failure_wins():
    # not 4D *and* wrong experts: the 4D check comes first
    shapes = [(1, 8, 16), (2, 5, 20, 4), GOOD[2], GOOD[3]]
    with pytest.raises(ValueError, match="four 4D"):
        validate_pool(*shapes, n_shared_experts=N)


def test_v2_folds_checks_two_to_five():
    for shapes, message in CASES:
        if "4D" in message:
            continue
        with pytest.raises(ValueError) as info:
            validate_pool(*shapes, n_shared_experts=N, generation="v2")
        assert str(info.value) == MSG_V2_DISAGREE.format(n=N)


@pytest.mark.parametrize("i,shape,exc,message", [
    (0, (1, 8, 16), ValueError, "not enough values to unpack (expected 4, got 3)"),
    (0, (2, 1, 8, 16, 1), ValueError, "too many values to unpack (expected 4)"),
    (1, (2, 3, 20), ValueError, "not enough values to unpack (expected 4, got 3)"),
    (1, (2, 3, 20, 4, 1), ValueError, "too many values to unpack (expected 4)"),
    (3, (2, 1), IndexError, "tuple index out of range"),          # down B's axis 2 is read before the check
    (2, (2,), IndexError, "tuple index out of range"),            # down A's axis 1, reached in the condition
    (2, (2, 3), IndexError, "tuple index out of range"),          # down A's axis 2, reached in the condition
    (3, (2, 1, 16, 4, 1), ValueError, MSG_V2_DISAGREE.format(n=N)),  # 5D down B: last axis 1 is not R
])
def test_v2_has_no_4d_check_python_raises_where_upstream_unpacks(i, shape, exc, message):
    with pytest.raises(exc) as info:
        validate_pool(*_with(i, shape), n_shared_experts=N, generation="v2")
    assert type(info.value) is exc and str(info.value) == message


def test_v2_condition_stops_at_the_first_true_comparison():
    # down A [2] would raise IndexError at its axis 1, but the outer dim of gate-up A is checked first
    shapes = [(2, 2, 8, 16), GOOD[1], (2,), GOOD[3]]
    with pytest.raises(ValueError, match="do not agree"):
        validate_pool(*shapes, n_shared_experts=N, generation="v2")


def test_v2_takes_other_4d_or_wider_buffers_it_does_not_index():
    # down A with five axes passes V2's condition (it reads axes 1 and 2 only); V1 refuses it
    shapes = [GOOD[0], GOOD[1], (2, 3, 4, 10, 1), GOOD[3]]
    assert validate_pool(*shapes, n_shared_experts=N, generation="v2").slots == 2
    with pytest.raises(ValueError, match="four 4D"):
        validate_pool(*shapes, n_shared_experts=N)


def test_validate_pool_names_a_buffer_that_is_no_tensor():
    with pytest.raises(TypeError, match=r"^gate-up A \[S, O, 2R, H\] must be a tensor or a shape tuple, got NoneType$"):
        validate_pool(None, *GOOD[1:], n_shared_experts=N)


def test_valid_pool_layout():
    layout = validate_pool(*GOOD, n_shared_experts=N)
    assert (layout.slots, layout.outer, layout.rank, layout.hidden, layout.intermediate, layout.shared_outer) == \
        (2, 1, 4, 16, 10, True)
    assert diagnose_pool(*GOOD, n_shared_experts=N).ok


shape_st = st.lists(st.integers(0, 7), min_size=0, max_size=6).map(tuple)


@settings(max_examples=300, deadline=None)
@given(ga=shape_st, gb=shape_st, da=shape_st, db=shape_st, n=st.integers(1, 5))
def test_validate_raises_iff_diagnose_reports_an_upstream_finding(ga, gb, da, db, n):
    d = diagnose_pool(ga, gb, da, db, n_shared_experts=n, hidden_size=4, intermediate_size=3, max_loras=2)
    try:
        validate_pool(ga, gb, da, db, n_shared_experts=n)
    except ValueError as exc:
        assert d.upstream_findings, d
        assert d.upstream_findings[0].code == find_entry(exc).code
        assert d.upstream_error == str(exc)
    else:
        assert not d.upstream_findings and d.layout is not None
    assert all(f.code in CATALOG and f.message and f.fix for f in d.findings)
    str(d)  # the report renders for any input


@settings(max_examples=100, deadline=None)
@given(shapes=st.lists(shape_st.filter(lambda s: len(s) <= 4), min_size=4, max_size=4),
       dtypes=st.lists(st.sampled_from([torch.float32, torch.bfloat16, torch.int64]), min_size=4, max_size=4))
def test_diagnose_never_raises_on_real_tensors(shapes, dtypes):
    tensors = [torch.zeros(s, dtype=dt) for s, dt in zip(shapes, dtypes)]
    diagnose_pool(*tensors, n_shared_experts=2, lora_ranks=[1, 2])


def _codes(*buffers, **kw):
    return diagnose_pool(*buffers, n_shared_experts=2, **kw).codes


def _real_pool(**kw):
    pool = LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4, **kw)
    pool.load(0, LoRAFactors.random(2, 8, 6, rank=2, seed=0))
    return pool


def test_what_upstream_does_not_check():
    ga, gb, da, db = _real_pool().buffers()
    assert _codes(ga, gb, da, db, hidden_size=8, intermediate_size=6, max_loras=3, lora_ranks=[2, 0, 0]) == []
    assert _codes(ga, gb, da, db, hidden_size=9) == ["ISL-D101", "ISL-D101"]
    assert _codes(ga, gb, da, db, intermediate_size=5) == ["ISL-D102", "ISL-D102"]
    assert _codes(ga, gb, da[..., :5], db) == ["ISL-D102"]
    assert "ISL-D103" in _codes(ga, gb[:, :, :11], da, db)
    assert _codes(ga, gb, da[:2], db) == ["ISL-D104"]
    assert _codes(ga.double(), gb, da, db) == ["ISL-D105"]
    assert _codes(ga, gb, da, db, max_loras=2) == ["ISL-D108"]
    bad = db.clone()
    bad[0, 0, 0, 0] = float("nan")
    assert _codes(ga, gb, da, bad) == ["ISL-D107"]
    padded = da.clone()
    padded[0, :, 3] = 1.0
    assert _codes(ga, gb, padded, db, lora_ranks=[2, 0, 0]) == ["ISL-D109"]
    assert _codes(ga, gb, padded, db) == ["ISL-D109"]  # without ranks: the factors disagree


def test_fixes_name_the_target_shape():
    ga, gb, da, db = LoRAPool(n=2, hidden=8, intermediate=6, slots=1, max_rank=4).buffers()
    d = diagnose_pool(ga[0, 0], gb, da, db, n_shared_experts=2)
    assert ".unsqueeze(0)" in d.findings[0].fix and d.findings[0].fix.endswith("-> [1, 1, 8, 8]")
    d = diagnose_pool(ga, gb, da.transpose(2, 3), db, n_shared_experts=2)
    assert "transposed" in d.findings[0].fix and "[1, 2, 4, 6]" in d.findings[0].fix
    d = diagnose_pool(ga.expand(-1, 2, -1, -1), gb, da, db, n_shared_experts=2)
    assert d.codes == ["ISL-E003"] and "expand(-1, 2, -1, -1)" in d.findings[0].fix


# -- fixes that compose (issue 16) -----------------------------------------------------------------

def test_the_lab_cases_of_issue_16_compose():
    good = [(3, 1, 8, 16), (3, 2, 12, 4), (3, 2, 4, 6), (3, 1, 16, 4)]
    cases = {"one slot's gate-up A": [(1, 8, 16)] + good[1:],
             "a bad O = 3": [(3, 3, 8, 16)] + good[1:],
             "transposed down B": good[:3] + [(3, 1, 4, 16)]}
    for what, shapes in cases.items():
        d = diagnose_pool(*shapes, n_shared_experts=2)
        assert len(d.findings) == 1, (what, d.codes)  # transposed down B: E005 only, not D101 too
        fixed = d.apply_fix(*shapes)
        assert validate_pool(*fixed, n_shared_experts=2).slots == 3, what
        assert d.findings[0].fix.endswith(str(list(d.targets[d.findings[0].buffer])))
    assert "unsqueeze(0) -> [1, 1, 8, 16]" not in diagnose_pool(*cases["one slot's gate-up A"], n_shared_experts=2) \
        .findings[0].fix


def test_apply_fix_keeps_values_where_the_fix_is_exact():
    pool = _real_pool()
    ga, gb, da, db = pool.buffers()
    d = diagnose_pool(ga[0], gb, da.transpose(2, 3), db, n_shared_experts=2)
    fga, fgb, fda, fdb = d.apply_fix(ga[0], gb, da.transpose(2, 3), db)
    assert torch.equal(fga[0], ga[0]) and not fga[1:].any() and torch.equal(fda, da)


@settings(max_examples=200, deadline=None)
@given(S=st.integers(1, 3), O_shared=st.booleans(), R=st.integers(1, 3), H=st.integers(1, 5), F=st.integers(1, 4),
       n=st.integers(2, 3), which=st.sampled_from(["gate_up_a", "gate_up_b", "down_a", "down_b"]),
       damage=st.sampled_from(["drop_slot", "transpose", "flat", "fewer_slots", "stack_experts", "bad_outer",
                               "expand_one_outer", "rank"]))
def test_applying_the_suggested_fixes_gives_buffers_that_validate(S, O_shared, R, H, F, n, which, damage):
    O = 1 if O_shared else n
    shapes = {"gate_up_a": [S, O, 2 * R, H], "gate_up_b": [S, n, 2 * F, R], "down_a": [S, n, R, F],
              "down_b": [S, O, H, R]}
    s = shapes[which]
    if damage == "drop_slot":
        s.pop(0)
    elif damage == "transpose":
        s[2], s[3] = s[3], s[2]
    elif damage == "flat" and which in ("gate_up_a", "down_b") and O == 1:
        s[:] = s[2:]
    elif damage == "fewer_slots" and S > 1:
        s[0] -= 1
    elif damage == "stack_experts" and which == "gate_up_b":
        s[1:3] = [1, n * s[2]]
    elif damage == "bad_outer" and which in ("gate_up_a", "down_b"):
        s[1] = n + 1
    elif damage == "expand_one_outer" and which in ("gate_up_a", "down_b") and O == 1:
        s[1] = n
    elif damage == "rank" and which != "gate_up_b":
        s[2 if which in ("gate_up_a", "down_a") else 3] += 2 if which == "gate_up_a" else 1
    shapes = [tuple(shapes[k]) for k in ("gate_up_a", "gate_up_b", "down_a", "down_b")]
    d = diagnose_pool(*shapes, n_shared_experts=n)
    if d.ok:
        return
    if d.fixable:
        fixed = d.apply_fix(*shapes)
        validate_pool(*fixed, n_shared_experts=n)
        assert diagnose_pool(*fixed, n_shared_experts=n).ok
        for f in d.findings:  # every shape fix names where it leads
            if f.code in ("ISL-E001", "ISL-E002", "ISL-E003", "ISL-E004", "ISL-E005"):
                assert any(str(list(t)) in f.fix for t in d.targets.values()), f
    else:
        with pytest.raises(ValueError, match="no shape fix for"):
            d.apply_fix(*shapes)


# -- diagnose_pool never raises on buffers (issue 14) -----------------------------------------------

@pytest.mark.parametrize("n,error", [(0, ValueError), (None, TypeError), ("2", TypeError), (True, TypeError)])
def test_diagnose_refuses_a_bad_n_clearly(n, error):
    with pytest.raises(error, match="n_shared_experts"):
        diagnose_pool(*GOOD, n_shared_experts=n)


def test_diagnose_reads_sparse_meta_and_huge_expanded_buffers():
    ga, gb, da, db = _real_pool().buffers()
    d = diagnose_pool(ga.to_sparse(), gb, da, db, n_shared_experts=2)
    assert d.codes == []
    bad = db.clone()
    bad[0, 0, 0, 0] = float("inf")
    assert diagnose_pool(ga, gb, da, bad.to_sparse(), n_shared_experts=2).codes == ["ISL-D107"]
    assert diagnose_pool(ga.to("meta"), gb.to("meta"), da.to("meta"), db.to("meta"), n_shared_experts=2).ok
    # a 1-element tensor viewed as [2^20, 1, 2^10, 2^10]: 2^40 elements, 4 TiB as float32
    one = torch.full((1, 1, 1, 1), float("nan"))
    huge = one.expand(2 ** 20, 1, 2 ** 10, 2 ** 10)
    zero = torch.zeros(1, 1, 1, 1)
    d = diagnose_pool(huge, zero.expand(2 ** 20, 2, 2 ** 10, 512), zero.expand(2 ** 20, 2, 512, 2 ** 9),
                      zero.expand(2 ** 20, 1, 2 ** 10, 512), n_shared_experts=2, lora_ranks=[1])
    assert "ISL-D107" in d.codes


def test_validate_pool_names_a_missing_buffer():
    with pytest.raises(TypeError, match="gate-up A"):
        validate_pool(None, *GOOD[1:], n_shared_experts=N)


_ANYTHING = st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=8), st.binary(max_size=8),
                      st.lists(st.one_of(st.integers(-3, 9), st.floats(), st.text(max_size=2)), max_size=6),
                      st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
                      shape_st.map(lambda s: torch.zeros(s) if len(s) <= 4 and 0 not in s[:1] else s))


@settings(max_examples=300, deadline=None)
@given(buffers=st.lists(_ANYTHING, min_size=4, max_size=4), n=st.integers(1, 4))
def test_diagnose_never_raises_on_any_buffers(buffers, n):
    d = diagnose_pool(*buffers, n_shared_experts=n)
    str(d)
    try:
        validate_pool(*buffers, n_shared_experts=n)
    except (TypeError, ValueError):  # documented: not a tensor or shape (TypeError), upstream's checks
        pass
