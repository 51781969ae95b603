"""sglang's adapter loader: refusals of an adapter, skipped weights, and loading the
factors into the pool's buffers (``srt/lora/lora_manager.py``, ``srt/lora/mem_pool.py``)."""
from __future__ import annotations

from ._snippets import ADAPTER, FACTORS, FOLDER, POOL, SAVED
from .entry import EVERY_RELEASE, KIT, LOADER, SINCE_0_5_23, CatalogEntry, UpstreamDefectWarning

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
        generation=LOADER, adapter_caused=True, related=("ISL-E002", "ISL-E003", "ISL-W001"), releases=EVERY_RELEASE),
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
        doctor_fix="check --max-rank (sglang: --max-lora-rank), --hidden and --intermediate against the model the "
                   "adapter was trained for",
        upstream=_LOAD + " (its inner load_lora_weight_tensor asserts equal shapes before the copy).",
        generation=LOADER, adapter_caused=True, related=("ISL-E005",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E025", title="sglang refuses DoRA adapters", exc_type=ValueError,
        message="Failed to load {name} because LoRA serving currently doesn't support DoRA adapters",
        meaning="The adapter's config sets use_dora: every output feature is rescaled by a learned "
                "magnitude (lora_magnitude_vector), which sglang's LoRA pool cannot hold. sglang refuses it "
                "before reading any weight.",
        when="An adapter trained with PEFT's LoraConfig(use_dora=True).",
        setup=SAVED,
        trigger="il.doctor(saved(use_dora=True), 2, 8, 6).raise_for_sglang()  # the kit's reader: ISL-K303\n",
        fix="il.doctor(saved(use_dora=False), 2, 8, 6).raise_for_sglang()  # a plain LoRA adapter loads\n",
        remedy="Merge the DoRA adapter into the base weights (PEFT merge_and_unload) and serve the merged "
               "model, or train a plain LoRA adapter (use_dora=False).",
        upstream=_VALIDATE + " (reads use_dora from LoRAConfig, srt/lora/lora_config.py).",
        generation=LOADER, adapter_caused=True, related=("ISL-K303",),
        sample="ValueError: Failed to load my-dora-adapter because LoRA serving currently doesn't support "
               "DoRA adapters", releases=EVERY_RELEASE),
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
               "that add tokens to the vocabulary", releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-W002", title="weights match no target module: logged, then the buffer load fails",
        exc_type=UpstreamDefectWarning, kind="warning",
        message=_SKIPPED,
        meaning="When a batch first uses an adapter, sglang's buffer load first checks every weight name of "
                "the adapter against the pool's target modules (--lora-target-modules, or the union over the "
                "loaded adapters) and logs this warning for those that contain none of them. It does not drop "
                "them: its loop over each layer's weights, right after, looks each name up again and raises "
                "ISL-E036 on the first of them (lowest layer first, in the layer's own order). So the adapter "
                "loads into CPU memory, but no request can use it.",
        when="PEFT target_parameters exports of Inkling's 3D expert parameters "
             "(shared_experts.base_layer...lora_A.weight), a server started with fewer target modules "
             "than the adapter trains, or an up_proj without its gate_proj (only a stacked pair is gate_up_proj).",
        setup=SAVED + "up_only = {k: v for k, v in ad.weights.items() if '.gate_proj.' not in k}\n",
        trigger="il.doctor(saved(up_only), 2, 8, 6).warn()  # no gate_proj: up_proj matches no target module\n",
        fix="il.doctor(saved(), 2, 8, 6).warn()  # gate_proj and up_proj stack into gate_up_proj\n",
        remedy="Start the server with every module the adapter trains in --lora-target-modules (for the "
               "sink: gate_up_proj and down_proj), or write the adapter under the sink's own names "
               "(inkling-lab export writes a servable one).",
        upstream=_LOAD + " (pre-validates every weight name, of every layer and the embedding weights, with "
                 "srt/lora/utils.py: get_target_module_name, and logger.warning unless --lora-strict-loading; the "
                 "names stay in lora_adapter.layers[i].weights). Every release 0.5.16 to 0.5.23.",
        generation=LOADER, adapter_caused=True, related=("ISL-E036", "ISL-E027", "ISL-N202", "ISL-K211"),
        sample="[2026-11-30 09:12:44] WARNING mem_pool.py:951: LoRA adapter 'sink-v3': 96 weight(s) skipped "
               "because they did not match any target module in ['down_proj', 'gate_up_proj', 'qkv_proj']. "
               "Skipped weights: ['model.layers.0.mlp.shared_experts.base_layer.lora_A.weight']. This likely "
               "indicates a mismatch between the adapter's target modules and the base model architecture.", releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E036", title="the buffer load meets a weight that matches no target module", exc_type=ValueError,
        message="Cannot find target module name for {name} in {targets}",
        meaning="The weights that ISL-W002's warning counted are still in the adapter's layers: the buffer load's "
                "loop over each layer's weights (from layer 0, in the layer's own order after normalization) "
                "looks every name up with get_target_module_name, which raises on the first name that contains "
                "none of the pool's target modules. It runs when a batch first uses the adapter, so the adapter "
                "loads and every request that uses it fails. The set is printed in Python's string-hash order, "
                "which changes from process to process (the kit prints it sorted).",
        when="Whenever ISL-W002's warning is logged: a PEFT target_parameters export "
             "(shared_experts.base_layer...), a w1/w3/w2 target_modules (not renamed), an up_proj without its "
             "gate_proj, a server with fewer target modules than the adapter trains.",
        setup=SAVED + "up_only = {k: v for k, v in ad.weights.items() if '.gate_proj.' not in k}\n",
        trigger="il.doctor(saved(up_only), 2, 8, 6).raise_for_sglang()  # up_proj alone matches no target module\n",
        fix="il.doctor(saved(), 2, 8, 6).raise_for_sglang()  # gate_proj and up_proj stack into gate_up_proj\n",
        remedy="Start the server with --lora-target-modules covering every module the adapter trains (for the "
               "sink: gate_up_proj and down_proj); an export whose names hold no module (PEFT target_parameters) "
               "or a lone up_proj needs re-writing: inkling-lab export writes a servable adapter.",
        upstream=_LOAD + " (its per-layer loop over lora_adapter.layers[i].weights, then over embedding_layers), "
                 "raised by sglang/srt/lora/utils.py: get_target_module_name; reached from "
                 "LoRAManager.prepare_lora_batch -> fetch_new_loras -> LoRAMemoryPool.prepare_lora_batch. Every "
                 "release 0.5.16 to 0.5.23.",
        generation=LOADER, adapter_caused=True, related=("ISL-W002", "ISL-E027", "ISL-W103"),
        sample="ValueError: Cannot find target module name for model.layers.0.mlp.shared_experts.base_layer."
               "lora_A.weight in {'gate_up_proj', 'down_proj', 'qkv_proj'}", releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E037", title="an indexed shared-expert weight on a layer whose sink is not wrapped",
        exc_type=ValueError,
        message="Cannot load LoRA weight {name}: layer {layer} has no matching target for indexed shared-expert "
                "weights.",
        meaning="A per-expert factor (shared_experts.<e>.<proj>..., 2D) has nowhere to go when the layer's "
                "shared sink is not wrapped (the server's target modules lack gate_up_proj or down_proj): sglang "
                "0.5.23 refuses it in the buffer load, when a batch first uses the adapter, so that it cannot "
                "land in the routed experts' buffers (its name also matches experts.<e>.). Releases 0.5.16 to "
                "0.5.22 file it with the routed experts, which are not wrapped either: it loads and is never "
                "applied (ISL-W103). The name is printed as its repr (in quotes).",
        when="A per-expert export served with --lora-target-modules that name gate_up_proj but not down_proj "
             "(or the reverse), or whose target_modules train only one of them.",
        setup=SAVED + "per_expert = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, per_expert=True)\n"
                      "gate_up = {k: v for k, v in per_expert.weights.items() if '.down_proj.' not in k}\n",
        trigger="il.doctor(saved(gate_up, target_modules=['gate_proj', 'up_proj']), 2, 8, 6).raise_for_sglang()\n",
        fix="il.doctor(saved(gate_up, target_modules=['gate_proj', 'up_proj']), 2, 8, 6, "
            "target_modules=['gate_up_proj', 'down_proj']).raise_for_sglang()  # the sink is wrapped\n",
        remedy="Start the server with --lora-target-modules naming gate_up_proj and down_proj besides the "
               "adapter's own target modules (ISL-E034 refuses one that leaves those out), so that the sink is "
               "wrapped and takes its per-expert factors.",
        upstream=_LOAD + " (its per-layer loop: an indexed shared_experts weight, not 3D, without a shared-MoE "
                 "module on the layer); new in 0.5.23.",
        generation=LOADER, adapter_caused=True, related=("ISL-W103", "ISL-W001"), releases=SINCE_0_5_23),
    CatalogEntry(
        code="ISL-E027", title="weights match no target module (strict loading)", exc_type=ValueError,
        message=_SKIPPED,
        meaning="The same finding as ISL-W002, raised instead of logged because the server runs with "
                "--lora-strict-loading: the buffer load stops there, before any buffer is touched, when a batch "
                "first uses the adapter (without the flag it fails a step later, ISL-E036).",
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
               "mismatch between the adapter's target modules and the base model architecture.", releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E028", title="loaded adapters disagree on the outer layout", exc_type=RuntimeError,
        message="Mixed shared-outer LoRA formats detected across loaded adapters (conflict in adapter "
                "'{adapter}'). All MoE adapters must either all use shared outer experts (expert_dim=1) or all "
                "use per-expert weights.",
        meaning="sglang picks one outer layout for the whole pool from the adapters loaded at start-up: "
                "shared outer (gate-up A with expert_dim 1) or per expert. One adapter of each kind cannot "
                "share a pool.",
        when="Starting a server with --lora-paths that mix a shared-outer and a per-expert export.",
        setup=SAVED + "per_expert = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, per_expert=True, "
                      "layers=(1,))\n",
        trigger="il.doctor(saved({**ad.weights, **per_expert.weights}), 2, 8, 6).raise_for_sglang()"
                "  # layer 0 shared outer, layer 1 per expert\n",
        fix="il.doctor(saved(per_expert.weights), 2, 8, 6).raise_for_sglang()  # one layout: it loads\n",
        remedy="Convert the per-expert adapters whose outer factors are equal to shared outer (exact: "
               "inkling-lab convert), or serve both kinds per expert (read ISL-W001 first).",
        upstream="sglang/srt/lora/lora_manager.py: LoRAManager._detect_shared_outer_loras (at start-up, "
                 "over every adapter of --lora-paths).",
        generation=LOADER, adapter_caused=True, related=("ISL-E015", "ISL-W001"),
        sample="RuntimeError: Mixed shared-outer LoRA formats detected across loaded adapters (conflict in "
               "adapter 'sink-per-expert'). All MoE adapters must either all use shared outer experts "
               "(expert_dim=1) or all use per-expert weights.", releases=EVERY_RELEASE),
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
               "gate_up_proj and down_proj; this adapter leaves the MoE experts without a runner", releases=SINCE_0_5_23),
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
        generation=KIT, related=("ISL-K103",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E031", title="the adapter folder holds no weights file", exc_type=RuntimeError,
        message="Cannot find any model weights with `{path}`",
        meaning="sglang reads an adapter's tensors with its model loader: every *.safetensors of the folder, "
                "else (fall_back_to_pt) every *.bin or *.pt. A folder with none of them is refused before any "
                "weight name is looked at; at start-up the message is wrapped as 'Failed to load LoRA adapter "
                "<name>: ...'.",
        when="A folder with only adapter_config.json (a download that stopped, a save_pretrained into another "
             "folder), or weights saved under another extension.",
        setup=SAVED + "folder = saved()\n(folder / 'adapter_model.safetensors').unlink()  # the config alone\n",
        trigger="il.doctor(folder, 2, 8, 6).raise_for_sglang()\n",
        fix="il.doctor(saved(), 2, 8, 6).raise_for_sglang()  # config and adapter_model.safetensors\n",
        remedy="Put the adapter's weights file (adapter_model.safetensors, as PEFT's save_pretrained writes it) "
               "next to its adapter_config.json; inkling-lab doctor on the folder says what else is missing.",
        upstream="sglang/srt/model_loader/loader.py: DefaultModelLoader._prepare_weights (no weight file "
                 "found), called from sglang/srt/lora/lora.py: LoRAAdapter.initialize_weights.",
        generation=LOADER, adapter_caused=True, related=("ISL-K203",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E032", title="a target_modules string that is not 'all'", exc_type=ValueError,
        message="SGLang does not recognize target_modules='{target_modules}'. Please use a list of module name "
                "suffixes in the adapter's PEFT config, or explicitly specify --lora-target-modules during "
                "server startup.",
        meaning="PEFT accepts target_modules as a regular expression string; sglang reads only a list of "
                "module name suffixes, or the shorthands 'all' and 'all-linear'. Any other string is refused "
                "while sglang works out which modules to wrap.",
        when="An adapter trained with target_modules=r'.*shared_experts.*(gate|up|down)_proj' or a single "
             "module name written as a string.",
        setup=SAVED,
        trigger="il.doctor(saved(target_modules='.*shared_experts.*_proj'), 2, 8, 6).raise_for_sglang()\n",
        fix="il.doctor(saved(target_modules=['gate_proj', 'up_proj', 'down_proj']), 2, 8, 6).raise_for_sglang()\n",
        remedy="Write the module names as a list of suffixes in adapter_config.json (for the sink: gate_proj, "
               "up_proj, down_proj), or start the server with --lora-target-modules.",
        upstream="sglang/srt/lora/lora_manager.py: LoRAManager.init_lora_shapes (a str target_modules other "
                 "than 'all' and 'all-linear').",
        generation=LOADER, adapter_caused=True, related=("ISL-E033", "ISL-E034"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E033", title="target_modules is neither a list nor a string", exc_type=ValueError,
        message="SGLang currently only supports inferring LoRA target modules when a list of suffixes is "
                "provided in `target_modules` field of PEFT config. Please explicitly specify "
                "`--lora-target-modules` during server startup. You can specify `all` to enable all support "
                "modules types. ",
        meaning="sglang infers the modules to wrap from each adapter's target_modules, which must be a list "
                "(or one of the strings of ISL-E032); null, a number or a mapping is refused. Its message "
                "ends in a space.",
        when="A hand-written adapter_config.json with \"target_modules\": null, or a tool that writes a "
             "mapping of module names.",
        setup=SAVED,
        trigger="il.doctor(saved(target_modules=None), 2, 8, 6).raise_for_sglang()\n",
        fix="il.doctor(saved(target_modules=['gate_proj', 'up_proj', 'down_proj']), 2, 8, 6).raise_for_sglang()\n",
        remedy="Set target_modules in adapter_config.json to the list of modules the adapter trains (for the "
               "sink: gate_proj, up_proj, down_proj).",
        upstream="sglang/srt/lora/lora_manager.py: LoRAManager.init_lora_shapes (target_modules not a list).",
        generation=LOADER, adapter_caused=True, related=("ISL-E032",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E034", title="the adapter trains modules the server does not wrap", exc_type=ValueError,
        message="LoRA adapter '{name}' contains target modules {unsupported} that are not included in the "
                "specified --lora-target-modules {server}. Please update --lora-target-modules to include all "
                "required modules: {required}, or use 'all' to enable all supported modules.",
        meaning="With --lora-target-modules given, every module an adapter's config names (normalized: "
                "q_proj/k_proj/v_proj -> qkv_proj, gate_proj/up_proj -> gate_up_proj) must be among them; "
                "sglang refuses the adapter otherwise, before it reads any weight of it.",
        when="An adapter that also trains attention (q_proj, o_proj) served with --lora-target-modules "
             "gate_up_proj down_proj.",
        setup=SAVED + "targets = ['gate_proj', 'up_proj', 'down_proj']\n",
        trigger="il.doctor(saved(target_modules=targets + ['q_proj']), 2, 8, 6, "
                "target_modules=['gate_up_proj', 'down_proj']).raise_for_sglang()\n",
        fix="il.doctor(saved(target_modules=targets), 2, 8, 6, "
            "target_modules=['gate_up_proj', 'down_proj']).raise_for_sglang()  # Inkling has no q_proj (ISL-E038)\n",
        remedy="Add the modules the message lists to --lora-target-modules where Inkling's model serves them "
               "(qkvr, wo_ud, gate_up_proj, down_proj, embed_tokens, lm_head: any other fails the server's start, "
               "ISL-E038), or serve an adapter whose config names only the wrapped modules.",
        upstream="sglang/srt/lora/lora_manager.py: LoRAManager.init_lora_shapes (the adapter's normalized "
                 "target modules are not a subset of --lora-target-modules).",
        generation=LOADER, adapter_caused=True, related=("ISL-W002", "ISL-W103"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E038", title="a server target module that Inkling's model has no LoRA buffer for",
        exc_type=NotImplementedError,
        message="get_hidden_dim not implemented for {module_name}",
        meaning="sglang's Inkling model (InklingForConditionalGeneration) serves LoRA on qkvr, wo_ud, "
                "gate_up_proj, down_proj, embed_tokens and lm_head only (its supported_lora_modules), and its "
                "get_hidden_dim raises for any other name. The pool asks it for every target module of the "
                "server (normalized: q_proj/k_proj/v_proj -> qkv_proj, gate_proj/up_proj -> gate_up_proj; "
                "wq_du, o_proj and the like stay as they are) when it allocates its buffers at server start, "
                "before any request: the server does not start. The target modules are fixed then (from "
                "--lora-target-modules, else from the --lora-paths adapters' configs): an adapter loaded later "
                "is checked against them instead. Where several are unknown, sglang names the first in its "
                "set's string-hash order, which changes from process to process (the kit names the first sorted).",
        when="An adapter whose target_modules name q_proj/k_proj/v_proj/o_proj (Inkling has none) or "
             "wq_du/wk_dv/wv_dv/wr_du (the checkpoint's names; sglang's module is qkvr), or "
             "--lora-target-modules naming them.",
        setup=SAVED + "targets = ['gate_proj', 'up_proj', 'down_proj']\n",
        trigger="il.doctor(saved(target_modules=targets + ['q_proj', 'v_proj']), 2, 8, 6).raise_for_sglang()\n",
        fix="il.doctor(saved(target_modules=targets), 2, 8, 6).raise_for_sglang()  # only Inkling's modules\n",
        remedy="Name only qkvr, wo_ud, gate_up_proj (or gate_proj, up_proj), down_proj, embed_tokens and lm_head "
               "in the adapter's target_modules and in --lora-target-modules.",
        upstream="sglang/srt/models/inkling.py: InklingForConditionalGeneration.get_hidden_dim, reached from "
                 "sglang/srt/lora/mem_pool.py: LoRAMemoryPool.init_buffers (get_lora_A_shape -> "
                 "sglang/srt/lora/utils.py: get_hidden_dim) <- LoRAManager.init_memory_pool <- "
                 "LoRAManager.init_state (sglang/srt/lora/lora_manager.py), at server start. The same code in "
                 "every release 0.5.16 to 0.5.23.",
        generation=LOADER, adapter_caused=True, related=("ISL-E034", "ISL-W002"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E035", title="a per-expert outer factor, as a dict, in a shared-outer pool", exc_type=ValueError,
        message="experts_shared_outer_loras is enabled but {factor} dict has {count} entries (expected 1).",
        meaning="ISL-E015's case when the adapter names its outer factors per expert "
                "(shared_experts.<e>.<proj>...): sglang holds them as a dict of experts, and a shared-outer "
                "pool takes exactly one. The factor is 'gate_up_proj_moe lora_A' or 'down_proj_moe lora_B'.",
        when="An adapter with flat gate/up factors (which make the pool shared outer) and per-expert down "
             "factors; a per-expert export loaded with --experts-shared-outer-loras.",
        setup=SAVED + "per_expert = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, per_expert=True)\n"
                      "flat_gate_up = {k: v for k, v in ad.weights.items() if '.down_proj.' not in k}\n"
                      "per_expert_down = {k: v for k, v in per_expert.weights.items() if '.down_proj.' in k}\n",
        trigger="il.doctor(saved({**flat_gate_up, **per_expert_down}), 2, 8, 6).raise_for_sglang()\n",
        fix="il.doctor(saved(), 2, 8, 6).raise_for_sglang()  # every factor flat: one shared outer layout\n",
        remedy="As for ISL-E015: export the adapter in one layout (inkling-lab convert collapses equal outer "
               "factors to shared outer, exactly), or serve without --experts-shared-outer-loras.",
        upstream=_LOAD + " (the shared-outer branch, when the factor is a dict of experts).",
        generation=LOADER, adapter_caused=True, related=("ISL-E015", "ISL-E028"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K160", title="a factor that would reach the pool as NaN or infinity", exc_type=ValueError,
        message="{tensor}: {count} of {total} value(s) would be NaN or infinite in {dtype} ({how}); a slot holding "
                "them makes every output of its adapter NaN: convert in a wider dtype (--dtype float32) or "
                "re-export the factors",
        meaning="The pool folds the scaling lora_alpha / r into B and holds every factor in its own dtype. A value "
                "past float16's 65504 (B = 40000 at scaling 2, or a float32 factor cast to float16) becomes "
                "infinity, and a NaN stays NaN: the slot would serve NaN without a word. The kit refuses the "
                "load and names the factor; the slot stays as it was.",
        when="An fp16 adapter with large B factors and lora_alpha / r > 1, a float32 adapter converted with "
             "--dtype float16, or factors saved after the training diverged.",
        setup=POOL.replace("max_rank=4)", "max_rank=4, dtype=torch.float16)") + FACTORS,
        trigger="factors.gate_up_b[0, 0, 0] = 40000.0\n"
                "pool.load(0, il.LoRAFactors(*factors.tensors().values(), lora_alpha=8.0))  # scaling 2\n",
        fix="wide = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4, dtype=torch.float32)\n"
            "wide.load(0, il.LoRAFactors(*factors.tensors().values(), lora_alpha=8.0))\n",
        remedy="Build the pool (convert --dtype) in float32 or bfloat16, whose range holds the scaled factors; "
               "if the adapter itself holds NaN or Inf, export it again from a checkpoint saved before the loss "
               "diverged.",
        upstream="sglang's loader scales B in the adapter's dtype and casts it into the pool without a check "
                 "(sglang/srt/lora/mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer): the slot holds Inf "
                 "and serves NaN.",
        generation=KIT, adapter_caused=True, related=("ISL-K301", "ISL-K302"), releases=EVERY_RELEASE),
]
