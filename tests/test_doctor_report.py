"""The doctor's report as a reviewer reads it: every sample adapter's report (and a
PEFT target_parameters export's, and a missing folder's) rendered, and checked for
placeholders, double prints and garbled sentences."""
import json
import re
from pathlib import Path

import pytest

import inkling_lab as il
from inkling_lab.doctor import doctor

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "adapters"
MANIFEST = {m["name"]: m for m in json.loads((SAMPLES / "MANIFEST.json").read_text())}


def _sink(name: str) -> tuple[int, int, int]:
    sink = MANIFEST.get(name, {}).get("sink") or {"n_shared_experts": 2, "hidden": 8, "intermediate": 6}
    return sink["n_shared_experts"], sink["hidden"], sink["intermediate"]


def _check_reads_plainly(text: str) -> None:
    lines = text.splitlines()
    # no placeholder where the kit knows better
    assert "(none: zeros)" not in text and "[error]" not in text, text
    assert not re.search(r"\?\s*->|->\s*\?\s*$", text, re.M) or "refuses it" in text, text
    # nothing long printed twice (a skip list, a message)
    long = [line.strip() for line in lines if len(line.strip()) > 120]
    twice = {line for line in long if long.count(line) > 1}
    assert not twice, f"printed twice: {twice}"
    for line in lines:
        # a list of names is the subject of a plural verb: "a, b is not applied" is garbled
        assert not re.search(r"\w, \w+ is not applied", line), line
        assert "base_layer, shared_experts" not in line, line
        # one audience per sentence: the CLI flag and the Python keyword said as such
        assert "--force (force=True)" not in line, line
    # repairs are changes to the file's contents, not warnings about sglang
    for line in lines:
        if ", after " in line and " repair(s): " in line:
            assert "ISL-W" not in line.split(" repair(s): ", 1)[1], line


@pytest.mark.parametrize("name", sorted(p.name for p in SAMPLES.iterdir() if p.is_dir()))
def test_every_sample_report_reads_plainly(name):
    report = doctor(SAMPLES / name, *_sink(name), measure=False)
    _check_reads_plainly(str(report))


def test_a_target_parameters_export_names_where_its_factors_come_from(tmp_path):
    il.make_peft_sink_adapter(tmp_path / "peft", n=2, hidden=8, intermediate=4)
    text = str(doctor(tmp_path / "peft", 2, 8, 4, measure=False))
    _check_reads_plainly(text)
    assert text.count("(PEFT target_parameters export, read per expert)") == 4
    assert text.count("Skipped weights:") == 1  # the warning is quoted once, under verdict 1
    assert "[ISL-W002] the warning quoted under 1. above" in text
    # ... and the buffer load then fails on the first of them: no request can use the adapter
    assert ("then raises (in pool; mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer, its per-layer loop"
            in text)
    assert ("ValueError: Cannot find target module name for base_model.model.model.layers.0.mlp.shared_experts."
            "base_layer.base_layer.lora_A.weight in set()") in text
    assert "inkling-lab export writes its math as an adapter it serves" in text


def test_a_missing_folder_is_tagged_with_its_code(tmp_path):
    text = str(doctor(tmp_path / "nowhere", 2, 8, 6, measure=False))
    _check_reads_plainly(text)
    assert "[ISL-K201] FileNotFoundError: nowhere/adapter_config.json: no adapter_config.json (the folder does " \
           "not exist)" in text
