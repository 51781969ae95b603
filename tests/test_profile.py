"""The roofline arithmetic, the record format and the command line of ``profile``."""
import argparse
import json
from pathlib import Path

import pytest

import torch

from inkling_lab import profile as pr
from inkling_lab import records
from inkling_lab.geometry import PRESETS
from fresh_interpreter import fresh_imports

RECORD = Path(__file__).resolve().parents[1] / "data" / "profiles" / "h200_grid.json"


@pytest.mark.parametrize("shape,T,roof_us", [(row[0], row[1], row[5]) for row in pr.issue4_upstream().rows])
def test_roofline_reproduces_the_issue_table(shape, T, roof_us):
    c = pr.Case.of(shape, R=64, S=4, T=T)
    # The issue prints µs to one decimal under 100 and whole µs above (179.5 -> 179).
    assert pr.roofline(c, **pr.issue4_upstream().ceilings).us == pytest.approx(roof_us, abs=0.05, rel=0.005)


def test_bytes_and_flops_by_hand():
    # n 2, H 1536, F 768, R 64, 4 slots, one token: one slot used.
    c = pr.Case.of("A", R=64, S=4, T=1)
    weights = 2 * (2 * 2 * 768 * 1536 + 2 * 1536 * 768)
    one_slot = 2 * (1 * 128 * 1536 + 2 * 1536 * 64 + 2 * 64 * 768 + 1 * 1536 * 64)
    io = 2 * (2 * 1536 + 2)
    assert c.slots_used == 1
    assert pr.case_bytes(c) == weights + one_slot + io
    base = 2 * 1536 * 2 * 1536 + 2 * 1536 * 1536
    lora = 2 * 128 * 1536 + 2 * 2 * 1536 * 64 + 2 * 1536 * 64 + 2 * 64 * 1536
    assert pr.case_flops(c) == base + lora
    roof = pr.roofline(c, copy_TBps=1.0, matmul_TFLOPs=1.0)
    assert roof.memory_us == pytest.approx(pr.case_bytes(c) / 1e6) and roof.bound == "memory"


def test_per_expert_outer_counts_n_outer_factors():
    shared, per_expert = pr.Case.of("B", 16, 1, 4096), pr.Case.of("B", 16, 1, 4096, outer=2)
    n, H, R, T = 2, 4096, 16, 4096
    assert pr.case_bytes(per_expert) - pr.case_bytes(shared) == 2 * (2 * R * H + H * R)
    assert pr.case_flops(per_expert) - pr.case_flops(shared) == 2 * T * 2 * R * H + 2 * T * R * H
    assert pr.roofline(per_expert, 4.2, 780).bound == "compute"


def test_segments_split_tokens_evenly_and_targets_follow_the_issue():
    assert pr.Case.of("A", 16, 4, 10).segment_lengths() == [3, 3, 2, 2]
    assert pr.Case.of("A", 16, 8, 3).slots_used == 3
    assert [pr.target_ratio(T) for T in (1, 32, 64, 1024, 2048, 8192)] == [3.0, 3.0, None, None, 1.2, 1.2]
    assert pr.upstream_us("B", 8192, 4, 64) == 2511 and pr.upstream_us("B", 8192, 8, 64) is None
    with pytest.raises(ValueError, match="unknown shape 'C'"):
        pr.Case.of("C", 16, 1, 1)


def test_write_json_is_atomic_and_load_record_names_missing_keys(tmp_path):
    path = records.write_json(tmp_path / "sub" / "r.json", {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temp file left behind
    with pytest.raises(ValueError, match=r"missing \['environment', 'ceilings', 'correctness', 'records'\]"):
        pr.load_record(path)


def test_summary_table_marks_targets_and_other_backends():
    def rec(backend, us, T=2048):
        c = pr.Case.of("A", 64, 4, T)
        roof = pr.roofline(c, 4.2, 780)
        return {"case": {"shape": "A", "R": 64, "S": 4, "T": T}, "backend": backend, "median_us": us,
                "roofline_us": roof.us, "ratio": us / roof.us, "target": pr.target_ratio(T), "upstream_us": None}
    table = pr.summary_table([rec("triton", 50.0), rec("torch", 90.0), rec("triton", 10.0, T=1)])
    lines = table.splitlines()
    assert lines[0].startswith("| shape | R | S | T | triton")
    assert "| A | 64 | 4 | 1 | 10.0 |" in table and "| yes |" in table
    assert "| A | 64 | 4 | 2048 | 50.0 |" in table and "| 90.0 |" in table


def test_the_recorded_h200_grid_is_complete_and_consistent():
    rec = pr.load_record(RECORD)
    env = rec["environment"]
    assert env["device"] == "NVIDIA H200" and env["command"].startswith("inkling-lab profile")
    assert len(env["git_commit"]) == 40 and env["torch"] and env["triton"]
    assert all(c["ok"] for c in rec["correctness"])
    triton = [r for r in rec["records"] if r["backend"] == "triton"]
    assert len(triton) == len(pr.grid())
    for r in triton:
        c = pr.Case.from_record(r["case"])
        assert c.record() == r["case"]  # the fields a record has always had, in their order
        assert r["roofline_us"] == pytest.approx(pr.roofline(c, **rec["ceilings"]).us)
        assert r["ratio"] == pytest.approx(r["median_us"] / r["roofline_us"])
    assert rec["kernel_tables"] and all(t["kernels"] for t in rec["kernel_tables"])


def test_cli_registers_profile_and_refuses_without_cuda(capsys):
    parser = argparse.ArgumentParser(prog="inkling-lab")
    pr.register_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["profile", "--ranks", "16", "--tokens", "1,8", "--shapes", "A"])
    assert args.ranks == [16] and args.tokens == [1, 8] and args.func is pr.profile_command
    with pytest.raises(SystemExit):
        parser.parse_args(["profile", "--tokens", "1,x"])
    if not torch.cuda.is_available():
        assert args.func(args) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_l2_flush_mode_is_checked():
    with pytest.raises(ValueError, match="mode must be 'read' or 'write'"):
        pr.L2Flush("cpu", mode="evict")


def test_a_case_is_a_geometry_plus_tokens_and_its_inputs_come_from_the_scenario_factory():
    c = pr.Case.of("Inkling-TP8", R=16, S=3, T=7, outer=2, dtype="float32")
    assert c.geometry == PRESETS["inkling-tp8"].with_(max_rank=16, slots=3, outer=2)
    small = pr.Case("toy", PRESETS["toy"].with_(max_rank=2, slots=3), T=7, dtype="float64")
    sc = small.scenario("cpu", seed=5)
    assert sc.batch.token_slots().tolist() == [0, 0, 0, 1, 1, 2, 2]  # the even segments, slot i on segment i
    assert sc.pool.lora_ranks == [2, 2, 2] and sc.x.dtype == torch.float64
    again = pr.Case("toy", small.geometry.with_(max_rank=1, slots=1), T=2, dtype="float64").scenario("cpu", sink=sc.sink)
    assert again.sink is sc.sink and again.sink.lora_buffers[1].shape[-1] == 1  # the weights kept, a new pool
    with pytest.raises(ValueError, match="the sink to reuse"):
        pr.Case("toy", small.geometry, T=2, dtype="float32").scenario("cpu", sink=sc.sink)


def test_importing_profile_reads_no_file():
    assert fresh_imports()["json_opened"] == []  # a fresh interpreter's
