"""Exports of transformers' Inkling and pool files: PEFT target_parameters exports of the
3D expert parameters, read per expert, and the converter's pool files read back."""
from __future__ import annotations

from ._snippets import FOLDER
from .entry import EVERY_RELEASE, KIT, KIT_NOTE, CatalogEntry

_PEFT = ("import json\n"
         "from inkling_lab.adapters import load_adapter, save_adapter, synthetic_adapter\n"
         "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=2, per_expert=True)\n"
         "folder = save_adapter(ad, il.scratch_folder() / 'peft', target_parameters=True)  # as PEFT saves it\n"
         "config_file = folder / 'adapter_config.json'\n"
         "config = json.loads(config_file.read_text())\n")
_INJECT = "peft/tuners/tuners_utils.py: BaseTuner._inject_parameters"
_WRAPPER = "peft/tuners/lora/layer.py: ParamWrapper.update_layer and get_delta_weight"

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-K401", title="a PEFT target_parameters export whose nesting the config does not explain",
        exc_type=ValueError,
        message="{file}: {module}: the file holds a PEFT target_parameters export ({pairs} nested factor pair(s): "
                "{depths}) but adapter_config.json's target_parameters {targets} name {named} of {module}'s "
                "parameters {parameters}: the nesting cannot be read without them; restore target_parameters "
                "as saved by PEFT",
        meaning="PEFT's target_parameters route wraps each targeted 3D parameter of transformers' "
                "InklingSharedExperts in its own ParamWrapper, nested in the order the module registers them "
                "(gate_proj innermost, then up_proj, then down_proj, whatever the order of the list), so the "
                "file names its factors only 'shared_experts[.base_layer...].lora_A.weight': which projection a "
                "pair belongs to follows from how many of the three the config's target_parameters name. When "
                "the list and the nesting disagree, the pairs cannot be assigned.",
        when="A config edited by hand or copied from another adapter, or a weights file filtered after PEFT "
             "saved it.",
        setup=_PEFT,
        trigger="config_file.write_text(json.dumps({**config, 'target_parameters': ['mlp.shared_experts.up_proj']}))\n"
                "load_adapter(folder)\n",
        fix="config_file.write_text(json.dumps(config))  # target_parameters as PEFT saved them\n"
            "load_adapter(folder)\n",
        remedy="Restore adapter_config.json's target_parameters as PEFT wrote them (the list of the sink's "
               "parameters the adapter trains), or re-export the adapter with save_pretrained.",
        upstream=f"PEFT nests the wrappers in {_INJECT} (it walks module.named_parameters()); sglang 0.5.23 "
                 "matches none of these keys to a target module (ISL-W002) and its buffer load fails on them (ISL-E036).",
        generation=KIT, adapter_caused=True, related=("ISL-K402", "ISL-N204", "ISL-W002"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K402", title="a PEFT target_parameters factor that does not split into experts of rank r",
        exc_type=ValueError,
        message="{file}: {module} {proj} (PEFT target_parameters): lora_A is {shape_a} and lora_B {shape_b}; a "
                "ParamWrapper over n experts of rank r={r} stores lora_A [n*r, in] and lora_B [out, n*r]: "
                "re-export the adapter, or fix r in adapter_config.json",
        meaning="A ParamWrapper over a 3D parameter of n experts keeps one rank-r pair per expert inside two 2D "
                "matrices: lora_A [n*r, in] (expert e is rows e*r .. e*r+r-1) and lora_B [out, n*r] (expert e "
                "is columns e, e+n, e+2n, ...). Rows that do not split into whole experts of the config's r, or "
                "an A and a B that disagree, mean the config's r is not the adapter's.",
        when="An r edited in the config, or a damaged file.",
        setup=_PEFT,
        trigger="config_file.write_text(json.dumps({**config, 'r': 5}))  # the adapter has r=2\n"
                "load_adapter(folder)\n",
        fix="config_file.write_text(json.dumps(config))\nload_adapter(folder)\n",
        remedy="Put the adapter's real r in adapter_config.json (lora_A's rows are n_shared_experts * r), or "
               "re-export it with save_pretrained.",
        upstream=f"The layout is PEFT's ({_WRAPPER}); sglang 0.5.23 reads none of these keys (ISL-W002).",
        generation=KIT, adapter_caused=True, related=("ISL-K401", "ISL-K206"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-N204", title="a PEFT target_parameters export, read as per-expert factors", exc_type=None,
        kind="note",
        message="{module}: a PEFT target_parameters export ({parameters}, {n} experts of rank {r}); read as "
                "per-expert factors (expert e: lora_A rows e*r.., lora_B columns e, e+n, ...)",
        meaning="PEFT's natural route for transformers' Inkling (its shared experts are 3D parameters) is "
                "target_parameters: one ParamWrapper per parameter, each expert its own rank-r A and B inside "
                "one lora_A [n*r, in] and one lora_B [out, n*r]. The kit reads them as the per-expert factors "
                "they are (the per-expert outer layout) and converts them exactly: the pool computes PEFT's "
                "merged weights. sglang 0.5.23 does not: its buffer load warns that these keys match no target "
                "module (ISL-W002) and then fails on them (ISL-E036).",
        when="Any PEFT LoRA trained on transformers' InklingSharedExperts with target_parameters.",
        setup=_PEFT,
        trigger="load_adapter(folder)\n",
        fix="load_adapter(save_adapter(load_adapter(folder), folder.parent / 'per_expert'))  # the kit's names\n",
        remedy="Nothing to do for the kit (inkling-lab convert converts it exactly). For sglang 0.5.23, "
               "inkling-lab export writes the same math as a servable adapter (shared outer, the sink's own "
               "names), or merge it into the base weights (PEFT merge_and_unload); re-saved under per-expert "
               "names it would load in the per-expert outer layout, which sglang 0.5.23 computes wrongly "
               "(ISL-W001).",
        upstream="sglang 0.5.23 matches none of these keys to a target module (sglang/srt/lora/mem_pool.py: "
                 "LoRAMemoryPool.load_lora_weight_to_buffer, via srt/lora/utils.py: get_target_module_name): it "
                 "names them in a warning and then raises on the first of them, whatever --lora-target-modules "
                 "says (every release 0.5.16 to 0.5.23).",
        generation=KIT_NOTE, adapter_caused=True, related=("ISL-W002", "ISL-W001", "ISL-K401"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K403", title="not an inkling-lab pool file", exc_type=ValueError,
        message="{file}: not an inkling-lab pool file ({why}); make one with `inkling-lab convert`",
        meaning="load_pool reads only files that inkling-lab convert (or ConvertedPool.save) wrote: a "
                "safetensors file whose metadata holds the pool's format, geometry, slots and modules, and "
                "the four buffers of every module it lists. Anything else (an adapter's weights, another "
                "safetensors file, a damaged or truncated pool) is refused with the file named.",
        when="Passing an adapter's adapter_model.safetensors, or a pool file that was cut short or edited.",
        setup=FOLDER + "from inkling_lab.convert import convert, load_pool\n",
        trigger="load_pool(folder / 'adapter_model.safetensors')  # an adapter, not a pool\n",
        fix="pool_file = convert([load_adapter(folder)], 2).save(folder.parent / 'pool.safetensors')\n"
            "load_pool(pool_file)\n",
        remedy="Give load_pool a file that inkling-lab convert wrote; convert the adapter first "
               "(inkling-lab convert ADAPTER -n N -o POOL).",
        upstream="Nothing upstream: sglang writes no pool file; this is the kit's converter "
                 "(inkling-lab convert).",
        generation=KIT, related=("ISL-K213", "ISL-K204"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K420", title="a checkpoint index entry outside the checkpoint folder", exc_type=ValueError,
        message="{file}: a weight_map entry names the shard {shard}: shards must lie inside the checkpoint "
                "folder (a relative name, no '..', not absolute): fix the index or point at the right folder",
        meaning="model.safetensors.index.json maps each tensor to a shard file of the same folder. An entry "
                "that is absolute or climbs out with '..' would make the kit read a file the checkpoint does "
                "not hold (anything on the machine). The name is what is checked: a shard that is a symlink "
                "into a cache (as the Hugging Face hub lays them out) is read as usual.",
        when="An index edited by hand or generated by a script that wrote full paths.",
        setup=("import json\nfrom safetensors.torch import save_file\n"
               "folder = il.scratch_folder()\nkey = 'model.layers.0.mlp.shared_experts.gate_proj'\n"
               "save_file({key: torch.zeros(2, 6, 8)}, folder / 'shard.safetensors')\n"
               "index = folder / 'model.safetensors.index.json'\n"
               "from inkling_lab.transformers_interop import sink_from_checkpoint\n"),
        trigger="index.write_text(json.dumps({'weight_map': {key: '../shard.safetensors'}}))\n"
                "sink_from_checkpoint(folder)\n",
        fix="index.write_text(json.dumps({'weight_map': {key: 'shard.safetensors'}}))\n"
            "from inkling_lab.transformers_interop import _key_files\n_key_files(folder)\n",
        remedy="Write each shard's file name (relative to the folder) in the index, as save_pretrained does.",
        upstream="Nothing of sglang's shared-sink path: the kit reads a checkpoint's sink for its own use "
                 "(sink_from_checkpoint); sglang's loader reads the folder's *.safetensors itself "
                 "(sglang/srt/model_loader/weight_utils.py: safetensors_weights_iterator).",
        generation=KIT, related=("ISL-K421", "ISL-K232"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K421", title="one tensor name twice in a checkpoint", exc_type=ValueError,
        message="{file}: tensor {key} is given twice ({first} and {second}): which one is the checkpoint's is "
                "not in the files; keep one",
        meaning="Each tensor of a checkpoint lives in one place: one entry of the index's weight_map, one shard. "
                "JSON keeps the last of two equal keys, and a reader that takes whichever shard comes last would "
                "serve one of two different tensors without a word; the kit refuses and names both.",
        when="Two exports merged into one folder, an index concatenated by hand, a shard copied under two names.",
        setup=("import json\nfrom safetensors.torch import save_file\n"
               "folder = il.scratch_folder()\nkey = 'model.layers.0.mlp.shared_experts.gate_proj'\n"
               "for name in ('a.safetensors', 'b.safetensors'):\n"
               "    save_file({key: torch.zeros(2, 6, 8)}, folder / name)\n"
               "index = folder / 'model.safetensors.index.json'\n"
               "from inkling_lab.transformers_interop import _key_files\n"),
        trigger="index.write_text('{\"weight_map\": {\"' + key + '\": \"a.safetensors\", \"' + key + '\": "
                "\"b.safetensors\"}}')\n_key_files(folder)\n",
        fix="index.write_text(json.dumps({'weight_map': {key: 'a.safetensors'}}))\n"
            "(folder / 'b.safetensors').unlink()\n_key_files(folder)\n",
        remedy="Keep one copy of the tensor (the index entry and the shard it names), as save_pretrained writes it.",
        upstream="Nothing of sglang's shared-sink path: the kit reads a checkpoint's sink for its own use "
                 "(sink_from_checkpoint); sglang's loader reads every *.safetensors of the folder "
                 "(sglang/srt/model_loader/weight_utils.py: safetensors_weights_iterator).",
        generation=KIT, related=("ISL-K420", "ISL-K307"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K422", title="a checkpoint's sink tensors of no working dtype, or of mixed dtypes",
        exc_type=TypeError,
        message="{where}: the sink's tensors are {dtypes}: a sink is one float dtype (float16, bfloat16, float32 "
                "or float64); pass dtype= to cast them all to one (the widest keeps every value)",
        meaning="A sink computes in one dtype. An integer tensor would have made an integer sink, and a float16 "
                "gate next to float32 up and down would have rounded them to float16 without a word: the kit "
                "refuses and lists each tensor's dtype. Given dtype=, the cast is asked for and done.",
        when="A checkpoint assembled from exports of different precision, or a quantized tensor among them.",
        setup=("from safetensors.torch import save_file\n"
               "folder = il.scratch_folder()\np = 'model.layers.0.mlp.shared_experts.'\n"
               "state = {p + 'gate_proj': torch.zeros(2, 6, 8, dtype=torch.float16),\n"
               "         p + 'up_proj': torch.zeros(2, 6, 8), p + 'down_proj': torch.zeros(2, 8, 6)}\n"
               "save_file(state, folder / 'model.safetensors')\n"
               "from inkling_lab.transformers_interop import sink_from_checkpoint\n"),
        trigger="sink_from_checkpoint(folder)\n",
        fix="sink_from_checkpoint(folder, dtype=torch.float32)\n",
        remedy="Pass dtype= (the model's serving dtype, or float32 to keep every value), or re-save the "
               "checkpoint in one dtype.",
        upstream="Nothing of sglang's shared-sink path: the kit reads a checkpoint's sink for its own use "
                 "(sink_from_checkpoint); sglang copies each checkpoint tensor into the model's parameters, "
                 "which casts it (sglang/srt/model_loader/weight_utils.py: default_weight_loader).",
        generation=KIT, related=("ISL-K231",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K423", title="a checkpoint's sink weights hold NaN or infinity", exc_type=ValueError,
        message="{where}: {param} has {count} of {total} value(s) NaN or infinite in {dtype} ({how}): every "
                "output of the sink would be NaN; load it in a dtype that holds its values (dtype=torch.float32) "
                "or re-export the checkpoint from finite weights",
        meaning="The sink's base weights take part in every token's output: one NaN or infinite value in gate, up "
                "or down makes the outputs NaN without a word. The kit checks the weights as read and after the "
                "cast dtype= asks for (a float32 value past 65504 is infinite in float16), and names the tensor.",
        when="A checkpoint saved from a diverged run, or a float32 checkpoint loaded with dtype=torch.float16 "
             "whose weights exceed float16's range.",
        setup=("from safetensors.torch import save_file\n"
               "folder = il.scratch_folder()\np = 'model.layers.0.mlp.shared_experts.'\n"
               "state = {p + 'gate_proj': torch.full((2, 6, 8), 1e5), p + 'up_proj': torch.zeros(2, 6, 8),\n"
               "         p + 'down_proj': torch.zeros(2, 8, 6)}\n"
               "save_file(state, folder / 'model.safetensors')\n"
               "from inkling_lab.transformers_interop import sink_from_checkpoint\n"),
        trigger="sink_from_checkpoint(folder, dtype=torch.float16)\n",
        fix="sink_from_checkpoint(folder, dtype=torch.float32)\n",
        remedy="Load the sink in a dtype that holds its values (float32), or re-export the checkpoint from finite "
               "weights.",
        upstream="Nothing of sglang's shared-sink path: sglang copies the checkpoint's tensors into the model's "
                 "parameters as they are (sglang/srt/model_loader/weight_utils.py: default_weight_loader) and "
                 "serves NaN.",
        generation=KIT, related=("ISL-K422", "ISL-K160"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K233", title="one module's factors saved two ways (a target_parameters export and named factors)",
        exc_type=ValueError,
        message="{file}: {module} holds a PEFT target_parameters export ({nested} nested factor pair(s)) and "
                "{count} factor(s) under projection names, such as {key}: two readings of one module, one of "
                "which would be dropped; keep one export",
        meaning="A module's shared-sink factors come either as PEFT's target_parameters export (nested "
                "ParamWrapper pairs, read per expert) or under the projections' names. Both in one file give "
                "two candidates for the same factors (a per-expert gate_proj from each), and keeping either "
                "would silently drop the other: the kit refuses and names both.",
        when="A weights file merged from two exports of the same adapter, or a hand-added factor next to a "
             "PEFT target_parameters export.",
        setup=("from inkling_lab.adapters import Adapter, load_adapter, save_adapter, synthetic_adapter\n"
               "from safetensors.torch import load_file, save_file\n"
               "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=2, per_expert=True)\n"
               "folder = save_adapter(ad, il.scratch_folder() / 'peft', target_parameters=True)\n"
               "weights = load_file(folder / 'adapter_model.safetensors')\n"
               "classic = 'base_model.model.model.layers.0.mlp.shared_experts.0.gate_proj.lora_A.weight'\n"),
        trigger="save_file({**weights, classic: ad.weights[classic]}, folder / 'adapter_model.safetensors')\n"
                "load_adapter(folder)\n",
        fix="save_file(weights, folder / 'adapter_model.safetensors')  # the export alone\nload_adapter(folder)\n",
        remedy="Keep one of the two exports of the module (PEFT's save_pretrained writes one).",
        upstream="sglang 0.5.23 matches the nested target_parameters keys to no target module (ISL-W002) and its "
                 "buffer load fails on them, the named factors notwithstanding (ISL-E036; sglang/srt/lora/"
                 "mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer).",
        generation=KIT, adapter_caused=True, related=("ISL-N204", "ISL-K307"), releases=EVERY_RELEASE),
]
