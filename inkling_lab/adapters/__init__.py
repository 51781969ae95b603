"""PEFT adapters on disk, read for the shared sink (docs/reference.md#adapters-on-disk).

A PEFT adapter is a folder with ``adapter_config.json`` (``r``, ``lora_alpha``,
``target_modules``, ...) and ``adapter_model.safetensors``. Its shared-sink factors
are plain 2D LoRA matrices named ``<module>.<proj>.lora_A.weight`` /
``lora_B.weight``, ``<module>`` ending in ``mlp.shared_experts`` (per-expert exports:
``<module>.<e>.<proj>...``) and ``<proj>`` one of ``gate_proj``, ``up_proj``,
``gate_up_proj``, ``down_proj`` (or ``w1``, ``w3``, ``w2``):

* gate A, up A, fused A ``[r, H]``; down B ``[H, r]`` (the outer factors);
* gate B, up B ``[n*F, r]``, fused B ``[n*2F, r]`` (experts stacked); down A
  ``[r, n*F]`` (experts side by side). Per-expert exports: ``[F, r]``, ``[r, F]``...

PEFT ``target_parameters`` exports of transformers' ``InklingSharedExperts`` (its 3D
``gate_proj``/``up_proj``/``down_proj``) name their factors
``<module>.shared_experts[.base_layer...].lora_A.weight``; they are read as the
per-expert factors they are (``ISL-N204``; ``is_target_parameters_export`` tells them
apart: sglang 0.5.23 matches such keys to no target module and its buffer load fails on them,
docs/reference.md#peft-features).

``load_adapter`` reads and checks a folder (safetensors only, never pickle): the
header first, then only the shared-sink tensors, one at a time (other modules'
tensors are named, never read); every bad input is refused with the file, the
tensor and what was expected (``ISL-K2xx``, ``ISL-K401``/``K402``).
Where the intent is unambiguous it repairs instead (a transposed factor, an up
without a gate, an outer factor missing its expert axis), and every repair is
reported in ``Adapter.findings``; ``repair=False`` refuses those too. Findings that
need no fix carry note codes: ``ISL-N201`` the adapter trains only part of the sink
(the other factors are zero), ``ISL-N202`` tensors for other modules are left out,
``ISL-N203`` a gate without an up gets a zero up (as upstream does).
``normalize_shared_sink`` is upstream's normalization, step for step, with
upstream's raw errors; ``Adapter.factors(n)`` assembles the result into one
``LoRAFactors`` per module, ready for ``LoRAPool.load``.

The package, one module per job: ``names`` (files, projections, factor keys), ``config``
(``PeftConfig``), ``checks``, ``normalize`` (upstream's three steps), ``target_parameters``,
``adapter`` (``Adapter``), ``files`` (``load_adapter``, ``save_adapter``), ``synthetic``.
"""
from .names import CONFIG_FILE, PROJECTIONS, RENAMES, TRANSFORMERS_PARAMETERS, WEIGHTS_FILE, FactorName, module_of
from .config import BASE_CHANGING_INITS, PeftConfig, read_peft_config
from .normalize import normalize_inkling_qkvr_proj, normalize_layer, normalize_qkv_proj, normalize_shared_sink
from .target_parameters import peft_target_parameter_keys
from .adapter import Adapter, is_target_parameters_export
from .files import (HEADER_LIMIT, as_path, TEXT_LIMIT, HeaderError, check_regular, check_safetensors_header, file_sha256,
                    load_adapter, open_regular, open_safetensors, read_regular, save_adapter)
from .synthetic import NAMINGS, synthetic_adapter
from .names import _NESTED_KEY  # noqa: F401 - read by sglang_path's model of upstream's key matching

__all__ = ["Adapter", "BASE_CHANGING_INITS", "CONFIG_FILE", "FactorName", "HEADER_LIMIT", "HeaderError", "NAMINGS", "PROJECTIONS", "PeftConfig", "RENAMES", "TEXT_LIMIT", "TRANSFORMERS_PARAMETERS", "WEIGHTS_FILE", "as_path", "check_regular", "check_safetensors_header", "file_sha256", "is_target_parameters_export", "load_adapter", "module_of", "normalize_inkling_qkvr_proj", "normalize_layer", "normalize_qkv_proj", "normalize_shared_sink", "open_regular", "open_safetensors", "peft_target_parameter_keys", "read_peft_config", "read_regular", "save_adapter", "synthetic_adapter"]
