"""The sglang releases that have the shared-sink LoRA wrapper, as data (docs/reference.md#releases).

Every fact here was read from the published wheel of that release (``pip download
--no-deps sglang==0.5.X``, unpacked, compared file by file and function by function);
nothing of sglang's code is stored. 0.5.15's wheel has no
``srt/models/inkling_common/lora.py``: the shared-sink LoRA first appears in 0.5.16.

``release(version)`` is the one way in: an unknown version (or one before 0.5.16) is a
``ValueError`` that lists the known ones. ``Release`` says what the release has: its
wrapper generations, the catalog entries it raises (each entry's ``releases``), how
its target modules are normalized, how its pool is filled, what the doctor's findings
rest on, and the RECORD hashes of the files the kit reads, so that ``selfcheck`` can
tell a wheel of this release from another one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .catalog import ENTRIES, RELEASES

DEFAULT = "0.5.23"
"""The release the kit speaks of unless told otherwise (``--sglang``)."""

FILES = ("srt/models/inkling_common/lora.py", "srt/lora/lora.py", "srt/lora/utils.py", "srt/lora/lora_config.py",
         "srt/lora/mem_pool.py", "srt/lora/lora_manager.py", "srt/lora/trtllm_lora_temp/inkling_dense.py",
         "srt/models/inkling_common/dense_mlp.py")
"""The files (under ``sglang/``) whose behaviour the kit models, in the order of ``_RECORD``."""

_RECORD = {  # each release's RECORD sha256 (urlsafe base64, as RECORD writes it) of FILES, in that order
    "0.5.16": ("cG31xjfFsJLCRtC_lWBWBMMzKYgPKSwGFEHEye14jGk", "NoIhvscqjHXpAORrdv2AxsFaGt-Sm54GloTBWcibrO4",
               "_gJEER4FYCl26QXwSPLZtHtiFXpsWhqqev062y296EY", "q9PiZEwLoHOawaxc0VtDdkwf0KIQb-YQ4MbIQQWVBcE",
               "AXBybAG0HyF2Rs0kvdnPRE3HGAMu9g0MwmlDuCE7EN8", "gBKaoho9C8nqBnioAYKn3Op2OfUhny7f_-_SnSLxPvc",
               "2bO5X_JPqgl65eEIzXI4jikemJIR8MUY7jB5YxsJwo8", "d0Z_scZPlDtkMWdR0Qm2GqUQE3PklYsmB2_eyBiTPdw"),
    "0.5.17": ("cG31xjfFsJLCRtC_lWBWBMMzKYgPKSwGFEHEye14jGk", "NoIhvscqjHXpAORrdv2AxsFaGt-Sm54GloTBWcibrO4",
               "_drt4uxt_wNvgsI2_Q41aNzV6cTlO46tfe5uAdrCxz4", "q9PiZEwLoHOawaxc0VtDdkwf0KIQb-YQ4MbIQQWVBcE",
               "-VXN8suf2NxcHynyVLxpyvNRfAEYwJNUKTefBOe5xzM", "iHLmirdNJBM89C16syMgUYamHzdiYlI62OilYLua-b4",
               "2bO5X_JPqgl65eEIzXI4jikemJIR8MUY7jB5YxsJwo8", "YyQyvE26TS6ddZN3eu4Ar3RrLaRI0NDn4wtCTBGzD1k"),
    "0.5.18": ("cG31xjfFsJLCRtC_lWBWBMMzKYgPKSwGFEHEye14jGk", "NoIhvscqjHXpAORrdv2AxsFaGt-Sm54GloTBWcibrO4",
               "bCuUuSpF6-_NLj5LXI-dKn1Ulu-LmIMqLRBmf2HFBbE", "q9PiZEwLoHOawaxc0VtDdkwf0KIQb-YQ4MbIQQWVBcE",
               "-VXN8suf2NxcHynyVLxpyvNRfAEYwJNUKTefBOe5xzM", "MRS7vDdjbFK2zrj8-zcN_XM1iRFI745iuXhQ8Ejv1AA",
               "2bO5X_JPqgl65eEIzXI4jikemJIR8MUY7jB5YxsJwo8", "YyQyvE26TS6ddZN3eu4Ar3RrLaRI0NDn4wtCTBGzD1k"),
    "0.5.19": ("cG31xjfFsJLCRtC_lWBWBMMzKYgPKSwGFEHEye14jGk", "NoIhvscqjHXpAORrdv2AxsFaGt-Sm54GloTBWcibrO4",
               "_JcNfre3SbWmIRi9gQvnvNOZXHaA0ZzNRKi7xbSnhVg", "q9PiZEwLoHOawaxc0VtDdkwf0KIQb-YQ4MbIQQWVBcE",
               "-VXN8suf2NxcHynyVLxpyvNRfAEYwJNUKTefBOe5xzM", "n4Y62voe623zsTb9JdxkDGdRGPdqrfkSIHCQ_yQDV-s",
               "2bO5X_JPqgl65eEIzXI4jikemJIR8MUY7jB5YxsJwo8", "YyQyvE26TS6ddZN3eu4Ar3RrLaRI0NDn4wtCTBGzD1k"),
    "0.5.20": ("cG31xjfFsJLCRtC_lWBWBMMzKYgPKSwGFEHEye14jGk", "NoIhvscqjHXpAORrdv2AxsFaGt-Sm54GloTBWcibrO4",
               "_JcNfre3SbWmIRi9gQvnvNOZXHaA0ZzNRKi7xbSnhVg", "q9PiZEwLoHOawaxc0VtDdkwf0KIQb-YQ4MbIQQWVBcE",
               "KfhQvn-Vwz4QSJBsjPiMhJt6S8t8LX4R_orZbgaBeAQ", "ANBv7Cd66ERlnlYGyyuDuKe8qmwoIXZVfEgUYFP5MmE",
               "2bO5X_JPqgl65eEIzXI4jikemJIR8MUY7jB5YxsJwo8", "cX9hA7bRk3fRKimyNzVL17_zVFc87-hdGwidnf1oKvM"),
    "0.5.21": ("cG31xjfFsJLCRtC_lWBWBMMzKYgPKSwGFEHEye14jGk", "NoIhvscqjHXpAORrdv2AxsFaGt-Sm54GloTBWcibrO4",
               "UEc2OH61Vn4Btavz82fr-2Wp_DkaoaSRGBYa4rz2IeY", "q9PiZEwLoHOawaxc0VtDdkwf0KIQb-YQ4MbIQQWVBcE",
               "oygYfG5Sqdq5vYhL3aFLxMAAQzbUGbcXb5my5RKbkwY", "jhn61a4usWyHEt70XhYZpFZAjMKotkRdgmU-7n1iMQo",
               "2bO5X_JPqgl65eEIzXI4jikemJIR8MUY7jB5YxsJwo8", "cX9hA7bRk3fRKimyNzVL17_zVFc87-hdGwidnf1oKvM"),
    "0.5.22": ("cG31xjfFsJLCRtC_lWBWBMMzKYgPKSwGFEHEye14jGk", "NoIhvscqjHXpAORrdv2AxsFaGt-Sm54GloTBWcibrO4",
               "KxmNQFpCdUL0OwSpKB1lapPZsyPyOVG4uCRcv6n1f8Q", "q9PiZEwLoHOawaxc0VtDdkwf0KIQb-YQ4MbIQQWVBcE",
               "kvUNvuJpMiEnESu8lWffkffX-pOsYu5BihblAg4kFp8", "4k9rv_0LhEtQn1aLcYwXi7zNiQ388tVxxLJL8i0Uz3M",
               "VsPh1e-UxyEewcXG3iJ0Gn5syvTOJYVzu02zZkYxV0E", "_l5hf1liKglz0fKHkEy7YE4vES4Wgm-oWWqm3i4Asok"),
    "0.5.23": ("3Th146uMeXGWp27WapAMt4shVILcDnbaWuEcgxV8O4Q", "NoIhvscqjHXpAORrdv2AxsFaGt-Sm54GloTBWcibrO4",
               "74getwovqqIBoZdYQE9LUKQqas_lqJ0RZcec6MPPbAs", "q9PiZEwLoHOawaxc0VtDdkwf0KIQb-YQ4MbIQQWVBcE",
               "GKo1EAwLxeEsYg3vj9is19lQqm29kDf1RQK0BhKV_MQ", "fg5ZSN_BuFVbwF5ZBRq2st02o_bcSUPF3WuYlXU09eE",
               "VsPh1e-UxyEewcXG3iJ0Gn5syvTOJYVzu02zZkYxV0E", "myugIsWfcXw7RPaxGitlSRk9I4ac56gSpMrBgi3t6RY"),
}

V1_CLASS, V2_CLASS = "InklingBatchDenseMLPWithLoRA", "InklingBatchDenseMLPWithLoRAV2"

_V1_UNTIL_0_5_22 = (
    "srt/models/inkling_common/lora.py (byte-identical 0.5.16 to 0.5.22): InklingBatchDenseMLPWithLoRA only; "
    "is_shared_fused_moe = True on the class and no class-level set_lora (so a module before initialize_lora "
    "has no set_lora at all); lora_manager.py LoRAManager.init_lora_modules turns the sink into it by "
    "assigning module.__class__, then calls initialize_lora")
_V1_V2_0_5_23 = (
    "srt/models/inkling_common/lora.py: InklingBatchDenseMLPWithLoRA and InklingBatchDenseMLPWithLoRAV2 (the "
    "dense engine); both say set_lora = False and is_shared_fused_moe = False on the class and set "
    "is_shared_fused_moe = True in initialize_lora; models/inkling_common/moe.py builds the sink as the V2 "
    "class when --lora-backend is triton_v2, else as the first, and init_lora_modules only calls initialize_lora")

_TARGETS = ("srt/lora/utils.py: get_normalized_target_modules, the same in every release: the last name part, "
            "gate_proj/up_proj -> gate_up_proj, q/k/v_proj -> qkv_proj (w1/w3/w2 not renamed); 'all' or "
            "'all-linear' -> {'all'}, any other string a ValueError")
_NORMALIZATION = ("srt/lora/lora.py (byte-identical 0.5.16 to 0.5.23): LoRAAdapter._normalize_shared_expert_moe, "
                  "_rename_expert_w_to_proj, normalize_gate_up_proj")
_WRAP = ("lora_manager.py: LoRAManager.init_lora_modules wraps the InklingBatchDenseMLP sink only when the server's "
         "target modules hold gate_up_proj and down_proj (the same condition in every release)")
_POOL = ("mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer: one lora_alpha / r, B times the scaling in the "
         "adapter's dtype, the buffer views asserted against the weights, the skip warning (--lora-strict-loading: "
         "ValueError) whose weights stay in the layers, so that its per-layer loop then raises get_target_module_name's "
         "ValueError (utils.py) on the first of them, flat sink factors to the shared-MoE buffers, named per-expert ones as dicts; the sink's "
         "slice_moe_lora_a/b_weights get the MoE tp rank")
_POOL_0_5_23 = (_POOL + "; new in 0.5.23: an indexed shared-expert weight (shared_experts.<e>.) on a layer whose sink "
                "is not wrapped is a ValueError ('... has no matching target for indexed shared-expert weights'); "
                "before, it fell through to the routed experts' branch (experts.<e>. matches it)")
_DOCTOR = {
    "ISL-W101": "srt/lora/lora.py LoRAAdapter.__init__ (scaling lora_alpha / r)",
    "ISL-W102": "srt/lora/lora_config.py LoRAConfig (reads no alpha_pattern)",
    "ISL-W103": _WRAP,
    "ISL-W105": "lora.py LoRAAdapter.__init__ and mem_pool.py load_lora_weight_to_buffer (no value checked)",
    "ISL-W106": "lora.py _rename_expert_w_to_proj and mem_pool.py load_lora_weight_to_buffer (int(expert index))",
    "ISL-W107": "lora_config.py LoRAConfig (reads no init_lora_weights)",
    "ISL-W108": "lora_config.py LoRAConfig (reads no lora_bias)",
    "ISL-W109": "lora_config.py LoRAConfig (reads no modules_to_save)",
    "ISL-W111": "lora_config.py LoRAConfig (reads no fan_in_fan_out)",
    "ISL-W112": "lora_config.py LoRAConfig (reads no rank_pattern)",
    "ISL-W002": ("mem_pool.py load_lora_weight_to_buffer (the skip warning; the weights it names stay, and its "
                 "per-layer loop raises ISL-E036 on the first of them), the same in every release"),
    "ISL-W113": ("models/inkling_common/dense_mlp.py InklingBatchDenseMLP._swiglu: silu_and_mul(_triton) in every "
                 "release, whatever hidden_act"),
    "ISL-W001": ("srt/lora/trtllm_lora_temp/inkling_dense.py _apply_per_expert_lora, the same call in every release "
                 "(0.5.22 changed only its import paths); measured on 0.5.23's kernels (docs/reference.md#per-expert-defect), whose "
                 "virtual_experts.py differs from 0.5.16's and from 0.5.17-0.5.22's"),
}
"""What each of the doctor's findings about sglang rests on; every file named is the same
in this respect in every release (lora.py and lora_config.py are byte-identical 0.5.16
to 0.5.23)."""


@dataclass(frozen=True)
class Release:
    """One sglang release with the shared sink, as the kit models it.

    ``generations``: ``("v1",)`` or ``("v1", "v2")``; ``wrappers``: where they come from;
    ``targets``, ``normalization``, ``pool``: what the release does at those steps
    (file, function, fact); ``doctor``: finding code -> what it rests on in this
    release; ``record``: file (of ``FILES``) -> its RECORD sha256.
    """

    version: str
    generations: tuple[str, ...]
    wrappers: str
    targets: str
    normalization: str
    pool: str
    doctor: dict[str, str]
    record: dict[str, str]

    @property
    def label(self) -> str:
        return f"sglang {self.version}"

    def has(self, generation: str) -> bool:
        return generation in self.generations

    @property
    def raises(self) -> tuple[str, ...]:
        """The catalog codes this release raises (or the kit raises when modelling it)."""
        return tuple(e.code for e in ENTRIES if e.releases and self.version in e.releases)

    def raises_code(self, code: str) -> bool:
        return code in self.raises

    def summary(self) -> str:
        """A few lines for a report: the generations and what differs from the default."""
        gens = " and ".join({"v1": f"{V1_CLASS} (v1)", "v2": f"{V2_CLASS} (v2)"}[g] for g in self.generations)
        return f"{self.label}: {gens}; {self.wrappers}"


def _release(version: str) -> Release:
    new = version == "0.5.23"
    return Release(version=version, generations=("v1", "v2") if new else ("v1",),
                   wrappers=_V1_V2_0_5_23 if new else _V1_UNTIL_0_5_22, targets=_TARGETS,
                   normalization=_NORMALIZATION, pool=_POOL_0_5_23 if new else _POOL, doctor=dict(_DOCTOR),
                   record=dict(zip(FILES, _RECORD[version])))


TABLE: dict[str, Release] = {v: _release(v) for v in RELEASES}
"""Every release with the shared sink, oldest first."""


def release(version: str | Release | None = None) -> Release:
    """The release ``version`` (``"0.5.22"``, ``"v0.5.22"``, ``"sglang==0.5.22"``; ``None``:
    the default, 0.5.23). Raises ``ValueError`` naming the known releases otherwise."""
    if isinstance(version, Release):
        return version
    text = DEFAULT if version is None else str(version).strip()
    text = text.removeprefix("sglang").lstrip("=").removeprefix("v").strip()
    if text in TABLE:
        return TABLE[text]
    known = ", ".join(TABLE)
    try:
        parts = tuple(int(p) for p in text.split("."))
    except ValueError:
        parts = ()
    if parts and parts < (0, 5, 16):
        raise ValueError(f"sglang {text} has no shared-sink LoRA (srt/models/inkling_common/lora.py first appears "
                         f"in 0.5.16); the kit knows {known}")
    raise ValueError(f"sglang {text!r} is not a release the kit knows; known: {known} (a newer wheel: "
                     "inkling-lab selfcheck --wheel PATH says what differs)")


def closest(record: dict[str, str]) -> tuple[Release, list[str]]:
    """The known release whose ``FILES`` hashes match ``record`` best, and the files that
    differ from it (``[]``: the wheel is that release, as far as the kit reads it)."""
    def differing(r: Release) -> list[str]:
        return [f for f in FILES if record.get(f) != r.record[f]]
    best = min(reversed(list(TABLE.values())), key=lambda r: len(differing(r)))
    return best, differing(best)


def span(versions: tuple[str, ...] | list[str]) -> str:
    """``("0.5.16", ..., "0.5.23")`` -> ``"0.5.16 to 0.5.23"``; a gap lists them."""
    order = list(TABLE)
    at = [order.index(v) for v in versions]
    if not at:
        return "no release"
    if len(at) == 1:
        return versions[0]
    if at == list(range(at[0], at[-1] + 1)):
        return f"{versions[0]} to {versions[-1]}"
    return ", ".join(versions)


def raised_line(entry: Any, version: str | Release | None = None) -> str:
    """One line on whether release ``version`` raises catalog ``entry`` (for ``explain``'s
    first line): sglang's own words it writes or not, the kit's own ones whatever the release."""
    r = release(version)
    here = r.version in entry.releases
    if not entry.by_upstream and entry.kind in ("warning", "finding"):
        return (f"{r.label}: {entry.code} is the kit's {entry.kind} about what sglang {span(entry.releases)} does"
                + ("" if here else f", not {r.version}"))
    if not entry.by_upstream:
        return (f"{r.label}: {entry.code} is the kit's own {entry.kind} (inkling_lab), the same whichever release "
                "you serve with")
    if here:
        return f"{r.label} raises this ({entry.code} is raised by sglang {span(entry.releases)})"
    if not entry.releases:
        return (f"{r.label} does not raise this: no release from {RELEASES[0]} to {RELEASES[-1]} writes "
                f"{entry.code}'s words (another revision of the file does)")
    which = "that release" if len(entry.releases) == 1 else "one of those"
    return (f"{r.label} does not raise this: {entry.code} is raised by sglang {span(entry.releases)} only; if your "
            f"server printed it, it runs {which}, not {r.version}")
