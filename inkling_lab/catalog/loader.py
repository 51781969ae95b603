"""sglang's adapter loader: refusals of an adapter, skipped weights, and loading the
factors into the pool's buffers (``srt/lora/lora_manager.py``, ``srt/lora/mem_pool.py``)."""
from __future__ import annotations

from ._snippets import ADAPTER, FACTORS, FOLDER, POOL
from .entry import KIT, LOADER, CatalogEntry

_LOAD = "sglang/srt/lora/mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer"
_VALIDATE = "sglang/srt/lora/lora_manager.py: LoRAManager.validate_new_adapter"
_SKIPPED = ("LoRA adapter '{uid}': {count} weight(s) skipped because they did not match any target module in "
            "{targets}. Skipped weights: {names}. This likely indicates a mismatch between the adapter's target "
            "modules and the base model architecture.")
_ATTENTION = ("extra = {**ad.weights, 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': "
              "torch.zeros(4, 8),\n"
              "         'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight': torch.zeros(8, 4)}\n")

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-E015", title="a per-expert outer adapter in a shared-outer pool", exc_type=ValueError,
        message="experts_shared_outer_loras is enabled but {factor} has expert_dim={k} (expected 1).",
        meaning="The pool was sized for shared outer factors (one gate-up A and one down B for all "
                "experts); this adapter ships k of them. Either its k outer factors are all equal (then "
                "keep one: exact), or the pool must be per-expert outer. The factor is "
                "'gate_up_proj_moe lora_A' or 'down_proj_moe lora_B'.",
        when="Loading a per-expert export with --experts-shared-outer-loras, or into a pool whose "
             "layout was auto-detected from other adapters.",
        setup=POOL + "factors = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=4, outer=2, seed=0)\n",
        trigger="pool.load(0, factors)\n",
        fix="per_expert = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4, outer=2)\n"
            "per_expert.load(0, factors)\n",
        remedy="If the adapter's outer factors are equal for every expert, collapse them to one (exact; "
               "inkling-lab convert does it); otherwise serve without --experts-shared-outer-loras, and read "
               "ISL-W001 first: sglang 0.5.23 computes the per-expert outer layout wrongly.",
        upstream=_LOAD + " (the shared-outer branch for gate_up_proj_moe lora_A and down_proj_moe lora_B).",
        generation=LOADER, adapter_caused=True, related=("ISL-E002", "ISL-E003", "ISL-W001")),
    CatalogEntry(
        code="ISL-E016", title="an adapter does not fit its pool slot", exc_type=AssertionError,
        message="LoRA buffer shape {buffer_shape} does not match weight shape {weight_shape}.",
        meaning="Loading copies each factor into its slot's view of the buffer. The view is cut at the "
                "adapter's rank r (from adapter_config.json) and the pool's H and F; a factor of another "
                "rank (more than the pool's max rank, or another rank than the config's r, as with "
                "rank_pattern), or of another H or F, does not fit.",
        when="An r=16 adapter in a pool sized with --max-lora-rank 8; a module whose rank differs from the "
             "config's r (rank_pattern); an adapter trained with another tensor-parallel F.",
        setup=POOL + "factors = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=8, seed=0)\n",
        trigger="pool.load(0, factors)  # rank 8 > max_rank 4\n",
        fix="big = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=8)\n"
            "big.load(0, factors)\n",
        remedy="Raise --max-lora-rank to the adapter's rank; a module with its own rank (rank_pattern) or "
               "another H/F needs the adapter re-exported for this model.",
        upstream=_LOAD + " (its inner load_lora_weight_tensor asserts equal shapes before the copy).",
        generation=LOADER, adapter_caused=True, related=("ISL-E005",)),
    CatalogEntry(
        code="ISL-E025", title="sglang refuses DoRA adapters", exc_type=ValueError,
        message="Failed to load {name} because LoRA serving currently doesn't support DoRA adapters",
        meaning="The adapter's config sets use_dora: every output feature is rescaled by a learned "
                "magnitude (lora_magnitude_vector), which sglang's LoRA pool cannot hold. sglang refuses it "
                "before reading any weight.",
        when="An adapter trained with PEFT's LoraConfig(use_dora=True).",
        setup=FOLDER + "import json\nconfig = folder / 'adapter_config.json'\n"
                       "settings = json.loads(config.read_text())\n",
        trigger="config.write_text(json.dumps({**settings, 'use_dora': True}))\n"
                "load_adapter(folder)\n",
        fix="config.write_text(json.dumps({**settings, 'use_dora': False}))  # a plain LoRA adapter\n"
            "load_adapter(folder)\n",
        remedy="Merge the DoRA adapter into the base weights (PEFT merge_and_unload) and serve the merged "
               "model, or train a plain LoRA adapter (use_dora=False).",
        upstream=_VALIDATE + " (reads use_dora from LoRAConfig, srt/lora/lora_config.py).",
        generation=LOADER, adapter_caused=True, reproduced=False,
        sample="ValueError: Failed to load my-dora-adapter because LoRA serving currently doesn't support "
               "DoRA adapters"),
    CatalogEntry(
        code="ISL-E026", title="sglang refuses adapters that add tokens", exc_type=ValueError,
        message="Failed to load {name} because LoRA serving currently doesn't support adapters that add tokens "
                "to the vocabulary",
        meaning="The adapter folder holds an added_tokens.json with tokens past the base vocabulary "
                "(lora_added_tokens_size > 0); sglang serves no new embeddings for them and refuses the "
                "adapter. The shared sink is not involved.",
        when="An adapter trained after tokenizer.add_tokens(...), saved with its tokenizer files.",
        setup=FOLDER,
        trigger="(folder / 'added_tokens.json').write_text('{\"<tool>\": 151700}')\n"
                "load_adapter(folder)  # the kit reads only the sink's factors: nothing to refuse\n",
        fix="(folder / 'added_tokens.json').unlink(missing_ok=True)  # only if the tokens were never used\n"
            "load_adapter(folder)\n",
        remedy="Serve a model whose vocabulary already holds the tokens (resize and merge), or drop "
               "added_tokens.json when its tokens were copied from the base tokenizer by mistake.",
        upstream=_VALIDATE + " (lora_added_tokens_size from LoRAConfig.__init__, srt/lora/lora_config.py).",
        generation=LOADER, adapter_caused=True, reproduced=False,
        sample="ValueError: Failed to load my-adapter because LoRA serving currently doesn't support adapters "
               "that add tokens to the vocabulary"),
    CatalogEntry(
        code="ISL-W002", title="weights skipped: they match no target module", exc_type=None, kind="warning",
        message=_SKIPPED,
        meaning="sglang loads only the adapter weights whose names contain one of the server's target "
                "modules (--lora-target-modules, or the union over loaded adapters); the rest are skipped "
                "with this warning and the adapter is served without them. For the shared sink it means "
                "its factors are not applied: the model serves the base sink.",
        when="PEFT target_parameters exports of Inkling's 3D expert parameters "
             "(shared_experts.base_layer...lora_A.weight), or a server started with fewer target modules "
             "than the adapter trains.",
        setup=ADAPTER + _ATTENTION,
        trigger="Adapter.from_state(ad.config, extra).findings  # the kit leaves them out with a note (ISL-N202)\n",
        fix="Adapter.from_state(ad.config, ad.weights).findings  # only the modules the server wraps\n",
        remedy="Start the server with every module the adapter trains in --lora-target-modules (for the "
               "sink: gate_up_proj and down_proj), or re-export the adapter with plain module names.",
        upstream=_LOAD + " (pre-validates every weight name with srt/lora/utils.py: get_target_module_name; "
                 "logger.warning unless --lora-strict-loading).",
        generation=LOADER, adapter_caused=True, reproduced=False, related=("ISL-E027", "ISL-N202"),
        sample="[2026-11-30 09:12:44] WARNING mem_pool.py:951: LoRA adapter 'sink-v3': 96 weight(s) skipped "
               "because they did not match any target module in ['down_proj', 'gate_up_proj', 'qkv_proj']. "
               "Skipped weights: ['model.layers.0.mlp.shared_experts.base_layer.lora_A.weight']. This likely "
               "indicates a mismatch between the adapter's target modules and the base model architecture."),
    CatalogEntry(
        code="ISL-E027", title="weights match no target module (strict loading)", exc_type=ValueError,
        message=_SKIPPED,
        meaning="The same finding as ISL-W002, raised instead of logged because the server runs with "
                "--lora-strict-loading: the adapter is not loaded at all.",
        when="As ISL-W002, on a server started with --lora-strict-loading.",
        setup=ADAPTER + _ATTENTION,
        trigger="Adapter.from_state(ad.config, extra).findings  # the kit leaves them out with a note (ISL-N202)\n",
        fix="Adapter.from_state(ad.config, ad.weights).findings\n",
        remedy="As for ISL-W002: make the server's --lora-target-modules cover every module the adapter "
               "trains, or re-export the adapter with plain module names.",
        upstream=_LOAD + " (raises the warning's text as ValueError when strict_loading, from "
                 "--lora-strict-loading via LoRAManager).",
        generation=LOADER, adapter_caused=True, reproduced=False, related=("ISL-W002",),
        sample="ValueError: LoRA adapter 'sink-v3': 2 weight(s) skipped because they did not match any target "
               "module in ['down_proj', 'gate_up_proj']. Skipped weights: ['model.layers.0.self_attn.q_proj."
               "lora_A.weight', 'model.layers.0.self_attn.q_proj.lora_B.weight']. This likely indicates a "
               "mismatch between the adapter's target modules and the base model architecture."),
    CatalogEntry(
        code="ISL-E028", title="loaded adapters disagree on the outer layout", exc_type=RuntimeError,
        message="Mixed shared-outer LoRA formats detected across loaded adapters (conflict in adapter "
                "'{adapter}'). All MoE adapters must either all use shared outer experts (expert_dim=1) or all "
                "use per-expert weights.",
        meaning="sglang picks one outer layout for the whole pool from the adapters loaded at start-up: "
                "shared outer (gate-up A with expert_dim 1) or per expert. One adapter of each kind cannot "
                "share a pool.",
        when="Starting a server with --lora-paths that mix a shared-outer and a per-expert export.",
        setup="shared = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=4, seed=0)\n"
              "per_expert = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=4, outer=2, seed=1)\n"
              + POOL,
        trigger="pool.load(0, shared)\npool.load(1, per_expert)  # the kit: ISL-E015 for the second\n",
        fix="both = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4, outer=2)\n"
            "both.load(0, shared)\nboth.load(1, per_expert)  # a per-expert pool holds both exactly\n",
        remedy="Convert the per-expert adapters whose outer factors are equal to shared outer (exact: "
               "inkling-lab convert), or serve both kinds per expert (read ISL-W001 first).",
        upstream="sglang/srt/lora/lora_manager.py: LoRAManager._detect_shared_outer_loras (at start-up, "
                 "over every adapter of --lora-paths).",
        generation=LOADER, adapter_caused=True, reproduced=False, kit_code="ISL-E015",
        related=("ISL-E015", "ISL-W001"),
        sample="RuntimeError: Mixed shared-outer LoRA formats detected across loaded adapters (conflict in "
               "adapter 'sink-per-expert'). All MoE adapters must either all use shared outer experts "
               "(expert_dim=1) or all use per-expert weights."),
    CatalogEntry(
        code="ISL-E029", title="a LoRA MoE runner without gate_up_proj and down_proj targets", exc_type=ValueError,
        message="--moe-runner-backend {backend} requires the LoRA target modules to include gate_up_proj and "
                "down_proj; this adapter leaves the MoE experts without a runner",
        meaning="With a lora_* MoE runner backend the routed experts compute only through their LoRA wrapper, "
                "which sglang builds only when the target modules hold both gate_up_proj and down_proj; an "
                "adapter (or server) with one of them leaves the experts without a runner. The same rule "
                "decides whether the shared sink is wrapped (ISL-N201).",
        when="An adapter that trains only gate/up (or only down) of the experts, served with "
             "--moe-runner-backend lora_*.",
        setup=ADAPTER + "gate_up_only = {k: v for k, v in ad.weights.items() if 'down_proj' not in k}\n",
        trigger="Adapter.from_state(ad.config, gate_up_only).factors(2)  # the kit: zeros for down (ISL-N201)\n",
        fix="Adapter.from_state(ad.config, ad.weights).factors(2)\n",
        remedy="Start the server with --lora-target-modules naming both gate_up_proj and down_proj, or use a "
               "MoE runner backend that is not lora_*.",
        upstream="sglang/srt/lora/lora_manager.py: LoRAManager.init_lora_modules (after wrapping the modules).",
        generation=LOADER, adapter_caused=True, reproduced=False, related=("ISL-N201",),
        sample="ValueError: --moe-runner-backend lora_triton requires the LoRA target modules to include "
               "gate_up_proj and down_proj; this adapter leaves the MoE experts without a runner"),
    CatalogEntry(
        code="ISL-K104", title="loading into a slot the pool does not have", exc_type=IndexError,
        message="LoRAPool slot {slot} is outside the pool: use a slot in 0..{last}",
        meaning="A pool has max_loras_per_batch slots, numbered from 0.",
        when="A 1-based slot number, or more adapters than slots.",
        setup=POOL + FACTORS,
        trigger="pool.load(3, factors)\n",
        fix="pool.load(2, factors)\n",
        remedy="Load into a slot 0..S-1, or build the pool with more slots (sglang: --max-loras-per-batch).",
        upstream="sglang picks the slot itself (LoRAMemoryPool evicts a slot to make room), so it never "
                 "gets a slot past the end; the kit's LoRAPool.load takes one from the caller and checks it.",
        generation=KIT, related=("ISL-K103",)),
]
