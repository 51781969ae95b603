"""One reading, one normalization per module: what one ``doctor()`` call costs in
normalizations and weights-file header reads, for adapters of 1, 2 and 66 modules.

The kit normalizes each shared-sink module once (``Adapter.factors``; the converter
takes those factors instead of normalizing again) and reads the weights file's header
once (``load_adapter``); the sglang model does its own reading and its own one
normalization of the whole adapter, as sglang does. A count that grows fails here.
"""
from collections import Counter

import pytest
from safetensors import safe_open

import inkling_lab.adapters as adapters
import inkling_lab.adapters.adapter as adapter_module
import inkling_lab.adapters.files as files_module
import inkling_lab.doctor as doctor_module
import inkling_lab.sglang_path as sglang_path
from inkling_lab.adapters import normalize_layer, normalize_shared_sink, save_adapter, synthetic_adapter


@pytest.fixture
def counts(monkeypatch):
    """Counts of ``normalize`` and ``header`` calls, by who makes them (``kit`` or ``sglang``)."""
    seen: Counter = Counter()

    def counting(what, who, real):
        def call(*args, **kwargs):
            seen[what, who] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(adapter_module, "normalize_shared_sink", counting("normalize", "kit", normalize_shared_sink))
    monkeypatch.setattr(sglang_path, "normalize_layer", counting("normalize", "sglang", normalize_layer))
    monkeypatch.setattr(files_module, "safe_open", counting("header", "kit", safe_open))
    monkeypatch.setattr(sglang_path, "safe_open", counting("header", "sglang", safe_open))
    return seen


@pytest.mark.parametrize("modules", [1, 2, 66])
def test_one_doctor_call_normalizes_each_module_once_and_reads_the_header_once(modules, tmp_path, counts):
    folder = save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=2, layers=tuple(range(modules))),
                          tmp_path / "adapter")
    report = doctor_module.doctor(folder, 2, 8, 6)
    assert report.ok and len(report.journey) == modules  # the whole path ran, every module on it
    # sglang's path normalizes each layer once, as _normalize_weights walks its layers
    assert dict(counts) == {("normalize", "kit"): modules, ("normalize", "sglang"): modules,
                            ("header", "kit"): 1, ("header", "sglang"): 1}


def test_a_refused_adapter_is_still_read_once_by_each(tmp_path, counts):
    """The kit refuses a NaN factor after its one read; its journey comes from that one
    header (read again only to show the shapes as saved), sglang reads the file once."""
    ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=2)
    key = ad.factor_keys[0]
    weights = {**ad.weights, key: ad.weights[key].clone()}
    weights[key][0, 0] = float("nan")
    folder = save_adapter(adapters.Adapter(ad.name, ad.r, ad.lora_alpha, ad.target_modules, weights, ad.config),
                          tmp_path / "nan")
    report = doctor_module.doctor(folder, 2, 8, 6)
    assert report.kit.outcome == "refuses" and report.kit.code == "ISL-K302"
    assert counts["normalize", "kit"] == 0 and counts["normalize", "sglang"] == 1
    assert counts["header", "kit"] == 2 and counts["header", "sglang"] == 1
