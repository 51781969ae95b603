"""The kit against the code inside a user's sglang wheel, on a CPU, without importing sglang.

``selfcheck(wheel)`` reads the wheel as a zip (each file checked against its RECORD,
``upstream_wheel.read_checked``), takes out of it with ``ast`` the definitions the kit
re-implements and runs them on stand-ins for what they import:

* ``srt/models/inkling_common/lora.py``: ``InklingBatchDenseMLPWithLoRA`` (and, where the
  wheel has it, ``InklingBatchDenseMLPWithLoRAV2``) on a stand-in ``InklingBatchDenseMLP``
  that carries only the attributes the wrappers read;
* ``srt/lora/lora.py``: ``LoRAAdapter``'s normalization (``_normalize_weights``) on a
  stand-in adapter of one layer and an Inkling config;
* ``srt/lora/utils.py``: ``get_normalized_target_modules`` and ``get_target_module_name``;
* ``srt/lora/mem_pool.py``: ``LoRAMemoryPool.load_lora_weight_to_buffer``, on a stand-in pool
  and adapter, its loop over the weight names of each layer (a stand-in layer module per
  layer says whether the sink is wrapped; no module is handed a slice, so no buffer is
  written): the skip warning, with ``--lora-strict-loading`` its ``ValueError``, and the
  first name that fails.

Each area then drives the wheel's code and the kit's with the same generated cases
(seeded, a few hundred per area) and compares how each ends: the same exception type,
the same message for upstream's own ``raise`` (Python's and torch's own errors by type),
the same tensors otherwise. The areas: ``v1`` and ``v2`` (``initialize_lora``, then
random ``set_lora_info`` / slot refresh / in-place update sequences: validation and
the derived operands), ``slicing`` (``slice_moe_lora_a/b_weights``), ``normalization``
(the tensors and their order, attention neighbours included), ``targets``, ``loading`` (the buffer load's names: the
warning's text and the error, the target set's repr, which upstream prints in string-hash
order, compared as the kit prints it, sorted), ``hidden_dim`` (Inkling's ``supported_lora_modules`` and its
``get_hidden_dim`` on every module the pool sizes at server start, from target modules
normalized by the wheel's own function: which raise, and the message). Where the kit improves on upstream on purpose (a failed ``set_lora_info``
leaves the module as it was; a ``tp_rank`` out of range is refused) the wheel's module
is rolled back, or the case is not drawn.

Nothing of sglang is imported or stored: the extracted code runs from the wheel's bytes
in memory. ``--download VERSION`` (explicit only) fetches a wheel once into the cache
``wheel_cache()``.
"""
from __future__ import annotations

import __future__
import ast
import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import torch

from .adapters import normalize_layer
from .lora import LoRABackend, SharedSinkLoRA
from .releases import FILES, TABLE, V1_CLASS, V2_CLASS, Release, closest
from .sglang_path import (INKLING_LORA_MODULES, SINK_TARGETS, unserved_modules, check_buffer_names, exception_text, server_target_modules, skipped_weights,
                          targets_text)
from .catalog import message
from .geometry import check_seed
from .shard import slice_lora_a, slice_lora_b
from .upstream_wheel import opened_wheel, read_checked, record_of

AREAS = ("v1", "v2", "slicing", "normalization", "targets", "loading", "hidden_dim")
SINK_EMBEDDINGS = ("embed_tokens", "lm_head")  # utils.py: EMBEDDING_NAMES
SINK_FILE, ADAPTER_FILE, UTILS_FILE, POOL_FILE, MODEL_FILE = (
    f"sglang/{f}" for f in ("srt/models/inkling_common/lora.py", "srt/lora/lora.py", "srt/lora/utils.py",
                            "srt/lora/mem_pool.py", "srt/models/inkling.py"))
MODEL_CLASS = "InklingForConditionalGeneration"


def wheel_cache() -> Path:
    """Where wheels are kept: ``$INKLING_LAB_WHEELS``, else ``~/.cache/inkling-lab/wheels``."""
    return Path(os.environ.get("INKLING_LAB_WHEELS") or Path.home() / ".cache" / "inkling-lab" / "wheels")


def cached_wheel(version: str, cache: Path | None = None) -> Path | None:
    """The cached wheel of sglang ``version``, or ``None``."""
    found = sorted((cache or wheel_cache()).glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?")
"""A release version as PyPI spells one (PEP 440's public versions, without epochs or local parts)."""


def download(version: str, cache: Path | None = None) -> Path:
    """Fetch sglang ``version``'s wheel into the cache once (``pip download --no-deps``).
    ``version`` must read as a release (``0.5.23``), else ``ValueError`` before pip runs;
    pip's own words, when it fails, come back in the ``RuntimeError`` (never straight to
    the terminal: they repeat the version, escape sequences and all)."""
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise ValueError(f"selfcheck: {version!r} is not a release version: give one such as 0.5.23")
    cache = cache or wheel_cache()
    have = cached_wheel(version, cache)
    if have is not None:
        return have
    cache.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-q",
                           f"sglang=={version}", "-d", str(cache)], capture_output=True, text=True,
                          errors="backslashreplace", stdin=subprocess.DEVNULL)
    if done.returncode:
        said = " ".join((done.stderr or done.stdout).split()[-60:])
        raise RuntimeError(f"pip download sglang=={version} failed (exit status {done.returncode}): {said}")
    have = cached_wheel(version, cache)
    if have is None:
        raise RuntimeError(f"pip download left no sglang-{version}-*.whl in {cache}")
    return have


# -- the wheel's code, out of its bytes ---------------------------------------------------

class _Absent:
    """Whatever an extracted file imports from sglang that its checked code never calls."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"selfcheck: the wheel's code called {self.name}, which the stand-ins do not provide")


class _StandInSink(torch.nn.Module):
    """``InklingBatchDenseMLP`` as the LoRA wrappers read it (dense_mlp.py): the expert
    count, the per-partition intermediate size, the MoE tp size and the two layout flags."""

    def __init__(self, n: int, per_partition: int = 2, tp: int = 1, linearized: bool = True,
                 contiguous: bool = False) -> None:
        super().__init__()
        self.n_shared_experts, self.intermediate_size_per_partition, self.moe_tp_size = n, per_partition, tp
        self._linearized_bf16_enabled, self._w13_gate_up_contiguous = linearized, contiguous


_STAND_INS = {
    "InklingBatchDenseMLP": _StandInSink, "BaseLoRABackend": object,
    "DenseLoraKind": SimpleNamespace(SINK_GATE_UP="sink_gate_up", LINEAR="linear", SINK_DOWN="sink_down"),
    "capturing_lora_graph": lambda: False,
}


@dataclass
class Extracted:
    """Definitions taken out of one wheel file: ``names`` -> the object, ``raises``: the
    line ranges of its ``raise`` statements (an error raised there is upstream's own)."""

    path: str
    names: dict[str, Any]
    raises: list[tuple[int, int]]

    def own_raise(self, exc: BaseException) -> bool:
        tb, last = exc.__traceback__, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self.path:
                last = tb.tb_lineno
            tb = tb.tb_next
        return last is not None and any(a <= last <= b for a, b in self.raises)


def extract(source: bytes, path: str, wanted: Sequence[str]) -> Extracted:
    """The top-level classes and functions ``wanted`` of a wheel file, with the file's own
    non-sglang imports and simple constants, compiled from its source; sglang imports
    are bound to ``_STAND_INS`` (or to ``_Absent``). A name the file lacks is left out."""
    tree = ast.parse(source, filename=path)
    env: dict[str, Any] = {"__name__": f"inkling_lab.selfcheck[{path}]", "__builtins__": __builtins__}
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("sglang")):
            for alias in node.names:
                name = alias.asname or alias.name
                env[name] = _STAND_INS.get(name, _Absent(name))
        elif isinstance(node, ast.Import) and any(a.name.startswith("sglang") for a in node.names):
            continue
        elif isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign)):
            body.append(node)
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in wanted:
            body.append(node)
    flags = __future__.annotations.compiler_flag
    for node in body:  # one statement at a time: a constant built from an absent import is skipped
        code = compile(ast.Module(body=[node], type_ignores=[]), path, "exec", flags=flags, dont_inherit=True)
        try:
            exec(code, env)  # noqa: S102 - the wheel's own definitions, RECORD-checked, run on stand-ins
        except (NameError, TypeError, AttributeError, RuntimeError):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                raise
    raises = [(n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree) if isinstance(n, ast.Raise)]
    return Extracted(path, {w: env[w] for w in wanted if w in env}, raises)


# -- comparing outcomes -------------------------------------------------------------------

class Disagreement(Exception):
    """The wheel and the kit ended one case differently."""


def _outcome(fn: Callable[[], Any], code: Extracted) -> tuple[Any, Any]:
    """``(result, None)`` or ``(None, (type, message or None))``: the message counts for
    upstream's own raises only."""
    try:
        return fn(), None
    except Exception as exc:  # noqa: BLE001 - any exception is an outcome to compare
        return None, (type(exc), str(exc) if code.own_raise(exc) else None, exc)


def _same_end(case: str, upstream: tuple[Any, Any], kit: Callable[[], Any]) -> tuple[bool, Any]:
    """Run the kit's side; raise ``Disagreement`` unless it ends as ``upstream`` did.
    Returns ``(passed, kit result)``."""
    _, want = upstream
    try:
        got = kit()
    except Exception as exc:  # noqa: BLE001
        if want is None:
            raise Disagreement(f"{case}: the kit raised {type(exc).__name__}: {exc}; the wheel passes") from None
        if type(exc) is not want[0] or (want[1] is not None and str(exc) != want[1]):
            raise Disagreement(f"{case}: the kit raised {type(exc).__name__}: {exc}; the wheel "
                               f"{want[0].__name__}: {want[2]}") from None
        return False, None
    if want is not None:
        raise Disagreement(f"{case}: the wheel raised {want[0].__name__}: {want[2]}; the kit passes")
    return True, got


def _same_tensors(case: str, got: Any, want: Any) -> None:
    if isinstance(want, dict) or isinstance(got, dict):
        if not (isinstance(want, dict) and isinstance(got, dict)) or set(got) != set(want):
            raise Disagreement(f"{case}: the kit gives {_describe(got)}, the wheel {_describe(want)}")
        for k in want:
            _same_tensors(f"{case}[{k!r}]", got[k], want[k])
        return
    if (got is None) != (want is None):
        raise Disagreement(f"{case}: the kit gives {_describe(got)}, the wheel {_describe(want)}")
    if want is None:
        return
    same = got.shape == want.shape and got.dtype == want.dtype and got.device == want.device
    if same and want.device.type != "meta":
        same = torch.equal(got, want)
    if not same:
        raise Disagreement(f"{case}: the kit gives {_describe(got)}, the wheel {_describe(want)}")


def _describe(t: Any) -> str:
    if isinstance(t, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in t.items()) + "}"
    if isinstance(t, torch.Tensor):
        return f"tensor{list(t.shape)} {str(t.dtype).removeprefix('torch.')}" + (
            f" {t.device.type}" if t.device.type != "cpu" else "")
    return repr(t)


# -- the generated cases ----------------------------------------------------------------

def _pool(rng: random.Random, n: int) -> list[torch.Tensor]:
    """Four buffers, mostly consistent, often broken in a way upstream does not check (odd
    2F, slot counts, F of down A, zero sizes), sometimes in one it does (an axis count,
    an expert count, a rank); now and then on the meta device or not contiguous."""
    S, R, H, F = (rng.randint(0, 3) for _ in range(4))
    two_f = 2 * F + rng.choice([0, 0, 0, 1])
    outer = rng.choice([1, 1, n, 3])
    slots = [S] * 4
    if rng.randint(0, 4) == 0:
        slots[rng.randint(0, 3)] = rng.randint(0, 3)
    f_down = F if rng.randint(0, 4) else rng.randint(0, 3)
    shapes = [[slots[0], outer, 2 * R, H], [slots[1], n, two_f, R], [slots[2], n, R, f_down], [slots[3], outer, H, R]]
    if rng.randint(0, 5) == 0:
        broken, axis = shapes[rng.randint(0, 3)], rng.randint(0, 4)
        if axis == 4:
            broken.append(1)
        elif rng.random() < 0.5:
            del broken[min(axis, len(broken) - 1)]
        else:
            broken[min(axis, 3)] += 1
    gen = torch.Generator().manual_seed(rng.randint(0, 2**16))
    dtype = rng.choice([torch.float32, torch.float64])
    buffers = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
    twist = rng.randint(0, 9)
    if twist == 0 and buffers[2].dim() == 4:
        buffers[2] = buffers[2].to("meta")
    elif twist == 1 and buffers[1].dim() == 4:
        buffers[1] = buffers[1].transpose(2, 3).contiguous().transpose(2, 3)
    return buffers


def _snapshot(module: torch.nn.Module) -> tuple[dict, dict, dict]:
    attrs, buffers = dict(module.__dict__), dict(module._buffers)
    kept = {id(t): (t, t.clone()) for t in [*attrs.values(), *buffers.values()]
            if isinstance(t, torch.Tensor) and t.device.type != "meta"}
    return attrs, buffers, kept


def _restore(module: torch.nn.Module, snapshot: tuple[dict, dict, dict]) -> None:
    attrs, buffers, kept = snapshot
    module.__dict__.clear()
    module.__dict__.update(attrs)
    module._buffers.clear()
    module._buffers.update(buffers)
    with torch.no_grad():
        for t, copy in kept.values():
            t.copy_(copy)


_OPERANDS = {"v1": {"w1_delta": "_w1_delta", "a_cat": "_a_cat"}, "v2": {"down_cat": "_down_cat"}}


def _initialize(generation: str, cls: type, rng: random.Random, n: int) -> tuple[Any, Any, bool]:
    """Both modules through ``initialize_lora`` with one drawn backend and sink layout.
    Returns ``(upstream module, kit sink, initialized)``; raises ``Disagreement``."""
    name = rng.choice(["triton", "triton", "triton_v2", "csgmv"])
    slots = rng.choice([1, 4])
    interleaved = rng.random() < (0.8 if generation == "v1" else 0.2)
    dtype = torch.bfloat16 if rng.random() < 0.85 else torch.float32
    kit = SharedSinkLoRA(n, 4, 2, interleaved=interleaved, dtype=dtype)
    linearized = kit.linearized_bf16 if generation == "v1" else dtype == torch.bfloat16
    up = cls(n, linearized=linearized, contiguous=not interleaved)
    backend = SimpleNamespace(name=name, max_loras_per_batch=slots, is_moe_lora=False,
                              runner=object() if name == "triton_v2" else None)
    ok, _ = _same_end(f"initialize_lora(backend {name!r}, {slots} slot(s)) of a "
                      f"{'interleaved' if interleaved else 'contiguous'} {str(dtype).removeprefix('torch.')} sink",
                      _outcome(lambda: up.initialize_lora(backend), _CODE[SINK_FILE]),
                      lambda: kit.initialize_lora(LoRABackend(name, slots), generation))
    return up, kit, ok


def _check_generation(generation: str, cls: type, rng: random.Random) -> str:
    """One case: ``initialize_lora`` then up to six steps. Returns the case's description."""
    n = rng.randint(1, 2)
    up, kit, ok = _initialize(generation, cls, rng, n)
    steps = [f"n={n}"]
    if not ok:
        return steps[0]
    code = _CODE[SINK_FILE]
    for _ in range(rng.randint(1, 6)):
        op = rng.choice(["set", "set", "refresh", "update"])
        if op == "set":
            buffers = _pool(rng, n)
            steps.append("set_lora_info(" + ", ".join(_describe(b) for b in buffers) + ")")
            before = _snapshot(up)
            ok, _ = _same_end(" then ".join(steps), _outcome(lambda: up.set_lora_info(*buffers), code),
                              lambda: kit.set_lora_info(*buffers))
            if not ok:  # the kit's improvement: a failed call leaves the module as it was
                _restore(up, before)
        elif op == "refresh":
            ids = None if rng.random() < 0.3 else set(rng.sample(range(-2, 6), rng.randint(0, 4)))
            steps.append(f"on_lora_slots_updated({ids})")
            _same_end(" then ".join(steps), _outcome(lambda: up.on_lora_slots_updated(ids), code),
                      lambda: kit.on_lora_slots_updated(ids))
        else:
            if kit.lora_buffers is None or any(b.device.type == "meta" for b in kit.lora_buffers):
                continue
            steps.append("the pool updated in place, every slot refreshed")
            with torch.no_grad():
                for b in kit.lora_buffers:
                    b.add_(1.0)
            _same_end(" then ".join(steps), _outcome(lambda: up.on_lora_slots_updated(None), code),
                      lambda: kit.on_lora_slots_updated(None))
        for mine, theirs in _OPERANDS[generation].items():
            _same_tensors(" then ".join(steps) + f": {mine}", getattr(kit, mine), getattr(up, theirs, None))
    return " then ".join(steps)


def _check_slicing(cls: type, rng: random.Random) -> str:
    n, tp, per, r = rng.randint(0, 3), rng.randint(1, 4), rng.randint(0, 3), rng.randint(0, 3)
    rank = rng.randint(0, tp - 1)  # a rank outside 0..tp-1 the kit refuses on purpose (ISL-K101)
    factor, module = rng.choice("ab"), rng.choice(["gate_up_proj_moe", "down_proj_moe"])
    form = rng.choice(["2d", "2d", "3d", "dict", "4d"])
    dtype = rng.choice([torch.float32, torch.bfloat16])
    F = per * tp
    rows = 2 * F + rng.choice([0, 0, 1])
    one = {("a", "down_proj_moe"): (r, F), ("b", "gate_up_proj_moe"): (rows, r),
           ("a", "gate_up_proj_moe"): (r, 3), ("b", "down_proj_moe"): (3, r)}[factor, module]
    experts = max(n, 1) + rng.choice([0, 0, 1])
    gen = torch.Generator().manual_seed(rng.randint(0, 2**16))

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    if form == "2d":
        flat = (one[0], one[1] * experts) if (factor, module) == ("a", "down_proj_moe") else \
            (one[0] * experts, one[1]) if (factor, module) == ("b", "gate_up_proj_moe") else one
        weights: Any = randn(*flat)
    elif form == "3d":
        weights = randn(experts, *one)
    elif form == "4d":
        weights = randn(2, experts, *one)
    else:
        weights = {e: randn(*one) for e in rng.sample(range(6), rng.randint(0, 3))}
    up = cls(n, per_partition=per, tp=tp)
    method = getattr(up, f"slice_moe_lora_{factor}_weights")
    kit = slice_lora_a if factor == "a" else slice_lora_b
    case = (f"slice_moe_lora_{factor}_weights({_describe(weights)}, tp_rank={rank}, {module!r}) with n={n}, "
            f"tp={tp}, F/tp={per}")
    want = _outcome(lambda: method(weights, rank, module), _CODE[SINK_FILE])
    ok, got = _same_end(case, want, lambda: kit(weights, rank, module, tp, n, F))
    if ok:
        _same_tensors(case, got, want[0])
    return case


_PREFIX = "base_model.model.model.layers.0.mlp.shared_experts."
_ATTENTION = "base_model.model.model.layers.0.self_attn."
_PROJ = ("gate_proj", "up_proj", "gate_up_proj", "down_proj", "w1", "w3", "w2")


def _check_normalization(adapter_cls: type, rng: random.Random) -> str:
    n, r, H, F = rng.randint(1, 3), rng.randint(0, 3), rng.randint(1, 4), rng.randint(1, 3)
    gen = torch.Generator().manual_seed(rng.randint(0, 2**16))
    dtype = rng.choice([torch.float32, torch.bfloat16])
    weights: dict[str, torch.Tensor] = {}
    for proj in rng.sample(_PROJ, rng.randint(1, 4)):
        per_expert = rng.random() < 0.2
        for e in (range(rng.randint(1, n)) if per_expert else [None]):
            stem = _PREFIX + ("" if e is None else f"{e}.") + proj
            down, extra = proj in ("down_proj", "w2"), rng.choice([0, 0, 0, 1])
            rows = F * (1 if e is not None else n) + extra  # sometimes not divisible by n
            a = (r, rows) if down else (r, H)
            b = (H, r) if down else (rows * (2 if proj == "gate_up_proj" else 1), r)
            for ab, shape in (("A", a), ("B", b)):
                if rng.random() < 0.05:
                    shape = (0, *shape[1:])  # a zero-size placeholder (PEFT writes them for absent up_proj)
                weights[f"{stem}.lora_{ab}.weight"] = torch.randn(*shape, generator=gen).to(dtype)
    if rng.random() < 0.2:
        weights[_PREFIX + "router.weight"] = torch.randn(2, H, generator=gen).to(dtype)
    if rng.random() < 0.2:  # LoRA-shaped neighbours under shared_experts.: upstream leaves them as they are
        for name in rng.sample(("router.lora_A.weight", "gate.lora_B.weight", "gate_proj.lora_B.bias"), 2):
            shape = (rng.randint(1, 4), H) if not name.endswith("bias") else (rng.randint(1, 4),)
            weights[_PREFIX + name] = torch.randn(*shape, generator=gen).to(dtype)
    if rng.random() < 0.2:  # attention neighbours: normalize_qkv_proj stacks them first (a missing v: KeyError)
        for proj in rng.sample(("q_proj", "k_proj", "v_proj", "qkv_proj"), rng.randint(1, 3)):
            rank = r if rng.random() < 0.9 else r + 1
            for ab, shape in (("A", (rank, H)), ("B", (rng.randint(1, 3), rank))):
                weights[f"{_ATTENTION}{proj}.lora_{ab}.weight"] = torch.randn(*shape, generator=gen).to(dtype)
    if rng.random() < 0.2:  # Inkling's own attention: normalize_inkling_qkvr_proj stacks all four, or none
        for proj in rng.sample(("wq_du", "wk_dv", "wv_dv", "wr_du", "qkvr"), rng.randint(1, 5)):
            rank = r if rng.random() < 0.8 else r + 1
            for ab, shape in (("A", (rank, H)), ("B", (rng.randint(1, 3), rank))):
                weights[f"{_ATTENTION}{proj}.lora_{ab}.weight"] = torch.randn(*shape, generator=gen).to(dtype)
    keys = list(weights)
    rng.shuffle(keys)  # upstream's result depends on the adapter's key order: both see the same
    weights = {k: weights[k] for k in keys}
    up = adapter_cls.__new__(adapter_cls)
    torch.nn.Module.__init__(up)
    layer = SimpleNamespace(weights=dict(weights))
    for name, value in (("base_hf_config", SimpleNamespace(architectures=["InklingForCausalLM"], model_type="inkling",
                                                            n_shared_experts=n)),
                        ("layers", [layer]), ("_moe_is_gated_by_layer", {}), ("config", SimpleNamespace(r=r))):
        object.__setattr__(up, name, value)
    case = f"normalize n={n}: " + ", ".join(f"{k.removeprefix(_PREFIX)} {list(t.shape)}" for k, t in weights.items())
    want = _outcome(lambda: up._normalize_weights(), _CODE[ADAPTER_FILE])
    ok, got = _same_end(case, want, lambda: normalize_layer(dict(weights), n, r))
    if ok:
        _same_tensors(case, got, layer.weights)
        if list(got) != list(layer.weights):  # the buffer load walks this order: its first error depends on it
            raise Disagreement(f"{case}: the kit's order {list(got)}, the wheel's {list(layer.weights)}")
    return case


def _check_targets(fn: Callable[[Any], set[str]], names: Sequence[str], rng: random.Random) -> str:
    if rng.random() < 0.1:
        targets: Any = rng.choice(["all", "all-linear"])
    else:
        prefixes = ["", "mlp.", "mlp.shared_experts.", "model.layers.0.self_attn."]
        targets = [rng.choice(prefixes) + rng.choice(names) for _ in range(rng.randint(0, 5))]
    case = f"get_normalized_target_modules({targets!r})"
    want = _outcome(lambda: fn(targets), _CODE[UTILS_FILE])
    ok, got = _same_end(case, want, lambda: server_target_modules(targets))
    if ok and got != want[0]:
        raise Disagreement(f"{case}: the kit gives {sorted(got)}, the wheel {sorted(want[0])}")
    return case


class _Said:
    """``logger`` for the wheel's ``mem_pool.py``: keeps what it warns, says nothing."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, msg: str, *args: Any) -> None:
        self.warnings.append(msg % args if args else msg)

    def info(self, *args: Any, **kwargs: Any) -> None:
        pass

    debug = info


class _LayerModules(dict):
    """One layer's ``lora_modules`` entry: its values say whether the sink is wrapped
    (``is_shared_fused_moe``), its items are empty, so no module is sliced and no buffer
    is written: the loop over the layer's weight names runs, then nothing."""

    def __init__(self, wrapped: bool) -> None:
        super().__init__()
        self._values = [SimpleNamespace(is_shared_fused_moe=True)] if wrapped else []

    def values(self) -> Any:
        return list(self._values)

    def items(self) -> Any:
        return []


_LOADING_NAMES = (  # (name under model.layers.<id>., dims): the sink's, per expert, others, other modules
    ("mlp.shared_experts.gate_up_proj.lora_A.weight", 3), ("mlp.shared_experts.down_proj.lora_B.weight", 3),
    ("mlp.shared_experts.{e}.gate_up_proj.lora_A.weight", 2), ("mlp.shared_experts.{e}.down_proj.lora_A.weight", 2),
    ("mlp.shared_experts.{e}.down_proj.lora_B.weight", 3), ("mlp.shared_experts.up_proj.lora_A.weight", 3),
    ("mlp.shared_experts.base_layer.lora_A.weight", 2), ("mlp.shared_experts.base_layer.base_layer.lora_B.weight", 2),
    ("mlp.shared_experts.router.lora_A.weight", 2), ("mlp.shared_experts.{e}.o_proj.lora_A.weight", 2),
    ("self_attn.o_proj.lora_A.weight", 2), ("self_attn.qkv_proj.lora_B.weight", 2),
    ("mlp.experts.{e}.gate_up_proj.lora_A.weight", 2), ("mlp.experts.{e}.w1.lora_A.weight", 2),
    ("mlp.experts.down_proj.lora_B.weight", 3))


def _check_loading(pool_cls: type, version: str, rng: random.Random) -> str:
    """One case of the buffer load's names: layers of drawn weights (in a drawn order), a
    drawn target set (the sink wrapped when it holds both of its targets, as
    ``init_lora_modules`` does), embedding weights that match none, strict or not."""
    targets = set(rng.sample(["gate_up_proj", "down_proj", "qkv_proj", "o_proj", "w1", "router"], rng.randint(0, 4)))
    wrapped = all(t in targets for t in SINK_TARGETS)
    num_layers = rng.randint(1, 3)
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for lid in range(num_layers):
        drawn = rng.sample(_LOADING_NAMES, rng.randint(0, 4))
        layers[lid] = {f"model.layers.{lid}.{name.format(e=rng.randint(0, 1))}": torch.zeros((1,) * dims)
                       for name, dims in drawn}
    embedding = rng.sample(["model.embed_tokens.lora_embedding_A", "lm_head.lora_B.weight"], rng.choice([0, 0, 1, 2]))
    strict = rng.random() < 0.2
    buffers = {}
    for t in targets:  # init_buffers: the sink's two targets also get _moe and, when it is wrapped, _shared_moe
        buffers.update(dict.fromkeys([t] + ([f"{t}_moe"] + [f"{t}_shared_moe"] * wrapped if t in SINK_TARGETS else [])))
    said = _Said()
    pool = SimpleNamespace(target_modules=targets, strict_loading=strict, num_layer=num_layers, A_buffer=buffers,
                           B_buffer=buffers, embedding_A_buffer={}, embedding_B_buffer={}, lm_head_A_buffer={},
                           lm_head_B_buffer={}, lora_added_tokens_size=0, new_embeddings_buffer={},
                           base_hf_config=SimpleNamespace(vocab_size=8))
    adapter = SimpleNamespace(
        config=SimpleNamespace(r=1, lora_added_tokens_size=0), scaling=1.0,
        layers=[SimpleNamespace(weights=dict(layers[lid]), pinned_weights={}) for lid in range(num_layers)],
        embedding_layers={k: torch.zeros(1, 1) for k in embedding}, pinned_embedding_layers={},
        pinned_added_tokens_embeddings={}, added_tokens_embeddings={})
    load = pool_cls.load_lora_weight_to_buffer
    load.__globals__["logger"] = said
    case = (f"load_lora_weight_to_buffer(targets {sorted(targets)}{', strict' if strict else ''}, sink "
            f"{'wrapped' if wrapped else 'not wrapped'}): " + "; ".join(
                f"layer {lid}: " + ", ".join(f"{k.split('.', 3)[3]} {t.dim()}D" for k, t in layer.items())
                for lid, layer in layers.items()) + (f"; embedding {embedding}" if embedding else ""))
    stand_in = sys.modules.get("sglang.srt.lora.layers")
    sys.modules["sglang.srt.lora.layers"] = SimpleNamespace(FusedMoEWithLoRA=type("FusedMoEWithLoRA", (), {}))
    try:
        want = _outcome(lambda: load(pool, "uid", 0, adapter, [_LayerModules(wrapped) for _ in layers], None, None),
                        _CODE[POOL_FILE])
    finally:
        if stand_in is None:
            del sys.modules["sglang.srt.lora.layers"]
        else:
            sys.modules["sglang.srt.lora.layers"] = stand_in
    skipped = skipped_weights([k for layer in layers.values() for k in layer] + embedding, targets)
    warning = message("ISL-W002", uid="uid", count=len(skipped), targets=sorted(targets), names=skipped) \
        if skipped else None
    if strict and warning is not None:
        kit = "ValueError: " + warning
    else:
        check = check_buffer_names(layers, embedding, targets, wrapped, version)
        if check.unknown:
            raise Disagreement(f"{case}: the kit cannot tell ({check.unknown})")
        kit = check.text or None
        if said.warnings != ([warning] if warning else []):
            raise Disagreement(f"{case}: the wheel warns {said.warnings}, the kit {warning}")
    got = None if want[1] is None else exception_text(want[1][2]).replace(repr(targets), targets_text(targets))
    if got != kit:
        raise Disagreement(f"{case}: the wheel {got or 'passes'}; the kit {kit or 'passes'}")
    return case


# -- the report ---------------------------------------------------------------------------

@dataclass
class AreaResult:
    """One area: ``status`` ``agree``, ``disagree``, ``absent`` (the wheel has no such code
    and the release table says so: it agrees) or ``missing`` (the wheel lacks the code
    the kit needs); ``cases`` run; ``first``: the first disagreement, in words."""

    area: str
    status: str
    cases: int = 0
    first: str = ""
    note: str = ""

    @property
    def agrees(self) -> bool:
        return self.status in ("agree", "absent")

    def line(self) -> str:
        text = f"  {self.area:<14} {self.status:<9}" + (f" {self.cases} cases" if self.cases else "")
        if self.note:
            text += f"  ({self.note})"
        if self.first:
            text += f"\n      first disagreement: {self.first}"
        return text


@dataclass
class SelfCheck:
    """``selfcheck``'s report: the wheel, its version, whether the release table knows
    it (``known``; else the closest release and the files that differ) and each area."""

    wheel: str
    version: str
    known: bool
    closest: str
    differs: list[str]
    areas: list[AreaResult] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return all(a.agrees for a in self.areas)

    @property
    def exit_status(self) -> int:
        return 0 if self.agrees else 1

    def __str__(self) -> str:
        lines = [f"sglang {self.version} ({Path(self.wheel).name}): the kit against the code in the wheel"]
        if self.known:
            lines.append(f"  in the release table: sglang {self.version} (the files the kit reads match its RECORD hashes)")
        else:
            lines.append(f"  NOT in the release table as it stands: closest known release sglang {self.closest}; files "
                         f"that differ from it: {', '.join(self.differs) or 'none'}")
        lines += [a.line() for a in self.areas]
        lines.append("all areas agree" if self.agrees else
                     "the kit disagrees with this wheel in: " + ", ".join(a.area for a in self.areas if not a.agrees))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"wheel": Path(self.wheel).name, "version": self.version, "known": self.known, "closest": self.closest,
                "differs": self.differs, "agrees": self.agrees,
                "areas": {a.area: {"status": a.status, "cases": a.cases, "first": a.first, "note": a.note}
                          for a in self.areas}}


_CODE: dict[str, Extracted] = {}
"""The extracted files of the wheel under check (one check at a time)."""


_HIDDEN_DIM_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "wq_du", "wk_dv", "wv_dv", "wr_du", "qkvr", "wo_ud",
                     "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3", "embed_tokens", "lm_head", "out_proj",
                     "unembed_tokens", "router")


class _DenseMLP(SimpleNamespace):
    """Stands in for ``InklingDenseMLP``: layer 0 of the stub is a dense-MLP layer."""


def _stub_inkling(hidden: int, intermediate: int, vocab: int) -> SimpleNamespace:
    """What ``get_hidden_dim`` reads of the model: its text config and layer 0's modules (dense MLP)."""
    def linear(i: int, o: int) -> SimpleNamespace:
        return SimpleNamespace(input_size=i, output_size=o, output_sizes=[o // 4] * 4)
    layer = SimpleNamespace(attn=SimpleNamespace(qkvr=linear(hidden, 4 * hidden), wo_ud=linear(hidden, hidden)),
                            mlp=_DenseMLP(gate_up_proj=linear(hidden, 2 * intermediate),
                                          down_proj=linear(intermediate, hidden)))
    config = SimpleNamespace(hidden_size=hidden, intermediate_size=intermediate, vocab_size=vocab)
    return SimpleNamespace(text_config=config, llm=SimpleNamespace(layers=[layer]))


def _check_hidden_dim(model_cls: type, normalize: Callable[[Any], set[str]], rng: random.Random) -> str:
    """The pool's ``init_buffers`` asks ``get_hidden_dim`` for every target module but the
    embeddings (``gate_up_proj``/``down_proj`` also as ``_moe`` and ``_shared_moe``), then the
    embeddings: the first that raises stops the server's start (the wheel's set order is
    string-hash order; both sides take the names sorted)."""
    if list(model_cls.supported_lora_modules) != list(INKLING_LORA_MODULES):
        raise Disagreement(f"{MODEL_CLASS}.supported_lora_modules is {model_cls.supported_lora_modules}, the kit's "
                           f"{list(INKLING_LORA_MODULES)}")
    targets = [rng.choice(("", "self_attn.", "mlp.")) + rng.choice(_HIDDEN_DIM_NAMES) for _ in range(rng.randint(1, 5))]
    server = normalize(targets)
    case = f"get_hidden_dim for the target modules {sorted(server)} (from {targets!r})"
    model = _stub_inkling(8, 6, 32)
    fake = type(sys)("sglang.srt.lora.layers")
    fake.BaseLayerWithLoRA = type("BaseLayerWithLoRA", (), {})  # the local import get_hidden_dim's base_layer does
    saved = {m: sys.modules.get(m) for m in ("sglang", "sglang.srt", "sglang.srt.lora", "sglang.srt.lora.layers")}
    sys.modules.update({m: type(sys)(m) for m in saved if m != "sglang.srt.lora.layers"}, **{fake.__name__: fake})
    model_cls.get_hidden_dim.__globals__["InklingDenseMLP"] = _DenseMLP  # the extracted code's own stand-in
    try:
        wanted = [n for m in sorted(server - set(SINK_EMBEDDINGS)) for n in
                  ((m, f"{m}_moe", f"{m}_shared_moe") if m in SINK_TARGETS else (m,))]
        raised = None
        for name in wanted + sorted(server & set(SINK_EMBEDDINGS)):
            try:
                model_cls.get_hidden_dim(model, name, 0)
            except NotImplementedError as exc:
                raised = exception_text(exc)
                break
    finally:
        for m, mod in saved.items():
            if mod is None:
                sys.modules.pop(m, None)
            else:
                sys.modules[m] = mod
    unserved = unserved_modules(server)
    kit = "NotImplementedError: " + message("ISL-E038", module_name=unserved[0]) if unserved else None
    if kit != raised:
        raise Disagreement(f"{case}: the kit says {kit or 'it starts'}, the wheel {raised or 'it starts'}")
    return case


def _version_of(wheel: Path) -> str:
    with opened_wheel(wheel) as z:  # a regular file only: a FIFO would block, a device never end
        infos = [n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
    m = re.fullmatch(r"sglang-(.+)\.dist-info", infos[0]) if infos else None
    if m is None:
        raise ValueError(f"{wheel}: not an sglang wheel (no sglang-*.dist-info/METADATA)")
    return m.group(1)


def _run(area: str, cases: int, seed: int, check: Callable[[random.Random], str]) -> AreaResult:
    rng = random.Random(f"{seed}:{area}")
    for i in range(cases):
        try:
            check(rng)
        except Disagreement as d:
            return AreaResult(area, "disagree", i + 1, first=str(d))
        except Exception as exc:  # noqa: BLE001 - the wheel's code does not fit the stand-ins: no agreement
            return AreaResult(area, "disagree", i + 1,
                              first=f"the wheel's code could not be driven as the kit's is: {type(exc).__name__}: {exc}")
    return AreaResult(area, "agree", cases)


CASES_LIMIT = 100_000
"""The most generated cases per area ``selfcheck`` runs (the default 300 takes seconds)."""


def selfcheck(wheel: str | Path, cases: int = 300, seed: int = 0) -> SelfCheck:
    """Check the kit against the code in ``wheel`` (a path to an sglang ``.whl``): see the
    module's docstring. ``cases`` per area (the generation areas run ``cases * 2 // 3``
    sequences of up to six steps), at most ``CASES_LIMIT``: a count past it would run for
    days, not check more (``ValueError`` before anything is read)."""
    if isinstance(cases, bool) or not isinstance(cases, int) or not 1 <= cases <= CASES_LIMIT:
        raise ValueError(f"selfcheck: cases must be a whole number in 1..{CASES_LIMIT} (per area; the default "
                         f"is 300), got {cases!r}")
    check_seed("selfcheck: seed", seed)
    wheel = Path(wheel)
    version = _version_of(wheel)
    record = {f: h for f, h in ((f, record_of(wheel, [f"sglang/{f}"]).get(f"sglang/{f}")) for f in FILES) if h}
    near, differs = closest(record)
    known = version in TABLE and TABLE[version].record == record
    report = SelfCheck(str(wheel), version, known, near.version, differs)
    files = read_checked(wheel, [SINK_FILE, ADAPTER_FILE, UTILS_FILE, POOL_FILE, MODEL_FILE], missing_ok=True)
    if SINK_FILE not in files:
        report.areas = [AreaResult(a, "missing", note=f"the wheel has no {SINK_FILE}") for a in AREAS]
        return report
    expected: Release = TABLE[version] if version in TABLE else near
    _CODE.clear()
    _CODE[SINK_FILE] = extract(files[SINK_FILE], f"<{wheel.name}>/{SINK_FILE}", (V1_CLASS, V2_CLASS))
    sink = _CODE[SINK_FILE].names
    for gen, cls_name in (("v1", V1_CLASS), ("v2", V2_CLASS)):
        if cls_name not in sink:
            says = "has none either" if not expected.has(gen) else "has it: the table is wrong for this wheel"
            report.areas.append(AreaResult(gen, "absent" if not expected.has(gen) else "disagree",
                                           note=f"no {cls_name} in the wheel; the release table's "
                                                f"sglang {expected.version} {says}"))
            continue
        result = _run(gen, cases * 2 // 3, seed, lambda rng, g=gen, c=sink[cls_name]: _check_generation(g, c, rng))
        if not expected.has(gen):
            result = AreaResult(gen, "disagree", result.cases, result.first,
                                note=f"the wheel has {cls_name}, the release table's sglang {expected.version} not")
        report.areas.append(result)
    report.areas.append(_run("slicing", cases, seed, lambda rng: _check_slicing(sink[V1_CLASS], rng)))
    if ADAPTER_FILE in files:
        _CODE[ADAPTER_FILE] = extract(files[ADAPTER_FILE], f"<{wheel.name}>/{ADAPTER_FILE}", ("LoRAAdapter",))
        adapter = _CODE[ADAPTER_FILE].names["LoRAAdapter"]
        report.areas.append(_run("normalization", cases, seed, lambda rng: _check_normalization(adapter, rng)))
    else:
        report.areas.append(AreaResult("normalization", "missing", note=f"the wheel has no {ADAPTER_FILE}"))
    if UTILS_FILE in files:
        _CODE[UTILS_FILE] = extract(files[UTILS_FILE], f"<{wheel.name}>/{UTILS_FILE}",
                                    ("get_normalized_target_modules", "get_target_module_name"))
        fn = _CODE[UTILS_FILE].names["get_normalized_target_modules"]
        # the names to draw: every string the wheel's function holds (its renames), and others
        tree = ast.parse(files[UTILS_FILE])
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_normalized_target_modules")
        names = sorted({c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                        and c.value.isidentifier()} | {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3",
                                                        "o_proj", "router", "experts"})
        report.areas.append(_run("targets", cases, seed, lambda rng: _check_targets(fn, names, rng)))
    else:
        report.areas.append(AreaResult("targets", "missing", note=f"the wheel has no {UTILS_FILE}"))
    if POOL_FILE in files and UTILS_FILE in files:
        _CODE[POOL_FILE] = extract(files[POOL_FILE], f"<{wheel.name}>/{POOL_FILE}", ("LoRAMemoryPool",))
        pool_cls = _CODE[POOL_FILE].names["LoRAMemoryPool"]
        # its names are looked up by the wheel's own get_target_module_name (utils.py)
        pool_cls.load_lora_weight_to_buffer.__globals__["get_target_module_name"] = \
            _CODE[UTILS_FILE].names["get_target_module_name"]
        report.areas.append(_run("loading", cases, seed, lambda rng: _check_loading(pool_cls, expected.version, rng)))
    else:
        report.areas.append(AreaResult("loading", "missing", note=f"the wheel has no {POOL_FILE}"))
    if MODEL_FILE in files and UTILS_FILE in files:
        model_cls = extract(files[MODEL_FILE], f"<{wheel.name}>/{MODEL_FILE}", (MODEL_CLASS,)).names[MODEL_CLASS]
        report.areas.append(_run("hidden_dim", cases, seed, lambda rng: _check_hidden_dim(model_cls, fn, rng)))
    else:
        report.areas.append(AreaResult("hidden_dim", "missing", note=f"the wheel has no {MODEL_FILE}"))
    return report
