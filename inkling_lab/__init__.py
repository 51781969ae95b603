"""inkling_lab: learn, debug and profile the LoRA path of Inkling's shared-expert sink
(sglang 0.5.23), without sglang.

    import inkling_lab as il
    sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6)
    pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4)
    sink.set_lora_info(*pool.buffers())
"""
from .batch import SlotBatch
from .errors import CATALOG, CatalogEntry, explain, expect_error
from .geometry import PRESETS, Geometry
from .lora import LoRABackend, SharedSinkLoRA
from .pool import LoRAFactors, LoRAPool
from .sink import SharedSink
from .validate import Diagnosis, Finding, PoolLayout, diagnose_pool, validate_pool

__version__ = "0.1.0"

_LAZY = ("viz", "widgets", "adapters", "parallel", "profile", "upstream_defect", "cli")


def __getattr__(name: str):
    # Figures, widgets and the heavier tools load on first use, so that
    # ``import inkling_lab`` needs nothing but torch (the GPU and TP scripts rely on it).
    if name in _LAZY:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'inkling_lab' has no attribute {name!r}")

__all__ = [
    "CATALOG", "CatalogEntry", "Diagnosis", "Finding", "Geometry", "LoRABackend", "LoRAFactors",
    "LoRAPool", "PRESETS", "PoolLayout", "SharedSink", "SharedSinkLoRA", "SlotBatch",
    "diagnose_pool", "expect_error", "explain", "validate_pool",
]
