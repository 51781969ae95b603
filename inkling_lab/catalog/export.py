"""The cure's refusals and notes: ``inkling-lab export`` writes an adapter sglang 0.5.23 serves
as trained, or refuses, writing nothing (``ISL-K501..K549``, ``ISL-N501..N549``)."""
from __future__ import annotations

from .entry import EVERY_RELEASE, KIT, KIT_NOTE, CatalogEntry

_SETUP = ("from inkling_lab.adapters import load_adapter, save_adapter, synthetic_adapter\n"
          "from inkling_lab.export import export_for_sglang, verify_export\n"
          "folder = il.scratch_folder() / 'my_adapter'\n"
          "out = folder.parent / 'for_sglang'\n")
_PLAIN = "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)  # r=4, lora_alpha=8\n"
_EXPORT = "export_for_sglang(folder, out, 2).raise_if_refused()\n"
_WHERE = ("inkling_lab.export (the kit's own refusal: sglang 0.5.23 would load such an adapter as it "
          "is, or not at all; the doctor says which)")


def _refusal(code: str, title: str, message: str, meaning: str, when: str, setup: str, trigger: str, fix: str, *,
             remedy: str, upstream: str, exc_type: type[BaseException] = ValueError,
             related: tuple[str, ...] = ()) -> CatalogEntry:
    return CatalogEntry(code=code, title=title, exc_type=exc_type, message=message, meaning=meaning, when=when,
                        setup=_SETUP + setup, trigger=trigger, fix=fix, remedy=remedy, upstream=upstream,
                        generation=KIT, adapter_caused=True, related=related, releases=EVERY_RELEASE)


ENTRIES: list[CatalogEntry] = [
    _refusal(
        "ISL-K501", "folding the scaling into lora_B overflows the adapter's dtype",
        "{file}: tensor {key}: folding the scaling into lora_B overflows {dtype} ({count} value(s) beyond its "
        "largest finite value {limit}): nothing written; export the adapter saved in float32 or bfloat16",
        "The export folds each projection's PEFT scaling into its lora_B (in float64), then casts once to the "
        "adapter's dtype, so that sglang's own scaling is 1. When scaling times B exceeds what the dtype holds "
        "(float16: 65504), the cast gives Inf and every output of the adapter would be Inf or NaN. The export "
        "refuses rather than write it.",
        "A float16 adapter with a large lora_alpha (or a small r with rsLoRA).",
        "save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, dtype=torch.float16, "
        "lora_alpha=1e6), folder)\n",
        _EXPORT,
        "ad = load_adapter(folder)\n"
        "ad.weights = {k: t.float() for k, t in ad.weights.items()}  # float32 holds the folded B\n"
        "export_for_sglang(save_adapter(ad, folder.parent / 'in_float32'), out, 2).raise_if_refused()\n",
        remedy="Save the adapter's factors in float32 or bfloat16 (their range holds the folded B) and export that.",
        upstream="sglang 0.5.23 multiplies B by lora_alpha / r in the adapter's stored dtype "
                 "(sglang/srt/lora/mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer): the same overflow, "
                 "served as Inf without a word.", related=("ISL-K302",)),
    _refusal(
        "ISL-K502", "a tensor the export cannot carry",
        "{file}: tensor {key} cannot be carried into the export: {why}; nothing written",
        "Besides the shared sink's factors, the export keeps every other module's LoRA pair (attention and the "
        "like), its scaling folded into lora_B and zero-padded to the export's one r, so that sglang serves it "
        "as before. A tensor that is no lora_A.weight / lora_B.weight pair (an embedding's lora_embedding_A/B, a "
        "module saved whole, a bias) has no scaling to fold or rank to pad: the export cannot carry it with "
        "the same math, and refuses.",
        "An adapter trained with an embedding LoRA, with modules_to_save, or edited by hand.",
        "save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4), folder)\n"
        "from safetensors.torch import load_file, save_file\n"
        "weights = load_file(folder / 'adapter_model.safetensors')\n"
        "weights['base_model.model.model.embed_tokens.lora_embedding_A'] = torch.zeros(4, 10)\n"
        "save_file(weights, folder / 'adapter_model.safetensors')\n",
        _EXPORT,
        "del weights['base_model.model.model.embed_tokens.lora_embedding_A']  # serve it separately, or merge\n"
        "save_file(weights, folder / 'adapter_model.safetensors')\n" + _EXPORT,
        remedy="Serve the adapter without that tensor (split it off), or merge the adapter into the base model "
               "(PEFT merge_and_unload).", upstream=_WHERE, related=("ISL-K504",)),
    _refusal(
        "ISL-K503", "the proof failed: the export would not serve the adapter's math",
        "the export does not compute the adapter's math when read back through sglang {sglang}'s loading path: "
        "{what}; nothing written",
        "After writing, the export reads its own output back, one module at a time, through the kit's model of "
        "sglang 0.5.23's loading path and forward (the doctor's path), for every tensor-parallel rank of --tp "
        "(each rank's slicing), and compares the sum over ranks of each expert's served LoRA delta with PEFT's "
        "delta of the input adapter (computed by PEFT's own LoRA layers), both applied to seeded random probe "
        "inputs, so that no dense delta is formed. Only a folder that passes is kept. verify_export runs the same proof on any "
        "folder: on an adapter sglang serves differently (rsLoRA, per-module alphas, per-expert outer factors) "
        "it fails with this message.",
        "Never for an export of the kit's own (that would be a bug: please report it); on purpose, with "
        "verify_export on a folder that was not exported.",
        _PLAIN + "ad.config['use_rslora'] = True  # PEFT: lora_alpha / sqrt(r); sglang 0.5.23: lora_alpha / r\n"
        "save_adapter(ad, folder)\n",
        "verify_export(folder, load_adapter(folder), 2).check()  # the folder as it was trained, not exported\n",
        _EXPORT + "verify_export(out, load_adapter(folder), 2).check()\n",
        remedy="Export the adapter with inkling-lab export (its proof is this one); if the export itself refuses "
               "with this code, report the adapter: it is a bug of the kit.",
        upstream="The proof follows sglang 0.5.23's path as the doctor does (sglang/srt/lora/lora.py: "
                 "LoRAAdapter.__init__ and normalization, sglang/srt/lora/mem_pool.py: "
                 "load_lora_weight_to_buffer, sglang/srt/models/inkling_common/lora.py: set_lora_info and the "
                 "forward).", related=("ISL-W101", "ISL-W001")),
    _refusal(
        "ISL-K504", "modules_to_save: full trained copies no LoRA folder serves",
        "{file}: modules_to_save {modules}: PEFT saved full trained copies of {what}, which no LoRA adapter can "
        "serve; nothing written",
        "With modules_to_save, PEFT trains and saves a whole copy of a module instead of (or besides) a LoRA "
        "delta. A copy is not a low-rank delta: no re-export of LoRA factors serves it, and sglang 0.5.23 does "
        "not read modules_to_save at all (it would serve the base module). Dropping the copy would not serve the "
        "adapter as trained, so the export refuses; for the shared sink this is the case no re-export can cure.",
        "Training with modules_to_save (a classifier head, lm_head, the MLP or its shared experts).",
        _PLAIN + "ad.config['modules_to_save'] = ['shared_experts']\nsave_adapter(ad, folder)\n",
        _EXPORT,
        "del ad.config['modules_to_save']  # an adapter trained without saved copies\n"
        "export_for_sglang(save_adapter(ad, folder.parent / 'lora_only'), out, 2).raise_if_refused()\n",
        remedy="Merge the adapter into the base model (PEFT merge_and_unload) and serve the merged model, or "
               "train without modules_to_save.",
        upstream="sglang 0.5.23's LoRAConfig does not read modules_to_save (sglang/srt/lora/lora_config.py: "
                 "LoRAConfig.__init__): the saved copy would not be served.", related=("ISL-W109", "ISL-K502")),
    _refusal(
        "ISL-K505", "the export's output over its input",
        "refusing to write {output}: it is {relation} the input adapter {adapter} (inkling-lab never writes over "
        "its inputs); choose another output folder",
        "The export writes a new folder; replacing (with --force) the input adapter's folder, a folder that "
        "holds it, or writing inside it would destroy or mix with the adapter being read. It is refused, with "
        "or without --force.",
        "-o pointed at the adapter itself, or at its parent folder.",
        _PLAIN + "save_adapter(ad, folder)\n",
        "export_for_sglang(folder, folder, 2, force=True).raise_if_refused()\n",
        _EXPORT, exc_type=FileExistsError,
        remedy="Give -o a new folder beside the adapter, e.g. ADAPTER_for_sglang.",
        upstream=_WHERE, related=("ISL-K213",)),
    _refusal(
        "ISL-K506", "the model's size is not the adapter's",
        "{file}: the model's {what} size is {given} but the adapter's factors have {have}: export for the model "
        "the adapter was trained for",
        "--hidden and --intermediate are the model's hidden_size and one shared expert's intermediate size "
        "(before tensor parallelism), from its config.json. The adapter's factors carry their own; when they "
        "differ, the adapter is for another model, and sglang 0.5.23 would refuse it at the buffer load.",
        "A --hidden or --intermediate typed for another model, or an --intermediate divided by the TP size.",
        _PLAIN + "save_adapter(ad, folder)\n",
        "export_for_sglang(folder, out, 2, hidden=16).raise_if_refused()  # the adapter has H=8\n",
        "export_for_sglang(folder, out, 2, hidden=8, intermediate=6).raise_if_refused()\n",
        remedy="Pass the hidden_size and the per-expert intermediate size of the model the adapter was trained "
               "for (or leave them out: the export reads them from the factors).",
        upstream="sglang 0.5.23 asserts each factor's shape against its buffer (sglang/srt/lora/mem_pool.py: "
                 "LoRAMemoryPool.load_lora_weight_to_buffer) and fails with ISL-E016.", related=("ISL-E016",)),
    _refusal(
        "ISL-K507", "the model's activation is not SiLU: no export serves it",
        "the model computes {activation}(gate) * up in its shared experts ({where}); sglang {release}'s shared "
        "sink computes silu(gate) * up whatever the model's hidden_act, so no re-export of the adapter serves "
        "it as trained: nothing written",
        "transformers' InklingSharedExperts computes act_fn(gate) * up with act_fn = ACT2FN[config.hidden_act]; "
        "sglang's sink reads no activation and always computes SiLU (ISL-W113). The export's promise is an "
        "adapter sglang serves as trained; for a model of another activation even the base sink's output "
        "differs, with any LoRA factors. The export learns the activation from --hidden-act, from a given "
        "config.json (--config), from a config.json in the adapter folder, or from the one of the local base "
        "model its adapter_config.json names, and says which; without any it assumes InklingTextConfig's "
        "default, silu.",
        "Exporting an adapter of a model whose config.json says hidden_act gelu (transformers' own Inkling "
        "tests use gelu), or passing --hidden-act gelu.",
        _PLAIN + "save_adapter(ad, folder)\n",
        "export_for_sglang(folder, out, 2, hidden_act='gelu').raise_if_refused()\n",
        "export_for_sglang(folder, out, 2, hidden_act='silu').raise_if_refused()  # a SiLU model's adapter\n",
        remedy="Serve the model where its activation is computed (transformers, or an engine that reads "
               "hidden_act); sglang 0.5.23's shared sink serves SiLU models only. If the config is wrong, pass "
               "the model's real activation with --hidden-act.",
        upstream="sglang/srt/models/inkling_common/dense_mlp.py: InklingBatchDenseMLP._swiglu (silu_and_mul, "
                 "silu_and_mul_triton), the same for its LoRA subclasses in inkling_common/lora.py",
        related=("ISL-W113", "ISL-K154")),
    _refusal(
        "ISL-K508", "another module of the adapter would not load in sglang",
        "{file}: the adapter's other modules ({modules}) would not load in sglang {release}: {why}; nothing "
        "written: {fix}, or drop those modules from the adapter (the export keeps every module as trained and "
        "invents no factors)",
        "The export keeps every module besides the shared sink (attention LoRA and the like) under its own name. "
        "sglang reads one layer's weights together: LoRAAdapter._normalize_weights stacks a q_proj with its "
        "k_proj and v_proj into qkv_proj (a missing k_proj is zero-filled, a missing v_proj is its KeyError), "
        "Inkling's wq_du, wk_dv, wv_dv and wr_du into qkvr, and the buffer load then fails on a weight whose "
        "name holds no target module (ISL-E036). Before writing, the export sends those modules, as it would "
        "write them, down the kit's model of that path; where it fails (or the kit cannot tell), no folder "
        "would load, so the export refuses. It adds no factors: a zero v_proj adds no delta, but its shape is "
        "the model's attention size, which the adapter does not carry and the kit's model does not check. "
        "Every module the export writes is also a target module of the server, and sglang's Inkling model has "
        "LoRA buffers for qkvr, wo_ud, gate_up_proj, down_proj, embed_tokens and lm_head only: a q_proj/v_proj "
        "pair, an o_proj or a wq_du fails the server's start (ISL-E038).",
        "An adapter with LoRA on attention modules other than qkvr and wo_ud: q_proj, k_proj, v_proj, o_proj "
        "(Inkling has none: ISL-E038, or normalize_qkv_proj's KeyError for a q_proj without its v_proj), or "
        "Inkling's wq_du, wk_dv, wv_dv, wr_du (ISL-E038; all four are stacked into qkvr).",
        _PLAIN + "save_adapter(ad, folder)\n"
        "from safetensors.torch import load_file, save_file\n"
        "weights = load_file(folder / 'adapter_model.safetensors')\n"
        "q = 'base_model.model.model.layers.0.self_attn.q_proj'\n"
        "weights[q + '.lora_A.weight'], weights[q + '.lora_B.weight'] = torch.ones(4, 8), torch.ones(16, 4)\n"
        "save_file(weights, folder / 'adapter_model.safetensors')  # q_proj without its v_proj\n",
        _EXPORT,
        "del weights[q + '.lora_A.weight'], weights[q + '.lora_B.weight']  # Inkling serves no q_proj (ISL-E038)\n"
        "save_file(weights, folder / 'adapter_model.safetensors')\n" + _EXPORT,
        remedy="Export the adapter without those modules (split them off, or merge them into the base weights "
               "with PEFT merge_and_unload): of the attention, sglang's Inkling model serves LoRA on qkvr and "
               "wo_ud only, and a server whose target modules name another (q_proj, o_proj, wq_du) does not start "
               "(ISL-E038).",
        upstream="sglang/srt/lora/lora.py: LoRAAdapter.normalize_qkv_proj (reads a q_proj's v_proj: KeyError) and "
                 "LoRAAdapter.normalize_inkling_qkvr_proj; sglang/srt/lora/mem_pool.py: "
                 "LoRAMemoryPool.load_lora_weight_to_buffer, names through sglang/srt/lora/utils.py: "
                 "get_target_module_name (ValueError, ISL-E036); sglang/srt/models/inkling.py: "
                 "InklingForConditionalGeneration.get_hidden_dim (NotImplementedError at server start, ISL-E038)",
        related=("ISL-E036", "ISL-E038", "ISL-K502")),
    CatalogEntry(
        code="ISL-N501", title="per-expert outer factors exported at rank n·r", exc_type=None, kind="note",
        message="{module}: per-expert outer factors re-expressed as shared outer at rank n·r = {n}·{r} = {rank}, "
                "exactly (the shared A's and B's stack the experts' own; each expert's inner factor holds its "
                "block, zeros elsewhere)",
        meaning="sglang 0.5.23 computes the per-expert outer layout wrongly (ISL-W001) and fails the "
                "buffer load of PEFT target_parameters exports, whose keys match no target module (ISL-N204, "
                "ISL-E036). The export writes the same math in the shared-outer "
                "layout, which sglang computes right: the shared gate/up A is the experts' A's stacked [n·r, H], "
                "expert e's gate/up B holds its own B in columns e·r .. e·r+r-1 and zeros elsewhere; the shared "
                "down B puts the experts' B's side by side [H, n·r], expert e's down A holds its own A in rows "
                "e·r .. e·r+r-1. B_e' A = B_e A_e exactly. The rank grows to n·r, so the server needs "
                "--max-lora-rank at least that.",
        when="Every export of an adapter whose experts have their own outer factors (every PEFT "
             "target_parameters export of transformers' Inkling).",
        setup=_SETUP + "save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, per_expert=True), "
                       "folder)\n",
        trigger="export_for_sglang(folder, out, 2)\n",
        fix="print(export_for_sglang(folder, out, 2, force=True).server_flags)  # start sglang with these: "
            "--max-lora-rank 8\n",
        remedy="Nothing to do: start the server with --max-lora-rank at least the rank the export reports.",
        upstream="sglang/srt/lora/lora_manager.py: LoRAManager.init_lora_shapes (the pool's max rank); the "
                 "per-expert defect is ISL-W001.", generation=KIT_NOTE, related=("ISL-W001", "ISL-N204"),
        releases=EVERY_RELEASE),
]
