"""The names of an adapter's shared-sink factors: files, projections, factor keys (``FactorName``), PEFT's module names."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch




CONFIG_FILE = "adapter_config.json"


WEIGHTS_FILE = "adapter_model.safetensors"


RENAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
"""docs/reference.md#adapters-on-disk step 2: the ``w``-names of the same three projections."""


PROJECTIONS = ("gate_proj", "up_proj", "gate_up_proj", "down_proj", *RENAMES)


_FACTOR_KEY = re.compile(
    r"^(?P<module>.*shared_experts)\.(?:(?P<expert>\d+)\.)?(?P<proj>[^.]+)\.lora_(?P<ab>[AB])\.weight$")


TRANSFORMERS_PARAMETERS = ("gate_proj", "up_proj", "down_proj")
"""transformers' ``InklingSharedExperts`` parameters, in the order its ``__init__``
registers them: ``gate_proj [n, F, H]``, ``up_proj [n, F, H]``, ``down_proj [n, H, F]``."""


_NESTED_KEY = re.compile(r"^(?P<module>.*shared_experts)(?P<nest>(?:\.base_layer)*)\.lora_(?P<ab>[AB])\.weight$")


@dataclass(frozen=True)
class FactorName:
    """One parsed factor key: ``<module>[.<expert>].<proj>.lora_<ab>.weight``."""

    module: str
    expert: int | None
    proj: str
    ab: str

    @classmethod
    def parse(cls, key: str) -> "FactorName | None":
        m = _FACTOR_KEY.match(key)
        if m is None:
            return None
        e = m["expert"]
        return cls(m["module"], None if e is None else int(e), m["proj"], m["ab"])

    @property
    def key(self) -> str:
        expert = "" if self.expert is None else f".{self.expert}"
        return f"{self.module}{expert}.{self.proj}.lora_{self.ab}.weight"

    def with_(self, **changes: Any) -> "FactorName":
        return FactorName(**{**self.__dict__, **changes})

    @property
    def canonical(self) -> str:
        """The projection under its ``gate_proj``/``up_proj``/``down_proj`` name."""
        return RENAMES.get(self.proj, self.proj)

    @property
    def rank_axis(self) -> int:
        """A is ``[r, in]``, B is ``[out, r]``."""
        return 0 if self.ab == "A" else 1

    @property
    def is_outer(self) -> bool:
        """Gate/up A and down B: shared by all experts unless named per expert."""
        return (self.ab == "A") != (self.canonical == "down_proj")

    def expected(self) -> str:
        """The 2D shape this factor should have, in the reference's symbols (n, H, F, r)."""
        flat = self.expert is None
        if self.canonical == "down_proj":
            return ("[r, n*F]" if flat else "[r, F]") if self.ab == "A" else "[H, r]"
        if self.ab == "A":
            return "[r, H]"
        rows = "2F" if self.canonical == "gate_up_proj" else "F"
        return f"[n*{rows}, r]" if flat else f"[{rows}, r]"


def _where(source: str, file: str) -> str:
    # The folder's name and the file: enough to find it, and no machine path in a
    # notebook's stored output. The full path travels as a note on the exception.
    return f"{Path(source).name or source}/{file}" if source else file


def _refuse(exc: Exception, folder: Path | None) -> Exception:
    if folder is not None:
        exc.add_note(f"adapter folder: {folder}")
    return exc


def _shape(t: torch.Tensor) -> list[int]:
    return [int(d) for d in t.shape]


def module_of(key: str) -> str:
    """The module name PEFT matches patterns against: the factor key without PEFT's
    ``base_model.model.`` prefix and its ``.lora_A.weight`` ending."""
    name = key.removeprefix("base_model.model.")
    return re.sub(r"\.lora_[AB]\.weight$", "", name)
