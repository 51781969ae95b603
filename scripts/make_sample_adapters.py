"""Generate data/adapters/: small synthetic PEFT adapters for the toy sink
(n=2 shared experts, H=8, F=6), from fixed seeds.

    .venv/bin/python scripts/make_sample_adapters.py [--out data/adapters]

Good adapters in every naming and layout of SPEC §6, adapters the converter repairs
(each repair reported), and broken ones, each made to trigger one catalog error.
Writes MANIFEST.json (what each sample is and what the doctor says about it; the
tests read it) and the table in data/README.md between its markers. Never edit
data/adapters/ by hand: change this script and run it again.
"""
from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from inkling_lab.adapters import CONFIG_FILE, WEIGHTS_FILE, Adapter, save_adapter, synthetic_adapter
from inkling_lab.atomic import atomic_write

ROOT = Path(__file__).resolve().parents[1]
N, H, F = 2, 8, 6
"""The toy sink every sample is checked against (``PRESETS["toy"]``)."""
MODULE = "base_model.model.model.layers.0.mlp.shared_experts"
BEGIN, END = "<!-- samples:begin (scripts/make_sample_adapters.py writes this table) -->", "<!-- samples:end -->"


def toy(rank: int = 4, seed: int = 0, **kw) -> Adapter:
    return synthetic_adapter(N, H, F, rank, seed=seed, **kw)


def with_weights(adapter: Adapter, change: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]) -> Adapter:
    """The adapter with its tensors changed (checks skipped: broken ones are the point)."""
    return Adapter(adapter.name, adapter.r, adapter.lora_alpha, adapter.target_modules,
                   change(dict(adapter.weights)), adapter.config)


def without(adapter: Adapter, fragment: str) -> Adapter:
    """The adapter without the tensors whose key contains ``fragment``."""
    return with_weights(adapter, lambda w: {k: v for k, v in w.items() if fragment not in k})


def key(proj: str, ab: str, expert: int | None = None) -> str:
    return f"{MODULE}{'' if expert is None else f'.{expert}'}.{proj}.lora_{ab}.weight"


def mixed_outer() -> Adapter:
    per_expert, flat = toy(seed=11, per_expert=True), toy(seed=12)
    weights = {k: v for k, v in per_expert.weights.items() if ".down_proj." not in k}
    weights.update({k: v for k, v in flat.weights.items() if ".down_proj." in k})
    return with_weights(flat, lambda _: weights)


@dataclass(frozen=True)
class Sample:
    name: str
    kind: str  # good | repaired | broken
    made: str
    shows: str
    build: Callable[[], Adapter]
    code: str | None = None  # the catalog code the doctor reports first (error, repair, note or warning)
    damage: Callable[[Path], None] | None = None  # what is done to the folder after saving

    @property
    def doctor(self) -> str:
        return f"inkling-lab doctor data/adapters/{self.name} -n {N} --hidden {H} --intermediate {F}"


def _truncate(folder: Path) -> None:
    weights = folder / WEIGHTS_FILE
    atomic_write(weights, weights.read_bytes()[:120])


def _rewrite_config(**changes) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        config = json.loads((folder / CONFIG_FILE).read_text())
        atomic_write(folder / CONFIG_FILE, (json.dumps({**config, **changes}, indent=2, sort_keys=True) + "\n").encode())
    return damage


SAMPLES = [
    Sample("gate_up", "good", "gate_proj, up_proj, down_proj, flat; r=4, lora_alpha=8; layers 0 and 1",
           "the plain PEFT layout: shared outer (O=1), two layers", lambda: toy(4, 1, layers=(0, 1))),
    Sample("fused", "good", "gate_up_proj, down_proj, flat; r=4", "a fused gate/up: its A serves both halves",
           lambda: toy(4, 2, naming="fused")),
    Sample("w_names", "good", "w1, w3, w2, flat; r=2", "the w-names, renamed to gate/up/down; a smaller rank",
           lambda: toy(2, 3, naming="w")),
    Sample("rank8", "good", "gate_proj, up_proj, down_proj, flat; r=8, lora_alpha=4",
           "a larger rank: converted with the others, every slot is padded to R=8", lambda: toy(8, 4, lora_alpha=4)),
    Sample("per_expert", "good", "shared_experts.<e>.gate_proj/up_proj/down_proj, one factor per expert; r=4",
           "the per-expert outer layout (O=n): it loads, but sglang 0.5.23 computes its gate/up delta wrongly",
           lambda: toy(4, 5, per_expert=True), "ISL-W001"),
    Sample("per_expert_fused", "good", "shared_experts.<e>.gate_up_proj and down_proj per expert; r=2",
           "per-expert outer with fused gate/up (the same warning)", lambda: toy(2, 6, naming="fused", per_expert=True),
           "ISL-W001"),
    Sample("gate_only", "good", "gate_proj and down_proj only; r=4",
           "a gate without an up gets a zero up (SPEC §6 step 3)",
           lambda: without(toy(4, 7), ".up_proj."),
           "ISL-N203"),
    Sample("transposed", "repaired", "like gate_up, with down_proj.lora_A saved transposed [n*F, r]",
           "the loader transposes it back and reports it",
           lambda: with_weights(toy(4, 8), lambda w: {**w, key("down_proj", "A"): w[key("down_proj", "A")].T}),
           "ISL-K206"),
    Sample("up_only", "repaired", "up_proj and down_proj only",
           "sglang would drop the up LoRA silently; the converter stacks it with a zero gate",
           lambda: without(toy(4, 9), ".gate_proj."),
           "ISL-K211"),
    Sample("mixed_outer", "repaired", "gate/up factors per expert, down factors flat",
           "the shared down B is given to every expert (exact)", mixed_outer, "ISL-K212"),
    Sample("no_config", "broken", "gate_up without adapter_config.json", "a folder without its config",
           lambda: toy(4, 20), "ISL-K201", lambda d: (d / CONFIG_FILE).unlink()),
    Sample("bad_config", "broken", 'gate_up with "r": "four" in the config', "a malformed config",
           lambda: toy(4, 21), "ISL-K202", _rewrite_config(r="four")),
    Sample("no_weights", "broken", "gate_up without adapter_model.safetensors",
           "a folder without its weights (pickles are never read)", lambda: toy(4, 22), "ISL-K203",
           lambda d: (d / WEIGHTS_FILE).unlink()),
    Sample("truncated", "broken", "gate_up with the weights file cut to 120 bytes", "a truncated download",
           lambda: toy(4, 23), "ISL-K204", _truncate),
    Sample("expert_axis_3d", "broken", "down_proj.lora_A saved as [r, n, F] (3D)",
           "a factor that is not a plain PEFT matrix",
           lambda: with_weights(toy(4, 24), lambda w: {**w, key("down_proj", "A"): w[key("down_proj", "A")].reshape(4, N, F)}),
           "ISL-K205"),
    Sample("wrong_r", "broken", 'gate_up (rank 4) with "r": 8 in the config', "a config that does not match the factors",
           lambda: toy(4, 25), "ISL-K206", _rewrite_config(r=8)),
    Sample("typo_name", "broken", "gate_proj misspelled gate_prj", "a name that is no shared-sink projection",
           lambda: with_weights(toy(4, 26), lambda w: {k.replace("gate_proj", "gate_prj"): v for k, v in w.items()}),
           "ISL-K207"),
    Sample("attention_only", "broken", "q_proj and v_proj factors only", "an adapter that does not train the sink",
           lambda: with_weights(toy(4, 27), lambda w: {k.replace("mlp.shared_experts.gate_proj", "self_attn.q_proj")
                                                          .replace("mlp.shared_experts.up_proj", "self_attn.v_proj"): v
                                                      for k, v in w.items() if "down_proj" not in k}),
           "ISL-K208"),
    Sample("missing_b", "broken", "gate_up without down_proj.lora_B", "an A without its B",
           lambda: without(toy(4, 28), key("down_proj", "B")),
           "ISL-K209"),
    Sample("three_experts", "broken", "flat factors for n=3 experts of F=5 (widths 15)",
           "flat factors that do not split into n=2: upstream's raw reshape error",
           lambda: synthetic_adapter(3, H, 5, 4, seed=29), "ISL-E012"),
    Sample("per_expert_three", "broken", "per-expert factors for experts 0, 1, 2",
           "per-expert factors for another number of experts",
           lambda: synthetic_adapter(3, H, F, 4, per_expert=True, seed=30), "ISL-K210"),
    Sample("hidden16", "broken", "gate_up for a model of hidden size 16", "an adapter for another model: "
           "upstream's assertion when it is loaded", lambda: synthetic_adapter(N, 16, F, 4, seed=31), "ISL-E016"),
]


def write_samples(out: Path) -> list[dict]:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    manifest = []
    for s in SAMPLES:
        adapter = s.build()
        adapter.name = s.name
        folder = save_adapter(adapter, out / s.name)
        if s.damage is not None:
            s.damage(folder)
        manifest.append({"name": s.name, "kind": s.kind, "made": s.made, "shows": s.shows, "code": s.code,
                         "doctor": s.doctor, "sink": {"n_shared_experts": N, "hidden": H, "intermediate": F}})
    atomic_write(out / "MANIFEST.json", (json.dumps(manifest, indent=2) + "\n").encode())
    return manifest


def readme_table(manifest: list[dict]) -> str:
    rows = ["| sample | kind | how it was made | what it shows | doctor reports |", "|---|---|---|---|---|"]
    rows += [f"| `{m['name']}` | {m['kind']} | {m['made']} | {m['shows']} | {m['code'] or 'loads, no finding'} |"
             for m in manifest]
    return "\n".join(rows)


def update_readme(readme: Path, table: str) -> None:
    text = readme.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    atomic_write(readme, f"{head}{BEGIN}\n{table}\n{END}{tail}".encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "adapters")
    parser.add_argument("--readme", type=Path, default=ROOT / "data" / "README.md")
    args = parser.parse_args()
    manifest = write_samples(args.out)
    if args.readme.exists():
        update_readme(args.readme, readme_table(manifest))
    print(f"wrote {len(manifest)} sample adapters to {args.out}")


if __name__ == "__main__":
    main()
