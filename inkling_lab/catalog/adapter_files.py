"""Refusals of adapter files: the folder, its config, its weights file, its tensor names
and shapes (the kit's reader, ``inkling_lab.adapters``), and the converter's output."""
from __future__ import annotations

from ._snippets import ADAPTER, FOLDER
from .entry import EVERY_RELEASE, KIT, CatalogEntry, Repair

_READ = "sglang/srt/lora/lora_config.py: LoRAConfig.get_lora_config"
_NAMES = ("sglang keeps every tensor whose name has a layer id (sglang/srt/lora/lora.py: "
          "LoRAAdapter._process_weight) and ")

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-K201", title="no adapter_config.json in the adapter folder", exc_type=FileNotFoundError,
        message="{folder}/adapter_config.json: no adapter_config.json{why}: a PEFT adapter is a folder with "
                "adapter_config.json and adapter_model.safetensors",
        meaning="load_adapter (and inkling-lab doctor/convert) read a PEFT adapter folder: its config gives "
                "the rank r and lora_alpha, without which the factors cannot be checked or scaled. The path "
                "named no such file: a wrong folder, a parent folder, or a checkpoint saved without its config.",
        when="Pointing at the training run's output folder instead of the adapter inside it, a typo, or "
             "copying only the weights file.",
        setup=FOLDER,
        trigger="(folder / 'adapter_config.json').unlink()  # only the weights are left\n"
                "load_adapter(folder)\n",
        fix="load_adapter(folder)  # the folder that holds adapter_config.json and adapter_model.safetensors\n",
        remedy="Point at the folder PEFT's save_pretrained wrote (it holds adapter_config.json); for a "
               "training run that is usually a checkpoint-*/ or adapter/ subfolder, or a named sub-adapter's "
               "folder.",
        doctor_fix="point at the folder that holds adapter_config.json and adapter_model.safetensors",
        upstream=f"sglang reads the same file: {_READ} opens <path>/adapter_config.json and fails with "
                 "FileNotFoundError: [Errno 2] No such file or directory (for a local folder; a hub id is "
                 "downloaded first).",
        generation=KIT, related=("ISL-K202", "ISL-K203"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K202", title="a malformed adapter config", exc_type=ValueError,
        message="{folder}/adapter_config.json: malformed adapter config: {problem}",
        meaning="adapter_config.json must be a JSON object of a LoRA adapter with a positive integer r and "
                "a numeric lora_alpha (PEFT's default 8 when absent). The message names the field and the "
                "value found.",
        when="A hand-edited config (a string for r, a trailing comma), a config of another PEFT method, or "
             "a file truncated on copy.",
        setup=FOLDER + "config = folder / 'adapter_config.json'\n",
        trigger="config.write_text('{\"peft_type\": \"LORA\", \"r\": \"four\", \"lora_alpha\": 8}')\n"
                "load_adapter(folder)\n",
        fix="config.write_text('{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8}')\n"
            "load_adapter(folder)\n",
        remedy="Correct the field the message names to the value the adapter was trained with (r: the "
               "LoRA rank, an integer; lora_alpha: a number), or save the config again with PEFT.",
        doctor_fix="correct that field of adapter_config.json (the value the adapter was trained with)",
        upstream=f"sglang reads the same file without checks: {_READ} (json.load: invalid JSON raises "
                 "json.JSONDecodeError), LoRAConfig.__init__ (a missing target_modules, r or lora_alpha "
                 "raises KeyError: sglang has no default for lora_alpha) and sglang/srt/lora/lora.py: "
                 "LoRAAdapter.__init__ (a non-LoRA peft_type fails its assert; a non-numeric r or lora_alpha "
                 "raises TypeError at lora_alpha / r).",
        generation=KIT, related=("ISL-K201", "ISL-K206"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K203", title="no adapter_model.safetensors (pickle checkpoints are refused)",
        exc_type=FileNotFoundError,
        message="{folder}/adapter_model.safetensors: no adapter_model.safetensors{found}",
        meaning="The kit loads adapter weights only from safetensors: unpickling a .bin or .pt file can run "
                "arbitrary code, so such files are never opened. When an adapter_model.bin is there, the "
                "message says so: convert a checkpoint you trust once, with torch.load(..., "
                "weights_only=True) and safetensors.torch.save_file.",
        when="Old PEFT versions (adapter_model.bin), or a folder whose weights were not copied.",
        setup=FOLDER + "from safetensors.torch import load_file, save_file\n"
              "bin_path = folder / 'adapter_model.bin'\n"
              "torch.save(load_file(folder / 'adapter_model.safetensors'), bin_path)\n"
              "(folder / 'adapter_model.safetensors').unlink()  # an old-style folder: weights as a pickle\n",
        trigger="load_adapter(folder)\n",
        fix="save_file(torch.load(bin_path, weights_only=True), folder / 'adapter_model.safetensors')\n"
            "load_adapter(folder)\n",
        remedy="With an adapter_model.bin you trust: python -c \"import torch, safetensors.torch as s; "
               "s.save_file(torch.load('adapter_model.bin', weights_only=True), 'adapter_model.safetensors')\" "
               "in the adapter folder; with no weights file, copy adapter_model.safetensors next to the config.",
        doctor_fix="save the adapter with PEFT's save_pretrained, which writes adapter_model.safetensors",
        upstream="sglang 0.5.23 reads this folder: sglang/srt/lora/lora.py: LoRAAdapter.initialize_weights "
                 "iterates every *.safetensors and falls back to *.bin (fall_back_to_pt=True), read by "
                 "sglang/srt/model_loader/weight_utils.py: _load_pt_file with torch.load(weights_only=True). "
                 "With no weights file at all it loads no tensor, and the adapter changes nothing.",
        generation=KIT, related=("ISL-K201", "ISL-K204"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K204", title="a truncated or corrupt safetensors file", exc_type=ValueError,
        message="{folder}/adapter_model.safetensors: not a readable safetensors file ({size} bytes: {reason}); "
                "it is truncated or corrupt: export or download it again",
        meaning="The weights file does not parse as safetensors: its header or its data is cut short or "
                "overwritten. Nothing of it is used.",
        when="An interrupted download or copy, a full disk during export, a Git LFS pointer file instead of "
             "the weights.",
        setup=FOLDER + "weights = folder / 'adapter_model.safetensors'\ncomplete = weights.read_bytes()\n",
        trigger="weights.write_bytes(complete[:100])  # cut short\nload_adapter(folder)\n",
        fix="weights.write_bytes(complete)  # the whole file again\nload_adapter(folder)\n",
        remedy="Download or copy the file again and compare its size with the source (a Git LFS pointer is "
               "about 130 bytes: run git lfs pull).",
        doctor_fix="download or export adapter_model.safetensors again (the file is cut short or corrupt)",
        upstream="sglang reads it with the safetensors library too (sglang/srt/model_loader/weight_utils.py, "
                 "through LoRAAdapter.initialize_weights) and stops with that library's own error for the "
                 "file.",
        generation=KIT, related=("ISL-K203",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K205", title="a shared-sink factor that is not a 2D matrix", exc_type=ValueError,
        message="{file}: tensor {key} is {ndim}D {shape}; a shared-sink LoRA factor is a 2D matrix "
                "{expected}: {advice}",
        meaning="In a PEFT file every shared-sink factor is one plain matrix: A [r, in], B [out, r], with the "
                "experts stacked (B) or side by side (down A) in the flat layout. The pool's expert and slot "
                "axes are added by normalization and the converter, not stored in the adapter.",
        when="An adapter re-saved from an engine's pool or from an MoE framework that keeps an expert axis.",
        setup=ADAPTER,
        trigger="Adapter.from_state(ad.config, {**ad.weights, key: ad.weights[key].reshape(4, 2, 6)})  # [r, n, F]\n",
        fix="Adapter.from_state(ad.config, ad.weights)  # down A as PEFT stores it: [r, n*F] = [4, 12]\n",
        remedy="Save the factor as PEFT does, one 2D matrix per module: down A [r, n*F] "
               "(experts side by side), gate/up B [n*F, r] (stacked), A of gate/up [r, H], down B [H, r]; "
               "or name one factor per expert (shared_experts.<e>.<proj>).",
        upstream=_NAMES + "LoRAAdapter._normalize_shared_expert_moe reshapes only 2D factors; a 3D factor "
                 "reaches the pool load as it is and fails mem_pool's shape assertion (ISL-E016) unless its "
                 "shape happens to be the buffer view's.",
        generation=KIT, adapter_caused=True, related=("ISL-K206", "ISL-E001", "ISL-E016"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K206", title="a factor's rank axis does not match r", exc_type=ValueError,
        message="{file}: tensor {key} has shape {shape}: its rank axis (dim {axis}) is {size}, but "
                "adapter_config.json says r={r}; {advice}",
        meaning="A is [r, in] (rank axis 0), B is [out, r] (rank axis 1), and r comes from the config. A "
                "factor whose other axis is r is stored transposed: load_adapter transposes it and reports "
                "the repair (repair=False refuses). Otherwise the config's r or the factor is wrong.",
        when="An export that wrote A or B transposed (a Linear's weight vs. a matmul operand), an r edited in "
             "the config, or a config of another adapter.",
        setup=ADAPTER,
        trigger="Adapter.from_state(ad.config, {**ad.weights, key: ad.weights[key].T}, repair=False)  # [n*F, r]\n",
        fix="repaired = Adapter.from_state(ad.config, {**ad.weights, key: ad.weights[key].T})  # repair=True\n"
            "print(repaired.findings[0].code, 'repaired:', list(repaired.weights[key].shape))\n",
        remedy="If the message says the factor is transposed, load with repair (the default) or save it "
               "transposed back; otherwise set r in adapter_config.json to the rank the factors were trained "
               "with (per module: rank_pattern).",
        doctor_fix="re-export each named factor at the rank the config gives its module (r, or its rank_pattern entry); "
                   "if every factor agrees on another rank, correct r (or let --repair read it)",
        upstream="sglang sizes each slot's buffer view by the config's r (sglang/srt/lora/mem_pool.py: "
                 "LoRAMemoryPool.load_lora_weight_to_buffer) and never transposes: such a factor fails the "
                 "shape assertion there (ISL-E016).",
        repaired=Repair("{key} is stored transposed {shape}; read as {transposed} {expected} ({said})",
                        "none needed: the converter transposes it; re-export it as {expected} to silence this",
                        "sglang 0.5.23 reads it as stored (the doctor's verdict says what that gives)"),
        generation=KIT, adapter_caused=True, related=("ISL-K202", "ISL-K205", "ISL-E016"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K207", title="a tensor under shared_experts names no shared-sink projection", exc_type=ValueError,
        message="{file}: tensor {key} is under shared_experts but is no shared-sink LoRA factor: expected "
                "'<module>.shared_experts[.<e>].<proj>.lora_A.weight' (or lora_B) with <proj> one of "
                "{projections}{hint}",
        meaning="The shared sink's projections are gate_proj, up_proj, gate_up_proj and down_proj (or w1, "
                "w3, w2). A key under shared_experts with another name, or that is no lora_A/lora_B weight, "
                "matches no target module of sglang, whose buffer load fails on it (ISL-E036); the kit refuses it "
                "and suggests the closest name.",
        when="A typo in an export script, another model family's names, or DoRA/bias tensors under the sink.",
        setup=ADAPTER,
        trigger="typo = {k.replace('gate_proj', 'gate_prj'): v for k, v in ad.weights.items()}\n"
                "Adapter.from_state(ad.config, typo)\n",
        fix="Adapter.from_state(ad.config, ad.weights)  # gate_proj, up_proj, down_proj\n",
        remedy="Rename the tensor to the projection it trains (the message suggests the closest name), or "
               "drop it if it is no LoRA factor.",
        upstream=_NAMES + "names, in ISL-W002's warning, every weight whose name contains none of the "
                 "server's target modules (sglang/srt/lora/mem_pool.py: LoRAMemoryPool."
                 "load_lora_weight_to_buffer), and then fails on the first of them (ISL-E036): an adapter with a "
                 "misspelt projection cannot be used.",
        generation=KIT, adapter_caused=True, related=("ISL-K208", "ISL-W002"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K208", title="no shared-sink LoRA factors in the adapter", exc_type=ValueError,
        message="{file}: no shared-sink LoRA factors: no tensor is named "
                "'<module>.mlp.shared_experts.<proj>.lora_A.weight' (or lora_B), <proj> one of {projections}; "
                "the file holds {count} tensor(s) for other modules",
        meaning="The adapter trains other modules only (attention, routed experts): there is nothing to put "
                "in the shared sink's pool.",
        when="An adapter whose target_modules did not include the shared experts' projections.",
        setup=ADAPTER,
        trigger="attention_only = {'model.layers.0.self_attn.q_proj.lora_A.weight': torch.zeros(4, 8),\n"
                "                  'model.layers.0.self_attn.q_proj.lora_B.weight': torch.zeros(8, 4)}\n"
                "Adapter.from_state(ad.config, attention_only)\n",
        fix="Adapter.from_state(ad.config, ad.weights)  # trained with the shared experts in target_modules\n",
        remedy="Nothing to convert for the sink: serve this adapter without a shared-sink pool, or retrain "
               "with the shared experts' projections in target_modules.",
        doctor_fix="train with the shared experts' projections in target_modules: there is nothing for the sink",
        upstream="sglang loads such an adapter without complaint and the shared sink serves the base model "
                 "(its pool slot is zeroed: sglang/srt/lora/mem_pool.py: load_lora_weight_tensor zeroes a "
                 "buffer whose weight is absent).",
        generation=KIT, adapter_caused=True, related=("ISL-K207",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K209", title="a LoRA A without its B (or B without A)", exc_type=ValueError,
        message="{file}: {key} has no matching {other}: every LoRA factor needs its A and its B",
        meaning="A LoRA delta is B @ A: one without the other is no delta at all, and usually means a tensor "
                "was lost or renamed on export.",
        when="A filtered or merged state dict, a renamed key.",
        setup=ADAPTER,
        trigger="no_b = {k: v for k, v in ad.weights.items() if k != key.replace('lora_A', 'lora_B')}\n"
                "Adapter.from_state(ad.config, no_b)\n",
        fix="Adapter.from_state(ad.config, ad.weights)\n",
        remedy="Export the adapter again with both factors of every module (the message names the missing "
               "key); a factor renamed after training must be renamed back.",
        doctor_fix="export the missing factor too (its key is in the message): a LoRA delta is B @ A",
        upstream="sglang loads the lone factor and zeroes the missing one's buffer "
                 "(sglang/srt/lora/mem_pool.py: load_lora_weight_tensor zeroes a buffer whose weight is "
                 "absent), so that module's delta B @ A is zero: the base model for it, without a word.",
        generation=KIT, adapter_caused=True, related=("ISL-K208",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K213", title="refusing to write over a file", exc_type=FileExistsError,
        message="refusing to write {file}: {reason}",
        meaning="The converter never replaces a file unless told to (--force), and never writes over one of "
                "its input adapters, even with --force. Its writes are atomic: a reader sees the old file or "
                "the whole new one.",
        when="Re-running inkling-lab convert with the same -o, or -o pointing into an adapter folder.",
        setup=FOLDER + "from inkling_lab.convert import convert\n"
              "pool = convert([load_adapter(folder)], n_shared_experts=2)\n"
              "out = folder.parent / 'pool.safetensors'\npool.save(out)\n",
        trigger="pool.save(out)  # a second time\n",
        fix="pool.save(out, force=True)\n",
        remedy="To replace the file, pass --force on the command line (force=True in Python), or choose another -o; an input adapter's file "
               "is never overwritten: write the pool elsewhere.",
        upstream="Nothing upstream: sglang writes no pool file; this is the kit's converter "
                 "(inkling-lab convert).",
        generation=KIT, related=(), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K230", title="a shared-sink factor of a dtype a pool cannot hold", exc_type=ValueError,
        message="{file}: tensor '{key}' is {dtype}: a LoRA factor is float16, bfloat16, float32 or float64 "
                "(what sglang's pool and its kernels compute in): export the factors in one of those",
        meaning="The pool holds every factor in one float dtype and folds the scaling into B. An integer or "
                "boolean factor would be truncated data, a complex one has no place in a real GEMM, and "
                "float8 has no arithmetic in torch: the scaling step would fail or write something else than "
                "the adapter. The kit refuses the file and names the tensor.",
        when="A quantized export (int8, float8), a tensor saved with the wrong dtype by a custom script, or a "
             "mask saved under a factor's name.",
        setup=ADAPTER,
        trigger="Adapter.from_state(ad.config, {**ad.weights, key: ad.weights[key].to(torch.int32)})\n",
        fix="Adapter.from_state(ad.config, {**ad.weights, key: ad.weights[key].to(torch.float32)})\n",
        remedy="Export the factors in float16, bfloat16 or float32 (dequantize a quantized adapter first).",
        upstream="sglang 0.5.23 multiplies B by the scaling and copies every factor into its bf16 buffers "
                 "(sglang/srt/lora/mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer): integers are cast "
                 "silently, float8 fails in the multiplication; the kit's doctor says it does not model which.",
        generation=KIT, adapter_caused=True, related=("ISL-K231", "ISL-K205"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K231", title="the factors of one module in different dtypes", exc_type=ValueError,
        message="{file}: {module}: its factors have different dtypes ({dtypes}): cast the adapter to one dtype "
                "before converting (the widest keeps every value)",
        meaning="One module's four pool factors are stacked and scaled together, in one dtype. Factors saved in "
                "different dtypes (a float16 gate next to float32 up and down) would be rounded to whichever "
                "dtype came first, silently; the kit refuses and lists them.",
        when="An adapter assembled from two exports, or edited factor by factor.",
        setup=ADAPTER,
        trigger="Adapter.from_state(ad.config, {**ad.weights, key: ad.weights[key].half()})\n",
        fix="Adapter.from_state(ad.config, {k: v.float() for k, v in {**ad.weights, key: ad.weights[key].half()}"
            ".items()})\n",
        remedy="Save every factor in one dtype (PEFT does); convert --dtype then picks the pool's.",
        upstream="sglang 0.5.23 casts each factor into its buffers separately (sglang/srt/lora/mem_pool.py: "
                 "LoRAMemoryPool.load_lora_weight_to_buffer), without a word.",
        generation=KIT, adapter_caused=True, related=("ISL-K230",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K232", title="a FIFO, device, socket or folder where a file was expected", exc_type=ValueError,
        message="{file}: not a regular file but {kind}: the kit reads only regular files (such a name could "
                "block the read forever or change under it): point at the file itself",
        meaning="An adapter's config and weights, a checkpoint's index and shards are regular files. A FIFO "
                "under such a name would block the reader until something writes into it (forever, in a "
                "batch job), a device or a socket is no file at all, and a folder is not the file. The kit "
                "checks what each name is before it opens it, and again on the opened descriptor (opened "
                "without blocking), so that a name swapped meanwhile cannot hang it either.",
        when="A weights file that a download tool left as a named pipe, a symlink to one, or a folder named "
             "adapter_model.safetensors.",
        setup=FOLDER + "import os\nweights = folder / 'adapter_model.safetensors'\nkept = weights.read_bytes()\n"
              "weights.unlink()\nos.mkfifo(weights)  # a named pipe under the weights' name\n",
        trigger="load_adapter(folder)\n",
        fix="weights.unlink()\nweights.write_bytes(kept)\nload_adapter(folder)\n",
        remedy="Replace the name with the regular file (download or copy it again), or point at the folder "
               "that holds the real files.",
        upstream="sglang opens the files without such a check (sglang/srt/model_loader/weight_utils.py: "
                 "safetensors_weights_iterator, safe_open): a FIFO blocks it until a writer appears.",
        generation=KIT, adapter_caused=True, related=("ISL-K203", "ISL-K204"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K234", title="a zero-size shared-sink factor", exc_type=ValueError,
        message="{file}: tensor '{key}' is {shape}, empty: a shared-sink LoRA factor is {expected} with every "
                "size at least 1 (only an absent up_proj may be a zero-size placeholder): export it again",
        meaning="A factor with an axis of size 0 (a gate A [r, 0], a down A [r, 0]) holds nothing, and its "
                "module's other factors cannot be stacked with it: torch's concatenation would fail with words "
                "that name no tensor, or the pool's geometry would have H or F of 0. The kit refuses it by name. "
                "An up_proj of zero size is the one placeholder PEFT-style exports use for an absent up: it "
                "reads as a zero up (ISL-N203).",
        when="A factor sliced to nothing by a script, or an export of a model whose hidden size was read as 0.",
        setup=ADAPTER,
        trigger="Adapter.from_state(ad.config, {**ad.weights, key: ad.weights[key][:, :0]})\n",
        fix="Adapter.from_state(ad.config, ad.weights)\n",
        remedy="Export the factor again with its real sizes (A [r, in], B [out, r]).",
        upstream="sglang 0.5.23 concatenates such a factor with its partner in normalization "
                 "(sglang/srt/lora/lora.py: LoRAAdapter.normalize_gate_up_proj) and fails with torch's "
                 "RuntimeError there.",
        generation=KIT, adapter_caused=True, related=("ISL-K205", "ISL-N203"), releases=EVERY_RELEASE),
]
