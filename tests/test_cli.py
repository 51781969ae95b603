import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inkling_lab.cli import main
from inkling_lab.convert import load_pool

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "adapters"
TOY = ["-n", "2", "--hidden", "8", "--intermediate", "6"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_doctor_exit_status_and_report(capsys):
    code, out, _ = run(capsys, "doctor", str(SAMPLES / "fused"), *TOY)
    assert code == 0 and "1. sglang 0.5.23 loads it" in out and "computes the adapter's math" in out
    assert "Exit status 0" in out
    code, out, _ = run(capsys, "doctor", str(SAMPLES / "three_experts"), *TOY)
    assert code == 1
    assert ("raises (in normalize; lora.py: LoRAAdapter._normalize_weights (normalize_qkv_proj, "
            "_normalize_shared_expert_moe, normalize_gate_up_proj)):\n    RuntimeError: shape '[4, 2, 7]' is invalid for input of size 60") in out
    assert "fix: " in out and "fails to load it" in out
    code, out, _ = run(capsys, "doctor", str(SAMPLES / "fused"), *TOY, "--max-rank", "2")
    assert code == 1 and "--max-rank 4 or larger" in out
    code, out, _ = run(capsys, "doctor", str(SAMPLES / "rslora"), *TOY)
    assert code == 1 and "2 times too weak" in out  # loads, but not the adapter's math


def test_doctor_json(capsys):
    code, out, _ = run(capsys, "doctor", str(SAMPLES / "no_config"), *TOY, "--json")
    report = json.loads(out)
    assert code == 1 and report["ok"] is False and report["exit_status"] == 1
    assert report["kit"]["code"] == "ISL-K201" and report["sglang"]["load"]["outcome"] == "raises"
    assert report["findings"][0]["code"] == "ISL-K201"
    code, out, _ = run(capsys, "doctor", str(SAMPLES / "transposed"), *TOY, "--json")
    report = json.loads(out)
    assert code == 1 and report["kit"] == {"outcome": "writes", "text": "", "code": None, "repairs": [
        report["kit"]["repairs"][0]]} and report["kit"]["repairs"][0].startswith("ISL-K206")
    assert report["sglang"]["load"]["text"].startswith("AssertionError: LoRA buffer shape torch.Size(")
    assert [f["code"] for f in report["findings"]] == ["ISL-K206"]
    assert report["sink"] == {"n_shared_experts": 2, "hidden": 8, "intermediate": 6, "tp": 1, "max_rank": 4}
    code, out, _ = run(capsys, "compare", str(SAMPLES / "gate_up"), *TOY, "--json")
    assert code == 0 and json.loads(out)["agree"] is True


def test_convert_writes_refuses_to_overwrite_and_forces(tmp_path, capsys):
    out = tmp_path / "pool.safetensors"
    ins = [str(SAMPLES / name) for name in ("gate_up", "w_names", "up_only")]
    code, stdout, _ = run(capsys, "convert", *ins, "-o", str(out), "-n", "2")
    assert code == 0 and f"wrote {out}" in stdout and "slot 2: up_only (r=4" in stdout and "[ISL-K211]" in stdout
    assert load_pool(out).lora_ranks == [4, 2, 4]
    code, _, err = run(capsys, "convert", *ins, "-o", str(out), "-n", "2")
    assert code == 1 and "refusing to write pool.safetensors: it already exists" in err
    assert "more: inkling-lab explain ISL-K213" in err
    code, stdout, _ = run(capsys, "convert", *ins[:1], "-o", str(out), "-n", "2", "--force", "--json", "--tp", "2",
                          "--tp-rank", "1", "--dtype", "bfloat16")
    summary = json.loads(stdout)
    assert code == 0 and summary["tensor_parallel"] == {"rank": 1, "size": 2} and summary["dtype"] == "bfloat16"
    assert summary["geometry"]["intermediate"] == 3


def test_convert_reports_why_it_refuses(tmp_path, capsys):
    code, _, err = run(capsys, "convert", str(SAMPLES / "truncated"), "-o", str(tmp_path / "p.safetensors"), "-n", "2")
    assert code == 1 and "ValueError: truncated/adapter_model.safetensors: not a readable safetensors file" in err
    assert f"adapter folder: {SAMPLES / 'truncated'}" in err and "ISL-K204" in err
    code, _, err = run(capsys, "convert", str(SAMPLES / "gate_up"), str(SAMPLES / "per_expert"),
                       "-o", str(tmp_path / "p.safetensors"), "-n", "2", "--outer", "shared")
    assert code == 1 and "experts_shared_outer_loras is enabled" in err and "ISL-E015" in err
    assert not (tmp_path / "p.safetensors").exists()


def test_explain(capsys):
    code, out, _ = run(capsys, "explain", "ValueError: Inkling shared-sink LoRA rank dimensions do not match")
    first, entry = out.split("\n", 1)
    assert code == 0 and entry.startswith("ISL-E005: rank dimensions disagree")
    assert first == "sglang 0.5.23 raises this (ISL-E005 is raised by sglang 0.5.16 to 0.5.23)"
    code, out, _ = run(capsys, "explain", "ISL-K203")
    assert code == 0 and "pickle" in out
    code, out, err = run(capsys, "explain", "isl-k203")
    assert code == 0 and out.split("\n", 1)[1].startswith("ISL-K203")
    code, out, err = run(capsys, "explain", "something", "unrelated")
    assert code == 1 and out == "" and "'something unrelated' is not a shared-sink LoRA error" in err
    assert "closest" not in err and "every entry: inkling-lab explain --list" in err
    code, out, err = run(capsys, "explain", "Inkling shared-sink LoRA rank dims do not match")
    assert code == 1 and "no catalog entry matches" in err and "paste the whole error line" in err
    closest = err.split("closest:\n", 1)[1].splitlines()
    assert closest[0].strip().startswith("ISL-E005  rank dimensions disagree (it also says")
    assert len(err.splitlines()) <= 8 and "ISL-K201" not in err  # short: no list of every code


def test_explain_lists_every_entry(capsys):
    import inkling_lab as il

    code, out, _ = run(capsys, "explain", "--list")
    assert code == 0 and out.splitlines() == [f"{e.code}  {e.title}" for e in il.CATALOG.values()]
    code, _, err = run(capsys, "explain")
    assert code == 2 and "--list" in err


def test_explain_reads_a_traceback_from_stdin(capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("Traceback (most recent call last):\n  ...\n"
                                                  "IndexError: Shared-sink LoRA slot out of range: [0, 9]\n"))
    code, out, _ = run(capsys, "explain", "-")
    assert code == 0 and out.split("\n", 1)[1].startswith("ISL-E008")


def test_usage(capsys):
    code, out, _ = run(capsys, )
    assert code == 2 and "doctor" in out and "convert" in out and "explain" in out
    with pytest.raises(SystemExit) as caught:
        main(["doctor", str(SAMPLES / "fused"), "-n", "2"])
    assert caught.value.code == 2 and "--hidden" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["doctor", str(SAMPLES / "fused"), *TOY[:2], "--hidden", "0", "--intermediate", "6"])
    assert "expected a number of at least 1, got 0" in capsys.readouterr().err


def test_profile_is_offered_where_its_module_is_installed(capsys):
    import importlib.util

    with pytest.raises(SystemExit):
        main(["--help"])
    listed = "profile" in capsys.readouterr().out
    assert listed == (importlib.util.find_spec("inkling_lab.profile") is not None)


def test_the_console_script(tmp_path):
    script = shutil.which("inkling-lab", path=str(Path(sys.executable).parent)) or shutil.which("inkling-lab")
    assert script, "inkling-lab is not installed: pip install -e ."
    done = subprocess.run([script, "doctor", str(SAMPLES / "missing_b"), *TOY, "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["kit"]["code"] == "ISL-K209"


def test_convert_keeps_the_adapters_dtype_unless_given_one(tmp_path, capsys):
    from inkling_lab.adapters import save_adapter, synthetic_adapter

    folder = save_adapter(synthetic_adapter(2, 8, 6, 2, dtype=torch.float64), tmp_path / "f64")
    for extra, dtype in (([], torch.float64), (["--dtype", "bfloat16"], torch.bfloat16)):
        out = tmp_path / f"pool{len(extra)}.safetensors"
        code, _, _ = run(capsys, "convert", str(folder), "-o", str(out), "-n", "2", "-q", *extra)
        assert code == 0 and load_pool(out).buffers()[0].dtype == dtype


@pytest.mark.parametrize("sample, code", [("rslora", "ISL-W101"), ("alpha_pattern", "ISL-W102"),
                                          ("per_expert", "ISL-W001")])
def test_convert_says_where_sglang_would_differ_as_the_doctor_does(tmp_path, capsys, sample, code):
    folder = ROOT / "data" / "adapters" / sample
    assert main(["convert", str(folder), "-n", "2", "-o", str(tmp_path / "p.safetensors"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert printed.count(f"[{code}]") == 1                       # once, as the doctor words it
    assert main(["convert", str(folder), "-n", "2", "-o", str(tmp_path / "q.safetensors"), "--json"]) == 0
    assert code in [f["code"] for f in json.loads(capsys.readouterr().out)["findings"]]


def test_convert_says_which_sizes_it_inferred_and_from_what(tmp_path, capsys):
    """An n = 2 adapter converted with -n 3: its flat factors hold n*F = 12, so F = 4 is
    what -n 3 implies; the converter says so instead of writing it silently."""
    out = tmp_path / "p.safetensors"
    code, said, _ = run(capsys, "convert", str(SAMPLES / "gate_up"), "-o", str(out), "-n", "3")
    assert code == 0
    assert "inferred F = 4, from the flat down A of adapter 'gate_up': its 12 columns split over the n = 3" in said
    assert "inferred H = 8, from the gate-up A of adapter 'gate_up'" in said and "--intermediate" in said
    code, said, _ = run(capsys, "convert", str(SAMPLES / "gate_up"), "-o", str(out), "-n", "2", "--force",
                        "--hidden", "8", "--intermediate", "6")
    assert code == 0 and "inferred" not in said  # given, not inferred
    code, said, _ = run(capsys, "convert", str(SAMPLES / "per_expert"), "-o", str(out), "-n", "2", "--force", "--json")
    assert code == 0 and json.loads(said)["inferred"] == [
        "H = 8, from the gate-up A of adapter 'per_expert' (8 columns); pass --hidden to state it",
        "F = 6, from the per-expert down A of adapter 'per_expert' (6 columns each)"]


def test_convert_refuses_an_n_the_adapters_model_config_contradicts(tmp_path, capsys):
    adapter = tmp_path / "gate_up"
    shutil.copytree(SAMPLES / "gate_up", adapter)
    (adapter / "config.json").write_text(json.dumps(
        {"model_type": "inkling", "text_config": {"n_shared_experts": 2, "hidden_size": 8, "moe_intermediate_size": 6}}))
    out = tmp_path / "p.safetensors"
    code, _, err = run(capsys, "convert", str(adapter), "-o", str(out), "-n", "3")
    assert code == 1 and "gate_up/config.json: the model this adapter was made for has n_shared_experts=2, but the " \
                         "conversion was asked for -n 3; pass -n 2" in err
    assert not out.exists()
    code, said, _ = run(capsys, "convert", str(adapter), "-o", str(out), "-n", "2")
    assert code == 0 and "inferred F = 6, from gate_up/config.json (moe_intermediate_size)" in said
    code, _, err = run(capsys, "convert", str(adapter), "-o", str(out), "-n", "2", "--force", "--intermediate", "4")
    assert code == 1 and "moe_intermediate_size=6, but the conversion was asked for --intermediate 4" in err


def test_sglang_picks_the_release_whose_verdicts_are_given(capsys):
    """0.5.22 has no second wrapper generation: its message is not that release's."""
    v2 = "ValueError: The V2 shared sink must select contiguous W13 before loading"
    code, out, _ = run(capsys, "explain", v2, "--sglang", "0.5.22")
    assert code == 0 and out.startswith("sglang 0.5.22 does not raise this: ISL-E019 is raised by sglang 0.5.23 only")
    code, out, _ = run(capsys, "explain", v2)
    assert code == 0 and out.startswith("sglang 0.5.23 raises this (ISL-E019")
    code, out, _ = run(capsys, "doctor", str(SAMPLES / "rslora"), "-n", "2", "--hidden", "8", "--intermediate", "6",
                       "--sglang", "0.5.20")
    assert code == 1 and out.startswith("sglang 0.5.20, adapter ") and "\n1. sglang 0.5.20 loads it" in out
    assert "sglang 0.5.20 ignores use_rslora" in out and "0.5.23" not in out
    code, out, _ = run(capsys, "compare", str(SAMPLES / "rslora"), "-n", "2", "--hidden", "8", "--intermediate", "6",
                       "--sglang", "v0.5.18")
    assert out.startswith("sglang 0.5.18, compare: ") and "0.5.23" not in out
    for command in (["explain", "ISL-E001"], ["doctor", str(SAMPLES / "rslora"), "-n", "2", "--hidden", "8",
                                              "--intermediate", "6"]):
        with pytest.raises(SystemExit) as caught:
            main([*command, "--sglang", "0.5.15"])
        err = capsys.readouterr().err
        assert caught.value.code == 2 and "0.5.15 has no shared-sink LoRA" in err and "0.5.16, 0.5.17" in err
