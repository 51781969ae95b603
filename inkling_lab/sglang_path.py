"""sglang's adapter path for one release (default 0.5.23), modelled stage by stage, for one PEFT adapter.

``run_sglang(folder, n, H, F)`` follows the adapter down sglang's own loading path,
each stage once and recorded (what it produced, or sglang's exact error), and hands
out one frozen ``SglangRun``: ``read``
(``LoRAConfig``, ``LoRAAdapter.__init__``, ``validate_new_adapter``'s DoRA refusal,
the weights files as ``DefaultModelLoader`` finds them), ``normalize`` (docs/reference.md#adapters-on-disk),
``targets`` (``init_lora_shapes``, ``init_lora_modules``: is the sink wrapped, which
weights are skipped), ``shard`` (docs/reference.md#tensor-parallelism), ``pool`` (the buffer load with one
``lora_alpha / r``), ``set_lora_info`` (docs/reference.md#validation-order) and ``forward``. ``config_causes``
says where sglang's reading of a config differs from PEFT's.

The doctor (``doctor.py``) turns a run into its report; ``compare.py`` computes the
served deltas from one. Both import this module, which imports neither.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch
from safetensors import safe_open

from .adapters import (CONFIG_FILE, PROJECTIONS, Adapter, FactorName, module_of, normalize_layer,
                       check_regular, peft_target_parameter_keys, read_peft_config)
from .catalog import Finding, finding, message
from .geometry import SIZE_LIMIT, WORKING_DTYPES
from .pool import LoRAFactors
from .releases import Release, release
from .shard import slice_lora_a, slice_lora_b
from .upstream_defect import doctor_finding, sglang_0_5_23_equivalent_buffers
from .validate import diagnose_pool

STAGES = ("read", "normalize", "targets", "shard", "pool", "set_lora_info", "forward")

SINK_TARGETS = ("gate_up_proj", "down_proj")
"""``init_lora_modules`` (lora_manager.py) wraps the sink only when the server's target
modules hold both."""

_UPSTREAM_TARGET_NAMES = {
    **dict.fromkeys(("q_proj", "k_proj", "v_proj"), "qkv_proj"), **dict.fromkeys(("gate_proj", "up_proj"), "gate_up_proj"),
    **dict.fromkeys(("vocab_emb", "embeddings", "word_embeddings"), "embed_tokens"),
    **dict.fromkeys(("output", "unembed_tokens"), "lm_head"),
    **dict.fromkeys(("q_a_proj", "kv_a_proj_with_mqa"), "fused_qkv_a_proj_with_mqa"),
    "wq_b": "indexer.wq_b", "wk": "indexer.wk", "weights_proj": "indexer.weights_proj"}
"""``get_normalized_target_modules``'s renames (utils.py, the same in every release with the
sink; ``inkling-lab selfcheck`` compares this with a wheel's): note that ``w1``/``w3``/``w2``
are *not* renamed."""


INKLING_LORA_MODULES = ("qkvr", "wo_ud", "gate_up_proj", "down_proj", "embed_tokens", "lm_head")
"""``InklingForConditionalGeneration.supported_lora_modules`` (models/inkling.py, the same in every
release with the sink): the names its ``get_hidden_dim`` answers for; any other target module of the
server raises ``NotImplementedError`` when ``LoRAMemoryPool.init_buffers`` sizes the pool at server
start (ISL-E038)."""

_HIDDEN_DIM = ("models/inkling.py: InklingForConditionalGeneration.get_hidden_dim, from mem_pool.py: "
               "LoRAMemoryPool.init_buffers <- lora_manager.py: LoRAManager.init_memory_pool, at server start")


def unserved_modules(server: Iterable[str]) -> list[str]:
    """The server's target modules (normalized) that Inkling's ``get_hidden_dim`` raises for, sorted
    (``"all"`` resolves to the model's own modules: none of them)."""
    return sorted(set(server) - set(INKLING_LORA_MODULES) - {"all"})


def server_target_modules(targets: Any) -> set[str]:
    """The target modules as sglang normalizes them (``get_normalized_target_modules``,
    utils.py): the last name part, ``gate_proj``/``up_proj`` -> ``gate_up_proj``;
    ``"all"``/``"all-linear"`` -> ``{"all"}``. Raises what it raises: ``ValueError`` for
    another string, Python's own ``TypeError`` for no iterable (``None``, a number) and
    ``AttributeError`` for a name that is no string (it splits each)."""
    if isinstance(targets, str):
        if targets not in ("all", "all-linear"):
            raise ValueError("Only 'all' or 'all-linear' can be used as the string for target module")
        return {"all"}
    return {_UPSTREAM_TARGET_NAMES.get(t.split(".")[-1], t.split(".")[-1]) for t in targets}


def exception_text(exc: BaseException) -> str:
    """An exception as Python prints its last line: ``Type: message`` (the type alone when empty)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _sink_flag(server: Iterable[str]) -> str:
    """The ``--lora-target-modules`` that wraps the sink and keeps every module the server
    already targets (``init_lora_shapes`` refuses a flag that leaves out one of the adapter's
    own, ISL-E034)."""
    return "--lora-target-modules " + " ".join(sorted(set(server) - {"all"} | set(SINK_TARGETS)))


def _skip_fix(skipped: list[str], label: str, server: Iterable[str]) -> str:
    """The way out for the weights that match no target module of sglang (``label``: ``"sglang 0.5.23"``;
    ``server``: its target modules), by what they are."""
    fixes = []
    exported = set(peft_target_parameter_keys(skipped))
    if exported:
        fixes.append(f"a PEFT target_parameters export matches no target module of {label}, whatever "
                     "--lora-target-modules says: inkling-lab export writes its math as an adapter it serves, or "
                     "merge it into the base weights (PEFT merge_and_unload) (ISL-N204)")
    lone_up = {k for k in skipped if ".up_proj." in k or ".w3." in k}
    if lone_up:
        fixes.append("an up_proj needs its gate_proj to be stacked into gate_up_proj (export a zero gate; "
                     "inkling-lab convert stacks a lone up with a zero gate)")
    sink = {k for k in skipped if target_module_of(k, SINK_TARGETS) is not None}
    if sink:  # normalized sink names (w1/w3/w2 renamed) on a server without the sink's targets
        fixes.append(f"start the server with {_sink_flag(server)}")
    if set(skipped) - exported - lone_up - sink:
        fixes.append(f"start the server with every module the adapter trains in --lora-target-modules where "
                     f"Inkling's model serves it ({', '.join(INKLING_LORA_MODULES)}; any other fails its start, "
                     "ISL-E038), and drop the weights of the others")
    return "; ".join(fixes)


_LAYER_ID = re.compile(r"layers\.(\d+)\.")
_EXPERT_INDEX = re.compile(r"experts\.(\d+)\.")
_EMBEDDINGS = ("embed_tokens", "lm_head")

_UNMODELLED_NAMES = ("x_proj", "in_proj_q", "q_a_proj")
"""Name parts that ``LoRAAdapter._normalize_weights`` (lora.py) renames or stacks in steps the
kit does not model (``_normalize_in_proj``, ``_normalize_in_proj_qkvz``,
``normalize_fused_qkv_a_proj``): a weight so named leaves the buffer load's names unknown to
the kit."""


def layer_id(name: str) -> int | None:
    """``get_layer_id`` (layers/utils/common.py): the ``N`` of ``layers.N.``, else ``None``."""
    m = _LAYER_ID.search(name)
    return int(m.group(1)) if m else None


def target_module_of(name: str, targets: Iterable[str]) -> str | None:
    """``get_target_module_name`` (utils.py): the longest target module that is a substring
    of ``name``; ``None`` where upstream raises (no target module is)."""
    best = None
    for t in sorted(targets):
        if t in name and (best is None or len(t) > len(best)):
            best = t
    return best


def targets_text(targets: Iterable[str]) -> str:
    """A set of target modules as Python prints it, its members **sorted** (sglang prints
    its own set in Python's string-hash order, which changes from process to process)."""
    members = sorted(targets)
    return "{" + ", ".join(map(repr, members)) + "}" if members else "set()"


def skipped_weights(names: Iterable[str], targets: Iterable[str]) -> list[str]:
    """The weights ``load_lora_weight_to_buffer``'s pre-validation counts in its skip warning
    (``ISL-W002``): those of ``names`` (every layer's, then the embedding ones) that hold no
    target module, sorted as the warning prints them."""
    targets = set(targets)
    return sorted({k for k in names if target_module_of(k, targets) is None})


@dataclass(frozen=True)
class NameCheck:
    """How ``load_lora_weight_to_buffer``'s loop over the weight names of each layer (then
    of the embedding weights) ends: ``text`` (``Type: message``) of its first error, its
    catalog ``code`` and the weight ``name`` it names, in ``layer`` (``None``: among the
    embedding weights), or ``unknown`` (why the kit cannot tell); ``text == unknown == ""``:
    every name passes."""

    text: str = ""
    layer: int | None = None
    unknown: str = ""
    code: str = ""
    name: str = ""


def check_buffer_names(layers: Mapping[int, Mapping[str, torch.Tensor]], embedding: Sequence[str],
                       targets: Iterable[str], wrapped: bool, sglang: str | Release | None = None) -> NameCheck:
    """The name checks of ``LoRAMemoryPool.load_lora_weight_to_buffer`` (mem_pool.py), in its
    order: ``layers`` (layer id -> the adapter's normalized weights of that layer, in
    ``LoRALayer.weights`` order) from layer 0 up, each name through ``get_target_module_name``
    (utils.py), which raises for a name that holds no target module (``ISL-E036``: the
    weights the skip warning, ``ISL-W002``, counted are still there); in 0.5.23 an indexed
    shared-expert weight (``shared_experts.<e>.``) that is not 3D, on a layer whose sink is
    not wrapped (``wrapped`` false: no shared-MoE buffer), raises ``ISL-E037``, where older
    releases file it with the routed experts (``experts.<e>.`` matches), which are then not
    wrapped either; an indexed weight filed in a buffer the pool does not have is a ``KeyError``
    (``<target>_shared_moe`` exists for a wrapped sink's two targets only, ``<target>_moe`` for
    ``gate_up_proj``/``down_proj`` only, the base model having routed experts); then the ``embedding`` weights (``embed_tokens``/
    ``lm_head``, in order).
    ``targets``: the pool's target modules (``"all"`` is not modelled: resolve it first).
    The error texts print the target set sorted (see ``targets_text``)."""
    targets = set(targets)
    indexed_refused = release(sglang).raises_code("ISL-E037")
    for lid in sorted(layers):
        for name, t in layers[lid].items():
            target = target_module_of(name, targets)
            if target is None:
                return NameCheck("ValueError: " + message("ISL-E036", name=name, targets=targets_text(targets)), lid,
                                 code="ISL-E036", name=name)
            shared, indexed = "shared_experts." in name, _EXPERT_INDEX.search(name) is not None
            has_buffer = wrapped and target in SINK_TARGETS  # <target>_shared_moe: a wrapped sink's two targets only
            if shared and (t.dim() == 3 or has_buffer):  # the sink's own branch
                if indexed and not has_buffer:  # it files an indexed weight in that buffer's dict of experts
                    return NameCheck(f"KeyError: '{target}_shared_moe'", lid, name=name)
                continue
            if not indexed:
                continue  # the standard branch (or a routed shared-outer 3D weight): stored, no check
            if shared and indexed_refused:
                return NameCheck("ValueError: " + message("ISL-E037", name=repr(name), layer=lid), lid,
                                 code="ISL-E037", name=name)
            if target not in SINK_TARGETS:  # the routed branch reads <target>_moe, a buffer made for these two only
                return NameCheck(f"KeyError: '{target}_moe'", lid, name=name)
    for i, name in enumerate(embedding):
        if target_module_of(name, targets) is None:
            if i:
                return NameCheck(unknown=f"{embedding[0]} loads before {name} (which matches no target module): "
                                 "the kit does not model loading embed_tokens/lm_head LoRA weights")
            return NameCheck("ValueError: " + message("ISL-E036", name=name, targets=targets_text(targets)),
                             code="ISL-E036", name=name)
    return NameCheck()


# -- the sglang path -------------------------------------------------------------------

@dataclass(frozen=True)
class SglangRaise:
    """Where sglang raises: ``text`` as it prints, in ``stage``, from ``upstream``
    (its file and function); ``finding`` where the kit can say more."""

    stage: str
    text: str
    upstream: str
    finding: Finding | None = None
    note: str = ""
    """Where the text is not sglang's to the letter, and how (``SORTED_NOTE``)."""


SORTED_NOTE = ("the target set is shown sorted: sglang prints it in Python's string-hash order, which changes from "
               "process to process")


class _Raised(Exception):
    """sglang raises here (carries the ``SglangRaise``)."""

    def __init__(self, stage: str, text: str, upstream: str, finding: Finding | None = None, note: str = "") -> None:
        super().__init__(text)
        self.record = SglangRaise(stage, text, upstream, finding, note)


@dataclass(frozen=True)
class SglangRun:
    """What an sglang release's loading path did with one adapter, stage by stage.

    ``raised``: where it stopped with an error (``None``: it loads). ``unknown``: why
    the kit cannot tell the rest (a pickle file, a factor it does not model). ``stages``:
    each stage's record. ``config``/``weights``: what it read. ``server``: the target
    modules as it normalizes them; ``wrapped``: whether it wraps the sink; ``base_only``:
    the sink serves the base model. ``skip_warning``: its warning for weights it skips.
    ``loaded``: per module, the factors the pool slot holds (float64, B times sglang's
    scaling); ``served``: per module of a wrapped sink, the factors whose intended math
    is what sglang computes (``loaded``, through the per-expert defect's equivalent
    buffers where ``O = n``). ``findings``/``causes``: what it does other than the
    adapter's math. ``release``: the release modelled (``releases.Release``).
    """

    stages: tuple[dict[str, Any], ...]
    config: Mapping[str, Any]
    weights: Mapping[str, torch.Tensor]
    server: frozenset[str]
    wrapped: bool
    base_only: bool
    skip_warning: str
    unknown: str
    loaded: Mapping[str, LoRAFactors]
    served: Mapping[str, LoRAFactors]
    findings: tuple[Finding, ...]
    causes: tuple[str, ...]
    raised: SglangRaise | None = None
    release: Release | None = None


def _shapes_of(t: Any) -> Any:
    """A factor's shape for the record: a tensor's, per expert for a dict, None when absent."""
    if t is None:
        return None
    if isinstance(t, dict):
        return {e: list(w.shape) for e, w in t.items()}
    return list(t.shape)


def _torch_size(shape: Sequence[int]) -> str:
    return f"torch.Size([{', '.join(str(int(d)) for d in shape)}])"


class _Sglang:
    """One adapter folder down the loading path of sglang ``release`` (``releases.Release``).
    Each stage method runs once, appends its record to ``stages`` and raises ``_Raised``
    where sglang raises."""

    def __init__(self, folder: Path, n: int, hidden: int, intermediate: int, tp: int, max_rank: int | None,
                 cli_targets: Sequence[str] | None, name: str, sglang: Release, tp_rank: int = 0) -> None:
        self.release, self.label = sglang, sglang.label
        self.folder, self.n, self.H, self.F, self.tp, self.tp_rank = folder, n, hidden, intermediate, tp, tp_rank
        self.max_rank, self.cli_targets, self.name = max_rank, cli_targets, name
        self.stages: list[dict[str, Any]] = []
        self.findings: list[Finding] = []
        self.causes: list[str] = []
        self.config: dict[str, Any] = {}
        self.weights: dict[str, torch.Tensor] = {}
        self.skip_warning = ""
        self.wrapped = True
        self.base_only = False
        self.unknown = ""
        self.server: set[str] = set()
        self.normalized: dict[str, torch.Tensor] = {}
        """The normalized weights under ``shared_experts.``, layer by layer."""
        self.layers: dict[int | None, dict[str, torch.Tensor]] = {}
        """Layer id -> that ``LoRALayer``'s weights as normalized, in upstream's order (``None``: sink keys
        without a layer id, which the kit reads as they are)."""
        self.embedding: list[str] = []
        """The ``embed_tokens``/``lm_head`` weights that ``_process_weight`` keeps, in order."""
        self.name_error = NameCheck()
        """Where the buffer load's name checks fail (``check_buffer_names``)."""
        self.skipped: list[str] = []
        """The weights the skip warning names, sorted as it prints them."""
        """Where the buffer load's name checks fail (``check_buffer_names``)."""
        self.factors: dict[str, dict[tuple[str, str], Any]] = {}
        """Per module, (projection, A or B) -> the normalized factor: a tensor, a dict by expert, or None."""
        self.loaded: dict[str, LoRAFactors] = {}
        self.served: dict[str, LoRAFactors] = {}
        self.scaling = 0.0
        self.r = 0

    def run(self, state: Adapter | None) -> SglangRun:
        """Every stage, each once, until one raises or the kit cannot tell the rest."""
        raised = None
        try:
            if state is None:
                self.read()
            else:
                self.config, self.weights = dict(state.config), dict(state.weights)
                self.check_config()
                self.record("read", config="in memory", tensors=len(self.weights), r=self.r, scaling=self.scaling)
            for stage in (self.normalize, self.targets, self.assemble, self.shard, self.load_pool,
                          self.check_and_forward):
                if self.unknown:
                    break
                stage()
            if self.unknown and not any(st["stage"] == "targets" for st in self.stages):
                # stopped before the targets stage: the server's modules as they would be normalized
                try:
                    self.server = server_target_modules(self.cli_targets if self.cli_targets is not None
                                                        else self.config.get("target_modules"))
                except (TypeError, AttributeError, ValueError):
                    self.server = set()  # modules sglang cannot normalize: it targets none the kit can name
        except _Raised as exc:
            raised = exc.record
            self.record(raised.stage, error=raised.text, upstream=raised.upstream)
        return SglangRun(tuple(self.stages), self.config, self.weights, frozenset(self.server), self.wrapped,
                         self.base_only, self.skip_warning, self.unknown, dict(self.loaded), dict(self.served),
                         tuple(self.findings), tuple(self.causes), raised, self.release)

    def record(self, stage: str, **produced: Any) -> None:
        self.stages.append({"stage": stage, **produced})

    # 1. read -----------------------------------------------------------------------
    def read(self) -> None:
        config_path = self.folder / CONFIG_FILE
        for path in (config_path, *sorted(self.folder.glob("*.safetensors"))):
            try:  # never opened by the kit: a FIFO would block this read (and sglang's) forever
                check_regular(path)
            except ValueError as exc:
                self.unknown = (f"{exc}; {self.label} opens it as it is (a FIFO blocks its read until a writer "
                                "appears)")
                return
        if not config_path.is_file():
            subs = sorted(p.parent.name for p in self.folder.glob(f"*/{CONFIG_FILE}")) if self.folder.is_dir() else []
            text = f"FileNotFoundError: [Errno 2] No such file or directory: '{os.path.join(str(self.folder), CONFIG_FILE)}'"
            named = None
            if subs:
                named = finding(
                    "ISL-K311", CONFIG_FILE, fix="point sglang and the kit at one of them: " + "; ".join(
                        f"inkling-lab doctor {self.folder / s}" for s in subs[:3]), more=True,
                    file=f"{self.folder.name}/{CONFIG_FILE}", names=", ".join(subs),
                    folder=f"{self.folder.name}/{subs[0]}")
            raise _Raised("read", text, "lora_config.py: LoRAConfig.get_lora_config (open)", named)
        try:
            self.config = json.loads(config_path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as exc:  # sglang's json.load raises these (a 5000-digit int too)
            raise _Raised("read", exception_text(exc), "lora_config.py: LoRAConfig.get_lora_config (json.load)") from None
        self.check_config()
        self.read_weights()

    def check_config(self) -> None:
        """``LoRAConfig.__init__``, ``validate_new_adapter`` and ``LoRAAdapter.__init__``, literally."""
        where = "lora_config.py: LoRAConfig.__init__"
        cfg = self.config
        try:
            if not isinstance(cfg, dict):
                cfg["target_modules"]  # noqa: B018 - what sglang evaluates, for its exact error
            for key in ("target_modules", "r", "lora_alpha"):  # LoRAConfig.__init__ reads these, in this order
                cfg[key]  # noqa: B018
        except (KeyError, TypeError) as exc:
            raise _Raised("read", exception_text(exc), where) from None
        if cfg.get("use_dora", False):
            raise _Raised("read", "ValueError: " + message("ISL-E025", name=self.name),
                          "lora_manager.py: LoRAManager.validate_new_adapter")
        try:  # LoRAAdapter.__init__, literally
            assert cfg["peft_type"].lower() == "lora"  # noqa: S101 - the exact upstream check
            self.scaling = cfg["lora_alpha"] / cfg["r"]
        except (AssertionError, KeyError, AttributeError, TypeError, ZeroDivisionError) as exc:
            raise _Raised("read", exception_text(exc), "lora.py: LoRAAdapter.__init__") from None
        self.r = cfg["r"]
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            # buffers sized by a rank that is no positive integer: torch's allocation, not modelled here
            self.unknown = (f"r is {self.r!r}: the kit does not model what {self.label}'s buffers of that rank do "
                            "(the kit refuses it: ISL-K202)")

    def read_weights(self) -> None:
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            pickles = sorted(self.folder.glob("*.bin")) or sorted(self.folder.glob("*.pt"))
            if not pickles:
                raise _Raised("read", "RuntimeError: " + message("ISL-E031", path=self.folder),
                              "model_loader/loader.py: DefaultModelLoader._prepare_weights")
            self.unknown = (f"sglang reads {', '.join(p.name for p in pickles)} with torch.load(weights_only=True); "
                            "the kit never unpickles, so it cannot see what that holds")
            self.record("read", config=CONFIG_FILE, weights=[p.name for p in pickles], read_by="torch.load")
            return
        for path in files:  # every *.safetensors of the folder, as safetensors_weights_iterator reads them
            try:
                with safe_open(str(path), framework="pt") as f:
                    for key in f.keys():
                        self.weights[key] = f.get_tensor(key)
            except Exception as exc:  # noqa: BLE001 - the library's own error is the verdict
                raise _Raised("read", exception_text(exc),
                              "model_loader/weight_utils.py: safetensors_weights_iterator (safe_open)") from None
        biases = [k for k in self.weights if "shared_experts." in k and k.endswith("lora_B.bias")]
        if biases:
            self.unknown = (f"{len(biases)} lora_B.bias tensor(s) (lora_bias): {self.label} has no LoRA bias and "
                            "routes them like B weights in load_lora_weight_to_buffer; the kit does not model where "
                            "they land")
        self.record("read", config=CONFIG_FILE, weights=[p.name for p in files], r=self.r,
                    lora_alpha=self.config["lora_alpha"], scaling=self.scaling, tensors=len(self.weights))

    # 2. normalize ------------------------------------------------------------------
    def normalize(self) -> None:
        sink = {k: v for k, v in self.weights.items() if (fn := FactorName.parse(k)) and fn.proj in PROJECTIONS}
        # other keys under shared_experts (a misspelt projection, a bias) pass the sink's reshape untouched
        others = {k: v for k, v in self.weights.items() if "shared_experts." in k and k not in sink}
        self._duplicates(sink)
        odd = sorted({str(t.dtype).removeprefix("torch.") for t in sink.values() if t.dtype not in WORKING_DTYPES})
        if odd:  # integers are cast by its buffer copies, float8 fails its scaling: not modelled (ISL-K230)
            self.unknown = (f"factors of dtype {', '.join(odd)}: the kit does not model how {self.label} scales "
                            "and casts them")
            return
        if any(t.dim() != 2 and FactorName.parse(k).canonical != "down_proj" for k, t in sink.items()):
            # upstream's reshape skips it, then torch.cat stacks it with its partner along dim() - 2
            self.unknown = "a gate/up factor that is not 2D: the kit does not model how upstream stacks it"
            return
        # _process_weight (lora.py): a weight with a layer id goes to that LoRALayer, in the files' order; an
        # embed_tokens/lm_head one to embedding_layers where the adapter targets it; any other is not kept
        by_layer: dict[int | None, dict[str, torch.Tensor]] = {}
        try:
            own = server_target_modules(self.config.get("target_modules"))
        except (TypeError, AttributeError, ValueError):
            own = set()  # no target module sglang can normalize: the targets stage raises its error
        for key, t in self.weights.items():
            name = key.replace("unembed_tokens", "lm_head")
            lid = layer_id(name)
            if lid is not None or key in sink or key in others:  # a sink key without a layer id: as the kit reads it
                by_layer.setdefault(lid, {})[name] = t
            elif any(e in name for e in _EMBEDDINGS) and ("all" in own or any(e in name and e in own
                                                                                for e in _EMBEDDINGS)):
                self.embedding.append(name)
        unmodelled = sorted(k for lid, layer in by_layer.items() if lid is not None for k in layer
                            if any(part in k for part in _UNMODELLED_NAMES))
        if unmodelled:
            self.unknown = (f"{unmodelled[0]}" + (f" and {len(unmodelled) - 1} more" if len(unmodelled) > 1 else "")
                            + f": {self.label}'s _normalize_weights (lora.py) renames or stacks such weights in steps "
                            "the kit does not model, so it cannot tell which names its buffer load checks")
            return
        try:  # layer by layer, from layer 0, as _normalize_weights walks self.layers
            self.layers = {lid: normalize_layer(layer, self.n, self.r)
                           for lid, layer in sorted(by_layer.items(), key=lambda item: (item[0] is None, item[0] or 0))}
        except (RuntimeError, KeyError, IndexError) as exc:
            raise _Raised("normalize", exception_text(exc), "lora.py: LoRAAdapter._normalize_weights (normalize_qkv_proj, "
                          "_normalize_shared_expert_moe, normalize_gate_up_proj)") from None
        self.normalized = {k: t for layer in self.layers.values() for k, t in layer.items() if "shared_experts." in k}
        self.record("normalize", shapes={k: list(t.shape) for k, t in self.normalized.items()})

    def _duplicates(self, sink: dict[str, torch.Tensor]) -> None:
        groups: dict[tuple, list[FactorName]] = {}
        for key in sink:
            fn = FactorName.parse(key)
            groups.setdefault((fn.module, fn.expert, fn.canonical, fn.ab), []).append(fn)
        for names in groups.values():
            if len(names) < 2:
                continue
            w_named = [fn for fn in names if fn.proj in ("w1", "w3", "w2")]
            if w_named and len(w_named) < len(names):
                kept, how = w_named[-1], "lora.py: LoRAAdapter._rename_expert_w_to_proj renames it over the other"
            else:
                kept, how = sorted(names, key=lambda f: f.key)[-1], (
                    "mem_pool.py: load_lora_weight_to_buffer files experts by int(index), the later key replaces "
                    "the earlier")
            dropped = [fn.key for fn in names if fn is not kept]
            self.causes.append(f"two keys for one factor: it serves {kept.key} and drops {', '.join(dropped)}")
            self.findings.append(finding(
                "ISL-W106", kept.key, fix="keep one key per factor", more=True,
                consequence="which factor was trained is not in the file",
                keys=" and ".join(fn.key for fn in names), kept=kept.key, how=how, release=self.release.version))

    # 3. targets --------------------------------------------------------------------
    def targets(self) -> None:
        adapter_targets = self.config["target_modules"]
        where = "lora_manager.py: LoRAManager.init_lora_shapes"
        if isinstance(adapter_targets, str) and adapter_targets not in ("all", "all-linear"):
            raise _Raised("targets", "ValueError: " + message("ISL-E032", target_modules=adapter_targets), where)
        if not isinstance(adapter_targets, (str, list)):
            raise _Raised("targets", "ValueError: " + message("ISL-E033"), where)
        try:
            if self.cli_targets is not None:
                server = server_target_modules(self.cli_targets)
                if "all" not in server and not isinstance(adapter_targets, str):
                    own = server_target_modules(adapter_targets)
                    if not own <= server:
                        raise _Raised("targets", "ValueError: " + message(
                            "ISL-E034", name=self.name, unsupported=sorted(own - server), server=sorted(server),
                            required=sorted(server | own)), where)
            else:
                server = server_target_modules(adapter_targets)
        except (TypeError, AttributeError) as exc:  # a name that is no string: its split fails, as upstream's does
            raise _Raised("targets", exception_text(exc), where + " (utils.py: get_normalized_target_modules)") from None
        self.server = server
        unserved = unserved_modules(server) if self.release.raises_code("ISL-E038") else []
        if unserved:  # init_state sizes the pool right after init_lora_shapes: the server does not start
            raise _Raised("targets", "NotImplementedError: " + message("ISL-E038", module_name=unserved[0]),
                          _HIDDEN_DIM, self._unserved_finding(unserved, adapter_targets),
                          "" if len(unserved) == 1 else
                          f"of {', '.join(unserved)}, the first sorted: sglang names the first in its set's "
                          "string-hash order, which changes from process to process")
        self.wrapped = "all" in server or all(t in server for t in SINK_TARGETS)
        names = [k for lid, layer in self.layers.items() if lid is not None for k in layer] + self.embedding
        # "all" resolves to the base model's own module names (auto_detect_lora_target_modules): not modelled
        skipped = skipped_weights(names, server) if "all" not in server else []
        check = NameCheck() if "all" in server else check_buffer_names(
            {lid: layer for lid, layer in self.layers.items() if lid is not None}, self.embedding, server,
            self.wrapped, self.release)
        if check.unknown:
            self.unknown = check.unknown
        elif check.text:
            self.name_error = check
        loose = [k for k in names if target_module_of(k, SINK_TARGETS) is None and not any(e in k for e in _EMBEDDINGS)]
        if "all" in server and loose:  # only the FusedMoE targets (and the embedding ones) are sure to be among them
            self.unknown = (f"{loose[0]}" + (f" and {len(loose) - 1} more" if len(loose) > 1 else "") + ": 'all' "
                            "resolves to the base model's own module names (utils.py: auto_detect_lora_target_modules), "
                            "which the kit does not read; a weight that holds none of them fails the buffer load "
                            "(ISL-E036)")
        fails = (f"{self.label} fails the buffer load when a batch first uses the adapter (verdict 1)"
                 if check.text else "")
        if not self.wrapped:
            self.base_only = True
            missing = [t for t in SINK_TARGETS if t not in server]
            self.causes.append(f"the server's target modules {sorted(server)} lack {' and '.join(missing)}, so "
                               "init_lora_modules never wraps the shared sink: its factors load and are never applied")
            sink = [k for k in self.normalized if "shared_experts" in k]
            exported = bool(sink) and len(peft_target_parameter_keys(sink)) == len(sink)
            self.findings.append(finding(
                "ISL-W103", "target_modules", fix=(
                    f"no --lora-target-modules makes {self.label} serve it: a PEFT target_parameters export's keys "
                    "match no target module whatever the flag, and its buffer load fails on them (ISL-E036); "
                    "inkling-lab export writes the same math under the sink's own names, or merge it into the "
                    "base weights (PEFT merge_and_unload)" if exported else
                    f"serve with {_sink_flag(server)} (or list gate_proj, up_proj and down_proj in "
                    "target_modules; w1/w3/w2 are not renamed there)"), more=True,
                consequence=fails or "requests with this adapter get the base model's sink output",
                targets=sorted(server), missing=", ".join(missing), release=self.release.version))
        if skipped:
            skip = finding("ISL-W002", "target_modules", fix=_skip_fix(skipped, self.label, server), more=True,
                           consequence=(f"{self.label} logs this warning when a batch first uses the adapter, keeps "
                                        "these weights and then fails its buffer load on one of them (ISL-E036); with "
                                        "--lora-strict-loading this text is the ValueError instead (ISL-E027)"),
                           uid="<lora id>", count=len(skipped), targets=sorted(server), names=skipped)
            self.skip_warning, self.skipped = skip.message, skipped
            self.findings.append(skip)
        self.record("targets", server=sorted(server), wraps_sink=self.wrapped, skipped=skipped)

    # 4. shard and 5. pool ----------------------------------------------------------
    def assemble(self) -> None:
        """The factors as sglang's buffers receive them, per module: nothing repaired."""
        for module in dict.fromkeys(fn.module for k in self.normalized
                                    if (fn := FactorName.parse(k)) and fn.proj in PROJECTIONS):
            parts = {}
            for proj in ("gate_up_proj", "down_proj"):
                for ab in "AB":
                    parts[proj, ab] = self._gather(module, proj, ab)
            self.factors[module] = parts  # type: ignore[assignment]
            self._unpaired(module)

    def _unpaired(self, module: str) -> None:
        parts = self.factors[module]
        for proj in ("gate_up_proj", "down_proj"):
            have = [ab for ab in "AB" if parts[proj, ab] is not None]
            if len(have) == 1:
                lacks = "B" if have == ["A"] else "A"
                self.causes.append(f"{module}: {proj}.lora_{have[0]} has no lora_{lacks}: sglang zero-fills the "
                                   f"missing buffer, so that projection adds nothing")

    def _gather(self, module: str, proj: str, ab: str) -> Any:
        shared = self.normalized.get(FactorName(module, None, proj, ab).key)
        per = {fn.expert: t for k, t in self.normalized.items()
               if (fn := FactorName.parse(k)) and fn.expert is not None and fn.with_(expert=None).key ==
               FactorName(module, None, proj, ab).key}
        return shared if not per else per

    def shard(self) -> None:
        """Tensor-parallel rank ``tp_rank``'s share (``slice_moe_lora_{a,b}_weights``,
        docs/reference.md#tensor-parallelism), on the dicts and 3D tensors as they stand."""
        for module, parts in self.factors.items():
            if self.tp > 1 and not self._preempted(module):
                try:
                    for (proj, ab), cut in ((("gate_up_proj", "A"), slice_lora_a), (("gate_up_proj", "B"), slice_lora_b),
                                            (("down_proj", "A"), slice_lora_a), (("down_proj", "B"), slice_lora_b)):
                        if parts[proj, ab] is not None:
                            parts[proj, ab] = cut(parts[proj, ab], self.tp_rank, proj, self.tp, self.n,
                                                   intermediate_size=self.F)
                except (ValueError, RuntimeError) as exc:  # the kit refuses what upstream cuts unchecked
                    self.unknown = f"tensor-parallel slicing of factors that do not split over tp={self.tp} ({exc})"
                    return
        self.record("shard", tp=self.tp, rank=self.tp_rank, shapes={
            m: {f"{proj}.lora_{ab}": _shapes_of(t) for (proj, ab), t in parts.items()} for m, parts in self.factors.items()})

    def load_pool(self) -> None:
        """``load_lora_weight_to_buffer``'s shape asserts, on buffers of sglang's shapes,
        and the factors as they land (B times ``lora_alpha / r`` in the stored dtype)."""
        H, F, r = self.H, self.F // self.tp, self.r
        R = self.max_rank if self.max_rank is not None else r
        # init_buffers allocates the pool at startup, before any adapter loads: its size comes first
        largest = max(2 * R * H, self.n * 2 * F * R)  # one slot of one layer: gate-up A [1, 1, 2R, H], B [1, n, 2F, R]
        if largest > SIZE_LIMIT:
            self.unknown = (
                f"at --max-lora-rank {R}, H={H} and F={F} (per rank) the shared sink's largest pool buffer holds "
                f"{largest} values per slot and "
                f"layer ({largest * 2 / 2 ** 30:.3g} GiB in bfloat16), which {self.label} allocates at startup, before "
                "any adapter loads (mem_pool.py: LoRAMemoryPool.init_buffers, torch.zeros per layer in the model's "
                "dtype on its GPU; it bounds nothing): past the kit's bound (ISL-K164), the kit cannot tell whether "
                "the GPU holds it (where not, the server fails at startup with torch's out-of-memory error)")
            return
        loaded: dict[str, LoRAFactors] = {}
        shared_outer = self._shared_outer()
        for module, parts in sorted(self.factors.items(), key=lambda item: _layer_order(item[0])):  # from layer 0
            if self._preempted(module):
                break  # this layer's name checks fail before its buffers are touched
            ga, gb, da, db = (parts[p] for p in (("gate_up_proj", "A"), ("gate_up_proj", "B"),
                                                ("down_proj", "A"), ("down_proj", "B")))
            if any(isinstance(t, torch.Tensor) and t.dim() != 3 for t in (ga, gb, da, db)):
                # which buffer such a weight is routed to depends on the wrapped module (is_shared_fused_moe)
                self.unknown = f"{module}: a factor that is neither 2D nor 3D reaches the buffer load; not modelled"
                return
            if shared_outer and db is not None and len(db) != 1:  # a dict of experts, or a 3D tensor's rows
                text = (message("ISL-E035", factor="down_proj_moe lora_B", count=len(db)) if isinstance(db, dict)
                        else message("ISL-E015", factor="down_proj_moe lora_B", k=len(db)))
                raise _Raised("pool", f"ValueError: {text}", "mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer")
            ga, gb, da, db = (self._per_expert(t) for t in (ga, gb, da, db))
            for name, t in (("gate_up_a", ga), ("down_a", da), ("gate_up_b", gb), ("down_b", db)):
                for view, w in self._views(name, t, shared_outer, r, R, H, F):
                    if tuple(view) != tuple(w):
                        raise _Raised("pool", "AssertionError: " + message(
                            "ISL-E016", buffer_shape=_torch_size(view), weight_shape=_torch_size(w)),
                            "mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer")
            loaded[module] = self._landed(module, ga, gb, da, db, shared_outer)
        if self.name_error.text:
            raise _Raised("pool", self.name_error.text, _NAME_CHECK, self._name_finding(),
                          SORTED_NOTE if self.name_error.code == "ISL-E036" else "")
        self.loaded = loaded
        self.record("pool", max_rank=R, lora_rank=r, scaling=self.scaling,
                    modules={m: {k: list(t.shape) for k, t in f.tensors().items()} for m, f in loaded.items()})

    def _preempted(self, module: str) -> bool:
        """Whether the buffer load's name checks fail before it reaches ``module``: they fail in
        a layer at or before the module's (each layer's names are checked before its buffers)."""
        failed = self.name_error
        return bool(failed.text) and failed.layer is not None and _layer_order(module) >= failed.layer

    def _unserved_finding(self, unserved: list[str], adapter_targets: Any) -> Finding:
        """The way out of ``ISL-E038``: the adapter's own names, or the flag's, by which of them holds
        the unserved modules (a flag must keep the adapter's own, ISL-E034)."""
        own = set() if isinstance(adapter_targets, str) else server_target_modules(adapter_targets)
        if set(unserved) & own:
            fix = (f"name only {', '.join(INKLING_LORA_MODULES)} in the adapter's target_modules (gate_proj and "
                   f"up_proj stay; {self.label}'s Inkling model has no LoRA for {', '.join(sorted(set(unserved) & own))}), "
                   "and no other in --lora-target-modules")
        else:
            keep = (self.server - {"all"} - set(unserved)) | own | set(SINK_TARGETS)
            fix = f"start the server with --lora-target-modules {' '.join(sorted(keep))}"
        return finding("ISL-E038", "target_modules", fix=fix, upstream=True, more=True, module_name=unserved[0])

    def _name_finding(self) -> Finding:
        """The way out of the buffer load's name error (``ISL-E036``, ``ISL-E037``)."""
        failed = self.name_error
        if failed.code == "ISL-E036":
            return finding("ISL-E036", failed.name, fix=_skip_fix(self.skipped or [failed.name], self.label, self.server),
                           upstream=True, more=True, name=failed.name, targets=targets_text(self.server),
                           consequence=f"{self.label} raises it when a batch first uses the adapter; {SORTED_NOTE}")
        return finding("ISL-E037", failed.name, fix=(
            f"serve with {_sink_flag(self.server)}, so that the sink is wrapped and takes its per-expert factors"),
            upstream=True, more=True, name=repr(failed.name), layer=failed.layer)

    @staticmethod
    def _views(name: str, t: torch.Tensor | None, shared_outer: bool, r: int, R: int, H: int, F: int
               ) -> list[tuple[torch.Size, torch.Size]]:
        """``(buffer view shape, weight shape)`` pairs that ``load_lora_weight_to_buffer``
        asserts equal, in its order: the slot's views are cut at the config's ``r``
        (``lora_rank``) inside buffers of max rank ``R``; gate-up A's halves at ``R``
        offsets, each weight half cut at ``r`` rows."""
        if t is None:
            return []
        buf = {"gate_up_a": (2 * R, H), "down_a": (R, F), "gate_up_b": (2 * F, R), "down_b": (H, R)}[name]
        view = torch.empty(buf, device="meta")
        if name == "gate_up_a" and shared_outer:  # one representative weight, checked whole
            return [(view[: 2 * r].shape, t[0].shape)]
        if name == "gate_up_a":
            return [(view[c * R: c * R + r].shape, w[c * r:(c + 1) * r].shape) for w in t for c in range(2)]
        if name == "down_a":
            return [(view[:r].shape, w[:r].shape) for w in t]
        return [(view[:, :r].shape, w.shape) for w in t]

    def _per_expert(self, t: Any) -> torch.Tensor | list[torch.Tensor] | None:
        """One weight per expert: a 3D tensor as is, a per-expert dict as the list over
        experts ``0..n-1`` (absent experts zero, as the zeroed buffer leaves them; each
        is checked against its own buffer view, so their shapes may differ here)."""
        if t is None or isinstance(t, torch.Tensor):
            return t
        if any(e >= self.n for e in t):
            self.unknown = f"per-expert factors for experts {sorted(t)} of a sink of n={self.n}"
        first = next(iter(t.values()))
        return [t.get(e, torch.zeros_like(first)) for e in range(self.n)]

    def _shared_outer(self) -> bool:
        """``LoRAManager._detect_shared_outer_loras`` (lora_manager.py): the pool is shared
        outer when the gate-up A factors are 3D with one expert; per expert when they are
        named per expert, or when there is no gate-up A at all; mixed ones raise."""
        kinds = set()
        for parts in self.factors.values():
            ga = parts["gate_up_proj", "A"]
            if isinstance(ga, torch.Tensor) and ga.dim() == 3:
                kinds.add(ga.shape[0] == 1)
            elif isinstance(ga, dict):
                kinds.add(False)
        if len(kinds) > 1:
            raise _Raised("pool", "RuntimeError: " + message("ISL-E028", adapter="<lora id>"),
                          "lora_manager.py: LoRAManager._detect_shared_outer_loras")
        return kinds == {True}

    def _landed(self, module: str, ga: Any, gb: Any, da: Any, db: Any, shared_outer: bool) -> LoRAFactors:
        """What the slot holds, as kit factors ``[O, 2r, H]``...: missing factors zero; in
        a per-expert pool a 3D down B of one expert fills expert 0 only
        (``_iter_local_expert_weights`` yields one expert per row)."""
        r, n, H, F = self.r, self.n, self.H, self.F // self.tp
        # what the buffer views took: gate-up A's rows 0..2r-1 (a per-expert one is cut, not checked, at r
        # rows per half) and down A's rows 0..r-1 (cut, not checked); the B factors were checked whole
        stack = lambda ws, cut: torch.stack([w[:cut] for w in ws]) if ws is not None else None  # noqa: E731
        ga, gb, da, db = stack(ga, 2 * r), stack(gb, None), stack(da, r), stack(db, None)
        like = next(t for t in (ga, gb, da, db) if t is not None)
        zeros = lambda *s: torch.zeros(*s, dtype=like.dtype)  # noqa: E731
        O = 1 if shared_outer else n
        ga = ga if ga is not None else zeros(O, 2 * r, H)
        gb = gb if gb is not None else zeros(n, 2 * F, r)
        da = da if da is not None else zeros(n, r, F)
        db = db if db is not None else zeros(O, H, r)
        if db.shape[0] < O:
            self.causes.append(f"{module}: down B is shared but the pool is per expert (its gate-up A "
                               + ("is named per expert" if ga.any() else "is absent") +
                               "): sglang fills down B into expert 0 only, the other experts' down deltas are zero")
            db = torch.cat([db, zeros(O - db.shape[0], *db.shape[1:])])
        # B times the scaling in the adapter's stored dtype, then cast (mem_pool.py): so a bf16 adapter
        # carries bf16 rounding of scaling * B, as sglang serves it.
        scale = lambda b: (b * self.scaling).double()  # noqa: E731
        return LoRAFactors(ga.double(), scale(gb), da.double(), scale(db), lora_alpha=float(da.shape[-2]), name=module)

    # 6. set_lora_info, 7. forward ---------------------------------------------------
    def check_and_forward(self) -> None:
        codes: list[str] = []
        for module, f in self.loaded.items():
            g = LoRAFactors(f.gate_up_a.float(), f.gate_up_b.float(), f.down_a.float(), f.down_b.float(),
                            lora_alpha=f.lora_alpha)
            from .pool import LoRAPool

            pool = LoRAPool(self.n, self.H, self.F // self.tp, 1, max(self.r, 1), outer=f.outer)
            if all(torch.isfinite(t).all() for t in f.tensors().values()):
                pool.load(0, g)  # sglang's buffers hold exactly these (they were checked against its views)
            codes += diagnose_pool(*pool.buffers(), n_shared_experts=self.n).codes
        self.record("set_lora_info", passes=not [c for c in codes if c.startswith("ISL-E")], codes=codes)
        nan = [m for m, f in self.loaded.items() if not all(torch.isfinite(t).all() for t in f.tensors().values())]
        if not math.isfinite(self.scaling) or nan:
            what = (f"the scaling lora_alpha / r = {self.config['lora_alpha']} / {self.r} is {self.scaling}"
                    if not math.isfinite(self.scaling) else f"{', '.join(nan)} holds NaN/Inf factors")
            self.causes.append(what + ": every output of the slot is NaN")
            self.findings.append(finding(
                "ISL-W105", "adapter", fix="re-export the adapter from a finite checkpoint; inkling-lab convert "
                "refuses it (ISL-K301/K302/K160)", more=True, what=what, release=self.release.version))
        # A module with NaN/Inf factors (in float32, where the defect is measured) is all NaN already
        # (W105 above): there is no defect left to measure in it.
        per_expert = {m: f for m, f in self.loaded.items() if f.outer > 1 and f.gate_up_a.any()
                      and m not in nan and all(torch.isfinite(t.float()).all() for t in f.tensors().values())}
        if per_expert and self.wrapped:
            defect = doctor_finding({m: LoRAFactors(f.gate_up_a.float(), f.gate_up_b.float(), f.down_a.float(),
                                                    f.down_b.float(), f.lora_alpha, f.name)
                                     for m, f in per_expert.items()}, what=f"adapter {self.name!r}")
            if defect is not None:
                self.findings.append(defect)
                self.causes.append(f"the per-expert outer layout: {self.label}'s gate/up delta is wrong (ISL-W001)")
        for module, f in self.loaded.items() if self.wrapped else ():
            ga, gb = f.gate_up_a, f.gate_up_b
            if f.outer > 1:
                ga, gb = sglang_0_5_23_equivalent_buffers(ga, gb, interleaved=True)
            self.served[module] = LoRAFactors(ga, gb, f.down_a, f.down_b, f.lora_alpha, f.name)
        self.record("forward", wrapped=self.wrapped, per_expert_modules=sorted(per_expert), nan_modules=nan)


_NAME_CHECK = ("mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer, its per-layer loop, names through utils.py: "
               "get_target_module_name; when a batch first uses the adapter, from LoRAManager.prepare_lora_batch")


def _layer_order(module: str) -> float:
    """A module's place in the buffer load, which walks the layers from 0 (no layer id: last)."""
    lid = layer_id(module + ".")
    return float("inf") if lid is None else lid


def run_sglang(folder: Path, n: int, hidden: int, intermediate: int, tp: int = 1, max_rank: int | None = None,
               target_modules: Sequence[str] | None = None, name: str | None = None,
               state: Adapter | None = None, sglang: str | Release | None = None, tp_rank: int = 0) -> SglangRun:
    """Every stage of the path of sglang release ``sglang`` (default 0.5.23; an unknown one
    is a ``ValueError`` listing the known ones), each once; ``.raised`` holds where it
    stopped, if it did. ``state``: an adapter held in memory, read from its config and
    tensors instead of files. ``tp_rank``: the tensor-parallel rank (of ``tp``) whose
    share is sliced, loaded and served (default 0)."""
    return _Sglang(folder, n, hidden, intermediate, tp, max_rank, target_modules, name or folder.name,
                   release(sglang), tp_rank).run(state)


def config_causes(adapter_config: dict[str, Any], keys: Iterable[str], name: str, sglang: str | Release | None = None
                  ) -> tuple[list[str], list[Finding]]:
    """Where sglang's one ``lora_alpha / r`` is not PEFT's scaling (rsLoRA, alpha and rank
    patterns), and the fields sglang does not read (fan_in_fan_out, modules_to_save, init);
    the findings name release ``sglang`` (default 0.5.23: the same in every release)."""
    version = release(sglang).version
    try:
        peft = read_peft_config(adapter_config, CONFIG_FILE)
    except ValueError:
        return [], []  # the kit refuses the config: its verdict says why; sglang's is read from the raw values
    causes, findings = [], []
    served = peft.lora_alpha / peft.r  # sglang's one scaling
    modules = sorted({module_of(k) for k in keys})
    if peft.use_rslora and peft.r > 1:
        factor = math.sqrt(peft.r)
        causes.append(f"use_rslora: PEFT scales by lora_alpha/sqrt(r), sglang by lora_alpha/r: served sqrt(r) = "
                      f"{factor:.4g} times too weak")
        findings.append(finding(
            "ISL-W101", CONFIG_FILE, fix=f'for sglang, save it with "lora_alpha": {peft.lora_alpha * factor:.8g} and '
            f'"use_rslora": false (the same math: {peft.lora_alpha * factor:.8g}/{peft.r} = '
            f"{peft.lora_alpha / factor:.6g})", more=True, alpha=f"{peft.lora_alpha:g}", r=peft.r,
            peft=f"{peft.lora_alpha / factor:.6g}", sglang=f"{served:.6g}", f=f"{factor:.4g}", release=version))
    # each module's PEFT scaling over sglang's one: for the modules an alpha_pattern key gives their own alpha
    off = {m: peft.scaling_of(m) / served for m in modules if peft.alpha_of(m) != peft.lora_alpha}
    rank_off = {m: peft.rank_of(m) for m in modules if peft.rank_of(m) != peft.r}
    if off:
        detail = "; ".join(f"{m}: alpha {peft.alpha_of(m):g}, served " +
                           (f"{v:.4g} times too weak" if v > 1 else f"{1 / v:.4g} times too strong")
                           for m, v in off.items() if m not in rank_off) or "its modules also have their own rank"
        causes.append("alpha_pattern is ignored by sglang (one lora_alpha for every module): " + detail)
        findings.append(finding(
            "ISL-W102", CONFIG_FILE, fix="for sglang, fold each module's alpha/lora_alpha ratio into its lora_B and "
            "drop alpha_pattern (inkling-lab convert writes exactly that math into its pool), or split the adapter "
            "by alpha", more=True, alpha=f"{peft.lora_alpha:g}", detail=detail, release=version))
    if rank_off:
        detail = "; ".join(f"{m}: rank {k}" for m, k in rank_off.items())
        causes.append(f"rank_pattern is ignored by sglang (one r={peft.r} for every module): {detail}")
        findings.append(finding(
            "ISL-W112", CONFIG_FILE, fix="for sglang, zero-pad every module's factors to one rank R (exact: zero "
            "rows of A meet zero columns of B), fold each module's own scaling over lora_alpha/R into its lora_B, "
            "and save r=R without rank_pattern; inkling-lab convert writes that math into its pool", more=True,
            modules=detail, r=peft.r, release=version))
    if peft.fan_in_fan_out:
        findings.append(finding("ISL-W111", CONFIG_FILE, fix="none needed for the sink (the field changes nothing here)",
                                more=True, release=version))
    if peft.modules_to_save:
        causes.append(f"modules_to_save {list(peft.modules_to_save)}: sglang has no saved-module replacement")
        findings.append(finding(
            "ISL-W109", CONFIG_FILE, fix="merge the adapter into the base model to serve the saved modules, or train "
            "without modules_to_save", more=True, modules=list(peft.modules_to_save), release=version))
    init = peft.base_changing_init
    if init is not None:
        causes.append(f"init_lora_weights={peft.init_lora_weights!r}: the factors are a delta on PEFT's residual base, "
                      "and sglang applies them to the model's own weights")
        findings.append(finding(
            "ISL-W107", CONFIG_FILE, fix="re-save it with PEFT's path_initial_model_for_weight_conversion (PiSSA, "
            "OLoRA, CorDA), or serve it on the LoftQ base it was made with", more=True,
            init=repr(peft.init_lora_weights), method=init, release=version))
    if peft.lora_bias:
        causes.append("lora_bias: sglang has no LoRA bias, the trained biases are not served")
        findings.append(finding(
            "ISL-W108", CONFIG_FILE, fix="merge the adapter into the base weights (PEFT merge_and_unload), or train "
            "with lora_bias=False", more=True, release=version))
    return causes, findings
