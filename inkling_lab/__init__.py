"""inkling_lab: learn, debug and profile the LoRA path of Inkling's shared-expert sink
(sglang 0.5.23), without sglang.

    import inkling_lab as il
    sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6)
    pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4)
    sink.set_lora_info(*pool.buffers())
"""
from .batch import SlotBatch
from .catalog import Finding
from .errors import CATALOG, CatalogEntry, explain, expect_error
from .errors import expect_finding
from .geometry import PRESETS, Geometry
from .lora import LoRABackend, SharedSinkLoRA
from .pool import LoRAFactors, LoRAPool
from .scenario import Scenario
from .scratch import scratch_folder
from .shard import slice_lora_a, slice_lora_b
from .sink import SharedSink
from .validate import Diagnosis, PoolLayout, diagnose_pool, validate_pool

__version__ = "0.1.0"

_LAZY_MODULES = ("viz", "widgets", "records", "adapters", "convert", "doctor", "compare", "parallel", "profile",
                 "upstream_defect", "cli", "transformers_interop", "export")
_LAZY_MODULES += ("nb", "exercises")  # the notebooks' own helpers and the exercises' checks

_LAZY_NAMES = {
    # adapters on disk (docs/reference.md#adapters-on-disk)
    "Adapter": "adapters", "load_adapter": "adapters", "save_adapter": "adapters",
    "normalize_shared_sink": "adapters", "synthetic_adapter": "adapters",
    "is_target_parameters_export": "adapters",
    # the converter and the doctor
    "ConvertedPool": "convert", "load_pool": "convert", "convert_to_file": "convert",
    "doctor": "doctor", "DoctorReport": "doctor",
    # the cure: an adapter sglang 0.5.23 serves as trained (docs/reference.md#the-cure)
    "export_for_sglang": "export", "ExportReport": "export", "verify_export": "export",
    # transformers' Inkling (InklingSharedExperts) and PEFT target_parameters exports of it
    "sink_from_transformers": "transformers_interop", "sink_from_checkpoint": "transformers_interop",
    "to_transformers": "transformers_interop", "make_peft_sink_adapter": "transformers_interop",
    "peft_agreement": "transformers_interop",
    # tensor parallelism (docs/reference.md#tensor-parallelism)
    "shard_sink": "parallel", "RankShard": "parallel", "run_tp": "parallel", "TPCase": "parallel",
    "sum_of_shards": "parallel",
    # the per-expert outer defect of sglang 0.5.23 (docs/reference.md#per-expert-defect)
    "sglang_0_5_23_per_expert_forward": "upstream_defect", "defect_report": "upstream_defect",
    "DefectReport": "upstream_defect", "collapse_identical_outer": "upstream_defect",
}


def __getattr__(name: str):
    # Figures, widgets, files and the distributed runner load on first use, so that
    # ``import inkling_lab`` needs nothing but torch (the GPU and TP scripts rely on it).
    import importlib

    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name == "convert_adapters":
        return importlib.import_module(".convert", __name__).convert
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
    raise AttributeError(f"module 'inkling_lab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_MODULES) | set(_LAZY_NAMES) | {"convert_adapters"})

__all__ = [
    "CATALOG", "CatalogEntry", "Diagnosis", "Finding", "Geometry", "LoRABackend", "LoRAFactors",
    "LoRAPool", "PRESETS", "PoolLayout", "SharedSink", "SharedSinkLoRA", "SlotBatch",
    "Scenario",
    "slice_lora_a", "slice_lora_b",
    "diagnose_pool", "expect_error", "expect_finding", "explain", "scratch_folder", "validate_pool",
    *sorted(_LAZY_NAMES), "convert_adapters",
]
