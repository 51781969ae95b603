import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_lab.adapters import NAMINGS, save_adapter, synthetic_adapter
from inkling_lab.doctor import doctor

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "adapters"
MANIFEST = json.loads((SAMPLES / "MANIFEST.json").read_text())


@pytest.mark.parametrize("sample", MANIFEST, ids=lambda m: m["name"])
def test_the_doctor_reports_what_each_sample_documents(sample):
    sink = sample["sink"]
    report = doctor(SAMPLES / sample["name"], sink["n_shared_experts"], sink["hidden"], sink["intermediate"])
    codes = [f.code for f in report.findings]
    if sample["kind"] == "broken":
        assert report.fails and report.error_code == sample["code"] and codes[0] == sample["code"]
        assert report.upstream_raises == sample["code"].startswith("ISL-E")
    else:  # loads: only the documented repair or note, and warnings about how sglang computes it
        assert not report.fails
        assert [c for c in codes if not c.startswith("ISL-W")] == [c for c in [sample["code"]] if c and c[4] != "W"]
        assert sample["code"] is None or sample["code"] in codes
    assert json.loads(json.dumps(report.to_dict()))["ok"] == (not report.fails)


def test_doctor_shows_the_exact_upstream_message_and_a_fix():
    report = doctor(SAMPLES / "three_experts", 2, 8, 6)
    text = str(report)
    assert "sglang 0.5.23 loading it raises:\n  RuntimeError: shape '[4, 2, 7]' is invalid for input of size 60" in text
    assert "it splits for n in [1, 3, 5, 15]" in report.findings[0].fix
    report = doctor(SAMPLES / "gate_up", 2, 8, 6, max_rank=2)
    assert report.error_code == "ISL-E016" and "--max-rank 4 or larger" in report.findings[0].fix
    report = doctor(SAMPLES / "gate_up", 3, 8, 6)
    assert "its 12 expert features would give F=6 with n=2" in report.findings[0].fix
    report = doctor(SAMPLES / "gate_up", 2, 8, 6, tp=2)
    assert not report.fails and report.pool.geometry.intermediate == 3
    rows = report.journey["base_model.model.model.layers.0.mlp.shared_experts"]
    assert rows[1] == {"buffer": "gate_up_b", "peft": [("gate_proj.lora_B", [12, 4]), ("up_proj.lora_B", [12, 4])],
                       "normalized": [2, 12, 4], "pool": [1, 2, 6, 4]}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 3), r=st.integers(1, 4), config_r=st.integers(1, 5))
def test_the_doctor_never_raises_on_a_damaged_adapter(data, n, r, config_r):
    import tempfile

    from inkling_lab.adapters import Adapter

    a = synthetic_adapter(2, 4, 3, r, naming=data.draw(st.sampled_from(sorted(NAMINGS))),
                          per_expert=data.draw(st.booleans()))
    weights = dict(a.weights)
    for key in data.draw(st.lists(st.sampled_from(sorted(weights)), max_size=3, unique=True)):
        damage = data.draw(st.sampled_from(["drop", "transpose", "flatten", "cut", "rename"]))
        t = weights.pop(key)
        if damage == "transpose":
            weights[key] = t.T.contiguous()
        elif damage == "flatten":
            weights[key] = t.flatten()
        elif damage == "cut":
            weights[key] = t[: max(t.shape[0] - 1, 0)].contiguous()
        elif damage == "rename":
            weights[key.replace("lora_", "lora_x")] = t
    broken = Adapter(a.name, config_r, a.lora_alpha, a.target_modules, weights, {**a.config, "r": config_r})
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_adapter(broken, Path(tmp) / "damaged")
        report = doctor(folder, n, 4, 3, tp=data.draw(st.sampled_from([1, 3])))
    assert report.fails == (report.error is not None)
    assert str(report) and json.dumps(report.to_dict())
    if report.fails:  # always a catalogued error, never a raw one from deep inside
        assert report.error_code is not None, report.error
        assert report.findings[0].message.startswith(type(report.error).__name__)


def test_the_journey_figure_and_the_explorer_follow_the_doctor():
    import matplotlib.pyplot as plt

    from inkling_lab.viz import adapter_journey_figure
    from inkling_lab.widgets import adapter_explorer

    rows = doctor(SAMPLES / "per_expert", 2, 8, 6).journey["base_model.model.model.layers.0.mlp.shared_experts"]
    fig = adapter_journey_figure(rows, "per_expert")
    titles = [ax.get_title() for ax in fig.axes]
    assert len(fig.axes) == 12 and "[1, 2, 12, 4]" in titles and "0.gate_proj.lora_A [4, 8]" in titles[0]
    plt.close(fig)
    failed = adapter_journey_figure(next(iter(doctor(SAMPLES / "three_experts", 2, 8, 6).journey.values())))
    assert [t.get_text() for t in failed.axes[1].texts] == ["fails before here"]
    plt.close(failed)

    box = adapter_explorer(str(SAMPLES))
    adapter, tp = box.children[1].children
    n, max_rank = box.children[2].children
    adapter.value, n.value = "rank8", 3  # each change redraws through the doctor without raising
    max_rank.value, tp.value = 2, 2
    plt.close("all")
