"""Generate data/adapters/: small synthetic PEFT adapters for the toy sink
(n=2 shared experts, H=8, F=6), from fixed seeds.

    .venv/bin/python scripts/data/make_sample_adapters.py [--out data/adapters]

Good adapters in every naming and layout of SPEC §6, adapters the converter repairs
(each repair reported), adapters sglang 0.5.23 serves wrongly (each case of the
doctor's catalog: rsLoRA, alpha/rank patterns, one-sided targets, ...), and broken
ones, each made to trigger one catalog error. Writes MANIFEST.json (what each sample
is and the doctor's documented verdicts; the tests read it) and the table in
data/README.md between its markers. Never edit data/adapters/ by hand: change this
script and run it again.
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

ROOT = Path(__file__).resolve().parents[2]
N, H, F = 2, 8, 6
"""The toy sink every sample is checked against (``PRESETS["toy"]``)."""
MODULE = "base_model.model.model.layers.0.mlp.shared_experts"
BEGIN, END = "<!-- samples:begin (scripts/data/make_sample_adapters.py writes this table) -->", "<!-- samples:end -->"


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


def with_config(adapter: Adapter, **changes) -> Adapter:
    """The adapter with its config fields changed (checks skipped)."""
    config = {**adapter.config, **changes}
    return Adapter(adapter.name, config["r"], config["lora_alpha"], config["target_modules"], dict(adapter.weights),
                   config)


def attention(rank: int, seed: int) -> dict[str, torch.Tensor]:
    """q_proj and v_proj factors of layer 0 (another module, outside the sink)."""
    gen = torch.Generator().manual_seed(seed)
    return {f"base_model.model.model.layers.0.self_attn.{p}.lora_{ab}.weight": torch.randn(shape, generator=gen)
            for p in ("q_proj", "v_proj") for ab, shape in (("A", (rank, H)), ("B", (H, rank)))}


def up_rank16() -> Adapter:
    """r=8, but up A and up B saved at rank 16 (two factors of the wrong rank)."""
    a, big = toy(8, 40), toy(16, 41)
    return with_weights(a, lambda w: {**w, key("up_proj", "A"): big.weights[key("up_proj", "A")],
                                      key("up_proj", "B"): big.weights[key("up_proj", "B")]})


def rank_pattern() -> Adapter:
    """The sink at rank 8 by rank_pattern, attention at the config's r=4."""
    sink = toy(8, 42)
    adapter = with_weights(sink, lambda w: {**w, **attention(4, 43)})
    return with_config(adapter, r=4, lora_alpha=8.0, rank_pattern={"gate_proj": 8, "up_proj": 8, "down_proj": 8},
                       target_modules=["gate_proj", "up_proj", "down_proj", "q_proj", "v_proj"])


def duplicate(rename: Callable[[str], str], seed: int, per_expert: bool = False) -> Adapter:
    """A rank-4 adapter with a second key for some factors (other values: which is meant is unknown)."""
    adapter, other = toy(4, seed, per_expert=per_expert), toy(4, seed + 1, per_expert=per_expert)
    extra = {rename(k): other.weights[k].clone() for k in adapter.weights if rename(k) != k}
    return with_weights(adapter, lambda w: {**w, **extra})


def _named_adapters(folder: Path) -> None:
    """PEFT's save of two named adapters: each in a subfolder of its name, none at the top."""
    (folder / "math").mkdir()
    for f in (CONFIG_FILE, WEIGHTS_FILE):
        (folder / f).rename(folder / "math" / f)
    save_adapter(toy(4, 45), folder / "code")


def _pickled(folder: Path) -> None:
    """Only adapter_model.bin, as torch.save writes it (the safetensors file removed)."""
    from safetensors.torch import load_file

    weights = folder / WEIGHTS_FILE
    torch.save(load_file(str(weights)), folder / "adapter_model.bin")
    weights.unlink()


def _infinite_alpha(folder: Path) -> None:
    """lora_alpha written as 1e400, which JSON readers take as infinity."""
    config = json.loads((folder / CONFIG_FILE).read_text())
    text = json.dumps({**config, "lora_alpha": 1.0}, indent=2, sort_keys=True).replace('"lora_alpha": 1.0',
                                                                                   '"lora_alpha": 1e400')
    atomic_write(folder / CONFIG_FILE, (text + "\n").encode())


@dataclass(frozen=True)
class Sample:
    name: str
    kind: str  # good | repaired | served wrong (the kit writes it, sglang 0.5.23 does not serve its math) | broken
    made: str
    shows: str
    build: Callable[[], Adapter]
    code: str | None = None  # the catalog code the doctor reports first (error, repair, note or warning)
    damage: Callable[[Path], None] | None = None  # what is done to the folder after saving
    verdict: tuple[str, str, str] = ("loads", "adapter", "writes")
    """The doctor's three verdicts: sglang loads/raises/unknown; computes adapter/different/base/nan/
    nothing/unknown; the kit writes/refuses. Exit status 0 only for ("loads", "adapter", _)."""

    @property
    def exit_status(self) -> int:
        return 0 if self.verdict[:2] == ("loads", "adapter") else 1

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
    Sample("w_names", "served wrong", "w1, w3, w2, flat; r=2; target_modules w1, w3, w2",
           "the w-names: the kit renames them, but sglang does not map w1/w3/w2 target modules, and Inkling's model "
           "has no LoRA buffer for w1, w2 or w3, so the server does not start (get_hidden_dim)",
           lambda: toy(2, 3, naming="w"), "ISL-E038", verdict=("raises", "nothing", "writes")),
    Sample("rank8", "good", "gate_proj, up_proj, down_proj, flat; r=8, lora_alpha=4",
           "a larger rank: converted with the others, every slot is padded to R=8", lambda: toy(8, 4, lora_alpha=4)),
    Sample("per_expert", "good", "shared_experts.<e>.gate_proj/up_proj/down_proj, one factor per expert; r=4",
           "the per-expert outer layout (O=n): it loads, but sglang 0.5.23 computes its gate/up delta wrongly",
           lambda: toy(4, 5, per_expert=True), "ISL-W001", verdict=("loads", "different", "writes")),
    Sample("per_expert_fused", "good", "shared_experts.<e>.gate_up_proj and down_proj per expert; r=2",
           "per-expert outer with fused gate/up (the same warning)", lambda: toy(2, 6, naming="fused", per_expert=True),
           "ISL-W001", verdict=("loads", "different", "writes")),
    Sample("gate_only", "good", "gate_proj and down_proj only; r=4",
           "a gate without an up gets a zero up (SPEC §6 step 3)",
           lambda: without(toy(4, 7), ".up_proj."),
           "ISL-N203"),
    Sample("transposed", "repaired", "like gate_up, with down_proj.lora_A saved transposed [n*F, r]",
           "the converter transposes it back and reports it (exact); sglang 0.5.23 reads it as saved and fails the "
           "buffer load",
           lambda: with_weights(toy(4, 8), lambda w: {**w, key("down_proj", "A"): w[key("down_proj", "A")].T}),
           "ISL-K206", verdict=("raises", "nothing", "writes")),
    Sample("up_only", "repaired", "up_proj and down_proj only",
           "sglang's buffer load fails on the lone up_proj (it matches no target module); the converter stacks it "
           "with a zero gate", lambda: without(toy(4, 9), ".gate_proj."),
           "ISL-K211", verdict=("raises", "nothing", "writes")),
    Sample("mixed_outer", "repaired", "gate/up factors per expert, down factors flat",
           "the shared down B is given to every expert (exact); sglang 0.5.23 fills it into expert 0 only",
           mixed_outer, "ISL-K212", verdict=("loads", "different", "writes")),
    Sample("no_config", "broken", "gate_up without adapter_config.json", "a folder without its config",
           lambda: toy(4, 20), "ISL-K201", lambda d: (d / CONFIG_FILE).unlink(), ("raises", "nothing", "refuses")),
    Sample("bad_config", "broken", 'gate_up with "r": "four" in the config', "a malformed config",
           lambda: toy(4, 21), "ISL-K202", _rewrite_config(r="four"), ("raises", "nothing", "refuses")),
    Sample("no_weights", "broken", "gate_up without adapter_model.safetensors",
           "a folder without its weights", lambda: toy(4, 22), "ISL-K203",
           lambda d: (d / WEIGHTS_FILE).unlink(), ("raises", "nothing", "refuses")),
    Sample("truncated", "broken", "gate_up with the weights file cut to 120 bytes", "a truncated download",
           lambda: toy(4, 23), "ISL-K204", _truncate, ("raises", "nothing", "refuses")),
    Sample("expert_axis_3d", "broken", "down_proj.lora_A saved as [r, n, F] (3D)",
           "a factor that is not a plain PEFT matrix",
           lambda: with_weights(toy(4, 24), lambda w: {**w, key("down_proj", "A"): w[key("down_proj", "A")].reshape(4, N, F)}),
           "ISL-K205", verdict=("raises", "nothing", "refuses")),
    Sample("wrong_r", "broken", 'gate_up (rank 4) with "r": 8 in the config',
           "a config that does not match the factors (--repair reads r=4 from them)",
           lambda: toy(4, 25), "ISL-K310", _rewrite_config(r=8), ("raises", "nothing", "refuses")),
    Sample("typo_name", "broken", "gate_proj misspelled gate_prj", "a name that is no shared-sink projection",
           lambda: with_weights(toy(4, 26), lambda w: {k.replace("gate_proj", "gate_prj"): v for k, v in w.items()}),
           "ISL-K207", verdict=("raises", "nothing", "refuses")),
    Sample("attention_only", "broken", "q_proj and v_proj factors only", "an adapter that does not train the sink",
           lambda: with_weights(toy(4, 27), lambda w: {k.replace("mlp.shared_experts.gate_proj", "self_attn.q_proj")
                                                          .replace("mlp.shared_experts.up_proj", "self_attn.v_proj"): v
                                                      for k, v in w.items() if "down_proj" not in k}),
           "ISL-K208", verdict=("raises", "nothing", "refuses")),
    Sample("missing_b", "broken", "gate_up without down_proj.lora_B", "an A without its B",
           lambda: without(toy(4, 28), key("down_proj", "B")),
           "ISL-K209", verdict=("loads", "different", "refuses")),
    Sample("three_experts", "broken", "flat factors for n=3 experts of F=5 (widths 15)",
           "flat factors that do not split into n=2: upstream's raw reshape error",
           lambda: synthetic_adapter(3, H, 5, 4, seed=29), "ISL-E012", verdict=("raises", "nothing", "refuses")),
    Sample("per_expert_three", "broken", "per-expert factors for experts 0, 1, 2",
           "per-expert factors for another number of experts",
           lambda: synthetic_adapter(3, H, F, 4, per_expert=True, seed=30), "ISL-K210",
           verdict=("unknown", "unknown", "refuses")),
    Sample("hidden16", "broken", "gate_up for a model of hidden size 16", "an adapter for another model: "
           "upstream's assertion when it is loaded", lambda: synthetic_adapter(N, 16, F, 4, seed=31), "ISL-E016",
           verdict=("raises", "nothing", "refuses")),
    # -- what sglang 0.5.23 serves other than the adapter's math (issue 12) --------------
    Sample("rslora", "served wrong", "gate_up with use_rslora: true; r=4, lora_alpha=8",
           "PEFT scales by alpha/sqrt(r) = 4, sglang by alpha/r = 2: served sqrt(r) = 2 times too weak",
           lambda: with_config(toy(4, 50), use_rslora=True), "ISL-W101", verdict=("loads", "different", "writes")),
    Sample("alpha_pattern", "served wrong", 'gate_up with alpha_pattern {"down_proj": 32}; lora_alpha=8',
           "sglang ignores alpha_pattern: down is served 4 times too weak; the converter honours it",
           lambda: with_config(toy(4, 51), alpha_pattern={"down_proj": 32}), "ISL-W102",
           verdict=("loads", "different", "writes")),
    Sample("rank_pattern", "served wrong", "the sink at rank 8 by rank_pattern, attention q/v at r=4",
           "sglang does not start, as Inkling's model has no LoRA buffer for the attention's qkv_proj "
           "(get_hidden_dim), and reads one r=4 for every module; the converter honours each module's rank "
           "(changing r would break the attention factors)", rank_pattern, "ISL-W112", verdict=("raises", "nothing", "writes")),
    Sample("up_rank16", "broken", "r=8, but up A [16, 8] and up B [12, 16] saved at rank 16",
           "both wrong-rank factors reported, as saved", up_rank16, "ISL-K206", verdict=("raises", "nothing", "refuses")),
    Sample("one_sided", "served wrong", "gate_proj and up_proj only, target_modules gate_proj, up_proj",
           "without down_proj in the targets sglang never wraps the sink: the base model is served",
           lambda: with_config(without(toy(4, 52), ".down_proj."), target_modules=["gate_proj", "up_proj"]),
           "ISL-W103", verdict=("loads", "base", "writes")),
    Sample("dora", "broken", "gate_up with use_dora: true and lora_magnitude_vector tensors",
           "sglang refuses DoRA; so does the converter (a pool cannot hold the magnitudes)",
           lambda: with_config(with_weights(toy(4, 53), lambda w: {
               **w, **{f"{MODULE}.{p}.lora_magnitude_vector": torch.ones(N * F if p != "down_proj" else H)
                       for p in ("gate_proj", "up_proj", "down_proj")}}), use_dora=True),
           "ISL-K303", verdict=("raises", "nothing", "refuses")),
    Sample("lora_bias", "broken", "gate_up with lora_bias: true and lora_B.bias tensors",
           "sglang has no LoRA bias; the converter refuses (a pool holds no bias)",
           lambda: with_config(with_weights(toy(4, 54), lambda w: {
               **w, **{f"{MODULE}.{p}.lora_B.bias": torch.full((N * F if p != "down_proj" else H,), 0.1)
                       for p in ("gate_proj", "up_proj", "down_proj")}}), lora_bias=True),
           "ISL-K304", verdict=("unknown", "unknown", "refuses")),
    Sample("pissa", "broken", 'gate_up with init_lora_weights: "pissa" (not converted)',
           "sglang applies the factors to the model's own weights, not PiSSA's residual base",
           lambda: with_config(toy(4, 55), init_lora_weights="pissa"), "ISL-K305",
           verdict=("loads", "different", "refuses")),
    Sample("adalora", "broken", 'gate_up with peft_type: "ADALORA"', "not a LoRA adapter: sglang's bare AssertionError",
           lambda: with_config(toy(4, 56), peft_type="ADALORA"), "ISL-K202", verdict=("raises", "nothing", "refuses")),
    Sample("modules_to_save", "served wrong", 'gate_up with modules_to_save: ["lm_head"]',
           "sglang does not serve PEFT's saved module copies", lambda: with_config(toy(4, 57), modules_to_save=["lm_head"]),
           "ISL-W109", verdict=("loads", "different", "writes")),
    Sample("fan_in_fan_out", "good", "gate_up with fan_in_fan_out: true",
           "the field changes nothing for the sink (a note)", lambda: with_config(toy(4, 58), fan_in_fan_out=True),
           "ISL-W111"),
    Sample("named_adapters", "broken", "two PEFT named adapters in subfolders math/ and code/, nothing at the top",
           "the doctor points to the subfolders", lambda: toy(4, 59), "ISL-K311", _named_adapters,
           ("raises", "nothing", "refuses")),
    Sample("bin_only", "broken", "gate_up saved as adapter_model.bin only (torch.save)",
           "sglang reads it with torch.load(weights_only=True); the kit never unpickles: convert it to safetensors",
           lambda: toy(4, 60), "ISL-K203", _pickled, ("loads", "unknown", "refuses")),
    Sample("transposed_down_b", "repaired", "gate_up with down_proj.lora_B saved transposed [r, H]",
           "one verdict: sglang fails the buffer load; the converter transposes it back (exact)",
           lambda: with_weights(toy(4, 61), lambda w: {**w, key("down_proj", "B"): w[key("down_proj", "B")].T}),
           "ISL-K206", verdict=("raises", "nothing", "writes")),
    Sample("nan_factor", "broken", "gate_up with one NaN in gate A",
           "sglang serves NaN for every request of it; the converter refuses",
           lambda: with_weights(toy(4, 62), lambda w: {**w, key("gate_proj", "A"): w[key("gate_proj", "A")].index_put(
               (torch.tensor([0]), torch.tensor([0])), torch.tensor(float("nan")))}),
           "ISL-K302", verdict=("loads", "nan", "refuses")),
    Sample("nan_alpha", "broken", "gate_up with lora_alpha: NaN", "sglang serves NaN; the converter refuses",
           lambda: toy(4, 63), "ISL-K301", _rewrite_config(lora_alpha=float("nan")), ("loads", "nan", "refuses")),
    Sample("inf_alpha", "broken", "gate_up with lora_alpha: 1e400 (infinity)", "sglang serves NaN/Inf; the converter refuses",
           lambda: toy(4, 64), "ISL-K301", _infinite_alpha, ("loads", "nan", "refuses")),
    Sample("duplicate_w1", "broken", "gate_up plus w1 keys (other values) for the same gate factors",
           "sglang silently serves w1's; the converter refuses to drop either",
           lambda: duplicate(lambda k: k.replace(".gate_proj.", ".w1."), 65), "ISL-K307",
           verdict=("loads", "different", "refuses")),
    Sample("duplicate_expert", "broken", "per_expert plus .00. keys (other values) for expert 0",
           "sglang silently serves one of the two; the converter refuses to drop either",
           lambda: duplicate(lambda k: k.replace("shared_experts.0.", "shared_experts.00."), 67,
                             per_expert=True), "ISL-K307", verdict=("loads", "different", "refuses")),
    Sample("folded_down_a", "broken", "gate_up with down A saved [n*r, F] = [8, 6]",
           "the fold is named with the reshape that fixes it (--repair applies it); sglang fails the buffer load",
           lambda: with_weights(toy(4, 69), lambda w: {**w, key("down_proj", "A"): w[key("down_proj", "A")].reshape(
               4, N, F).transpose(0, 1).reshape(N * 4, F).contiguous()}),
           "ISL-K309", verdict=("raises", "nothing", "refuses")),
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
                         "doctor": s.doctor, "sink": {"n_shared_experts": N, "hidden": H, "intermediate": F},
                         "verdict": {"load": s.verdict[0], "computes": s.verdict[1], "kit": s.verdict[2],
                                     "exit_status": s.exit_status}})
    atomic_write(out / "MANIFEST.json", (json.dumps(manifest, indent=2) + "\n").encode())
    return manifest


def readme_table(manifest: list[dict]) -> str:
    rows = ["| sample | kind | how it was made | what it shows | doctor: sglang loads / computes / kit | exit | code |",
            "|---|---|---|---|---|---|---|"]
    rows += [f"| `{m['name']}` | {m['kind']} | {m['made']} | {m['shows']} | {m['verdict']['load']} / "
             f"{m['verdict']['computes']} / {m['verdict']['kit']} | {m['verdict']['exit_status']} | "
             f"{m['code'] or '-'} |" for m in manifest]
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
