"""The doctor's entries: the kit's refusals of what a LoRA pool cannot hold or what the
files do not say (``ISL-K301..K349``), and what sglang 0.5.23 serves other than the
adapter's math (``ISL-W101..W149``). Each sglang fact names the upstream file and
function it was read from (``sglang/srt/...`` of the 0.5.23 wheel)."""
from __future__ import annotations

from ._snippets import DOCTOR_ADAPTER, SAVED
from .entry import EVERY_RELEASE, KIT, CatalogEntry, Repair, UpstreamDefectWarning

_SERVES = ("inkling_lab doctor (a warning: sglang 0.5.23 raises nothing here and serves something other than "
           "the adapter's math)")


def _refusal(code: str, title: str, message: str, meaning: str, when: str, trigger: str, fix: str, *,
             remedy: str, upstream: str, setup: str = DOCTOR_ADAPTER, related: tuple[str, ...] = (),
             exc_type: type[BaseException] = ValueError, releases: tuple[str, ...] | None = None,
             repaired: Repair | None = None) -> CatalogEntry:
    return CatalogEntry(code=code, title=title, exc_type=exc_type, message=message, meaning=meaning, when=when,
                        setup=setup, trigger=trigger, fix=fix, remedy=remedy, upstream=upstream, generation=KIT,
                        adapter_caused=True, related=related, releases=releases, repaired=repaired)


def _warning(code: str, title: str, message: str, meaning: str, when: str, trigger: str, fix: str, *,
             remedy: str, upstream: str, related: tuple[str, ...] = (),
             releases: tuple[str, ...] | None = None) -> CatalogEntry:
    def call(folder: str) -> str:  # "saved(...)  # why" -> the doctor on that folder, the comment at the end
        expr, _, note = folder.partition("  # ")
        return f"il.doctor({expr}, 2, 8, 6).warn()" + (f"  # {note}" if note else "") + "\n"

    return CatalogEntry(code=code, title=title, exc_type=UpstreamDefectWarning, kind="warning", message=message,
                        meaning=meaning, when=when, setup=SAVED, trigger=call(trigger), fix=call(fix),
                        remedy=remedy, upstream=upstream, generation=_SERVES, adapter_caused=True, related=related,
                        releases=releases)


ENTRIES: list[CatalogEntry] = [
    _refusal(
        "ISL-K301", "lora_alpha is not a finite number",
        "{file}: {field} is {value}, not a finite number: every scaling would be {value} and every output of the "
        "adapter NaN or infinite; set the lora_alpha the adapter was trained with",
        "JSON lets a config say NaN or Infinity, and 1e400 reads as infinity. sglang 0.5.23 takes lora_alpha as "
        "it stands (lora.py, LoRAAdapter.__init__: scaling = lora_alpha / r) and multiplies every B by it "
        "(mem_pool.py, load_lora_weight_to_buffer): it loads without a word and serves NaN. The kit refuses.",
        "A config written by a script that divided by zero, or edited by hand.",
        "Adapter.from_state({**ad.config, 'lora_alpha': float('nan')}, ad.weights)\n",
        "Adapter.from_state({**ad.config, 'lora_alpha': 8}, ad.weights)\n", related=("ISL-W105", "ISL-K302"),
        remedy='Set lora_alpha to the finite value the adapter was trained with.',
        upstream='sglang/srt/lora/lora.py: LoRAAdapter.__init__ (scaling = lora_alpha / r, unchecked); sglang 0.5.23 loads it and serves NaN', releases=EVERY_RELEASE),
    _refusal(
        "ISL-K302", "NaN or Inf in a factor",
        "{file}: tensor {key} holds {k} NaN/Inf value(s) of {numel}: every output of this adapter would be NaN; "
        "export the factors again from a checkpoint saved before the loss diverged",
        "One non-finite value in a factor makes the whole LoRA delta of every token NaN. sglang 0.5.23 checks "
        "nothing of the values (mem_pool.py, load_lora_weight_to_buffer copies them): it serves NaN for every "
        "request of the adapter. The kit's converter refuses to write such a pool.",
        "A training run whose loss diverged, saved after the fact; a bad cast to float16.",
        "nan = ad.weights[key].clone(); nan[0, 0] = float('nan')\n"
        "Adapter.from_state(ad.config, {**ad.weights, key: nan})\n",
        "Adapter.from_state(ad.config, ad.weights)\n", related=("ISL-W105", "ISL-K301"),
        remedy='Export the factors again from a finite checkpoint.',
        upstream='sglang/srt/lora/mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer copies the values unchecked; sglang 0.5.23 serves NaN', releases=EVERY_RELEASE),
    _refusal(
        "ISL-K303", "a DoRA adapter",
        "{file}: use_dora is set: a DoRA adapter rescales each output feature by a learned magnitude "
        "(lora_magnitude_vector), which a LoRA pool cannot hold; merge it into the base weights (PEFT "
        "merge_and_unload) or train a plain LoRA adapter",
        "DoRA splits each weight into a magnitude and a direction; the pool holds only A and B. sglang 0.5.23 "
        "refuses it too: ValueError(\"Failed to load {name} because LoRA serving currently doesn't support DoRA "
        "adapters\") (lora_manager.py, LoRAManager.validate_new_adapter; at startup wrapped as RuntimeError: "
        "Failed to load LoRA adapter {name}: ...).",
        "An adapter trained with LoraConfig(use_dora=True).",
        "Adapter.from_state({**ad.config, 'use_dora': True}, ad.weights)\n",
        "Adapter.from_state({**ad.config, 'use_dora': False}, ad.weights)  # a plain LoRA adapter\n",
        remedy='Merge the DoRA adapter into the base weights (PEFT merge_and_unload), or train a plain LoRA adapter.',
        upstream='sglang/srt/lora/lora_manager.py: LoRAManager.validate_new_adapter refuses it too (ISL-E025)', releases=EVERY_RELEASE),
    _refusal(
        "ISL-K304", "an adapter with LoRA biases",
        "{file}: lora_bias is set: the adapter adds a trained bias to every lora_B, which a LoRA pool cannot hold; "
        "merge it into the base weights (PEFT merge_and_unload) or train with lora_bias=False",
        "With lora_bias=True PEFT trains a bias on each lora_B. A LoRA pool holds the four factor buffers only; "
        "sglang 0.5.23 reads no lora_bias (lora_config.py, LoRAConfig.__init__ reads r, lora_alpha, "
        "target_modules and use_dora) and has no buffer for one.",
        "An adapter trained with LoraConfig(lora_bias=True).",
        "Adapter.from_state({**ad.config, 'lora_bias': True}, ad.weights)\n",
        "Adapter.from_state({**ad.config, 'lora_bias': False}, ad.weights)\n", related=("ISL-W108",),
        remedy='Merge the adapter into the base weights (PEFT merge_and_unload), or train with lora_bias=False.',
        upstream='sglang/srt/lora/lora_config.py: LoRAConfig.__init__ does not read lora_bias; no pool buffer holds a bias', releases=EVERY_RELEASE),
    _refusal(
        "ISL-K305", "an adapter made for a changed base (PiSSA, OLoRA, CorDA, LoftQ)",
        "{file}: init_lora_weights is {init}: PEFT changed the base weights too when it made this adapter "
        "({method} initialisation), so its factors mean a delta on that residual base, not on the model's own "
        "weights; {way_out}",
        "PiSSA, OLoRA and CorDA initialise A and B from the base weights and subtract their product from the "
        "base; LoftQ pairs the adapter with a quantized base. The saved factors then only mean something on "
        "that residual base, unless PEFT converted them to plain LoRA when saving "
        "(save_pretrained(..., path_initial_model_for_weight_conversion=...), which also sets "
        "init_lora_weights back to true). sglang 0.5.23 loads them as plain LoRA on the model's own weights.",
        "Saving a PiSSA/OLoRA/CorDA/LoftQ adapter without the conversion step.",
        "Adapter.from_state({**ad.config, 'init_lora_weights': 'pissa'}, ad.weights)\n",
        "Adapter.from_state({**ad.config, 'init_lora_weights': True}, ad.weights)  # as PEFT's conversion saves it\n",
        related=("ISL-W107",),
        remedy="Re-save it with PEFT's path_initial_model_for_weight_conversion (PiSSA, OLoRA, CorDA), or serve it on the LoftQ base it was made with.",
        upstream='sglang/srt/lora/lora_config.py: LoRAConfig.__init__ does not read init_lora_weights; sglang 0.5.23 loads the factors as plain LoRA', releases=EVERY_RELEASE),
    _refusal(
        "ISL-K307", "two keys for one factor",
        "{file}: {key} and {other} are two keys for one factor ({factor}): keep one of the two (which one was "
        "trained is not in the file)",
        "w1 and gate_proj (w3/up_proj, w2/down_proj) name the same projection, and expert indices are read as "
        "numbers (.0. and .00. are expert 0). sglang 0.5.23 silently keeps one: the w-name, which "
        "lora.py LoRAAdapter._rename_expert_w_to_proj renames over the other, or for experts the later key "
        "(mem_pool.py, load_lora_weight_to_buffer files them by int(index)). The kit refuses.",
        "Merging two exports into one file; a script that renamed keys and kept the originals.",
        "gate = {k.replace('gate_proj', 'w1'): v for k, v in ad.weights.items() if '.gate_proj.' in k}\n"
        "Adapter.from_state(ad.config, {**ad.weights, **gate})  # w1 and gate_proj\n",
        "Adapter.from_state(ad.config, ad.weights)\n", related=("ISL-W106",),
        remedy='Keep one key per factor: the one that was trained.',
        upstream='sglang/srt/lora/lora.py: LoRAAdapter._rename_expert_w_to_proj (the w-name wins) and sglang/srt/lora/mem_pool.py: load_lora_weight_to_buffer (the later expert key wins): sglang 0.5.23 keeps one silently', releases=EVERY_RELEASE),
    _refusal(
        "ISL-K312", "a fused gate_up_proj and a split gate_proj/up_proj in one module",
        "{file}: {module} holds a fused gate_up_proj ({fused}) and split factors ({split}): upstream's stacking "
        "then gives a result that depends on the keys' order; keep one of the two forms",
        "sglang 0.5.23 stacks gate and up by walking the adapter's keys in order (lora.py, "
        "LoRAAdapter.normalize_gate_up_proj): a fused A is repeated along its rank axis, and a split gate_proj "
        "and up_proj pair is concatenated into the same gate_up_proj name, overwriting it or being overwritten "
        "depending on which comes first. What is served is then an accident of the file's order, not the "
        "adapter's math. normalize_shared_sink reproduces that order exactly; the kit refuses to convert it.",
        "Two exports of one layer merged into one file (one fused, one split); a script that fused the "
        "factors and kept the originals.",
        "fused = {k.replace('.gate_proj.', '.gate_up_proj.'): v for k, v in ad.weights.items() "
        "if '.gate_proj.' in k}\n"
        "Adapter.from_state(ad.config, {**ad.weights, **fused})\n",
        "Adapter.from_state(ad.config, ad.weights)\n", related=("ISL-K307",),
        remedy="Keep one form per module: the fused gate_up_proj or the split gate_proj and up_proj, whichever "
               "was trained.",
        upstream="sglang/srt/lora/lora.py: LoRAAdapter.normalize_gate_up_proj walks the keys in order and "
                 "writes gate_up_proj over whatever the name held", releases=EVERY_RELEASE),
    _refusal(
        "ISL-K309", "a down A with its expert axis folded into the rows",
        "{file}: tensor {key} is {shape} = [n*r, F] with r={r}: the expert axis of down A is folded into its rows "
        "({n} experts of {r} rows); a flat down A is [r, n*F] = {flat}: re-save it as {reshape} (--repair does "
        "it, assuming expert-major rows)",
        "A flat down A holds the experts side by side along its columns, [r, n*F]. Saving the per-expert "
        "[n, r, F] tensor with reshape(n*r, F) folds the experts into the rows instead. This is not a rank "
        "problem: the reshape in the message fixes it, assuming expert e holds rows e*r..(e+1)*r-1. sglang "
        "0.5.23 reshapes it as stored (lora.py, _normalize_shared_expert_moe) and then fails the buffer load "
        "or reshape. --repair (guess=True) applies the reshape and says so.",
        "An export script that flattened [n, r, F] with reshape instead of permute + reshape.",
        "folded = {**ad.weights, key: ad.weights[key].reshape(4, 2, 6).transpose(0, 1).reshape(8, 6)}\n"
        "Adapter.from_state(ad.config, folded)\n",
        "folded = {**ad.weights, key: ad.weights[key].reshape(4, 2, 6).transpose(0, 1).reshape(8, 6)}\n"
        "fixed = Adapter.from_state(ad.config, folded, guess=True)  # --repair\n"
        "assert torch.equal(fixed.weights[key], ad.weights[key])\n", related=("ISL-K206",),
        remedy='Re-save down A with the reshape in the message, or let --repair apply it (it assumes expert-major rows).',
        upstream='sglang/srt/lora/lora.py: LoRAAdapter._normalize_shared_expert_moe reshapes it as saved; the buffer load then fails (ISL-E016)', releases=EVERY_RELEASE,
        repaired=Repair("{key} is {shape} = [n*r, F]: its expert axis is folded into the rows; read as {reshape} -> "
                        "{flat} (assumed: expert e holds rows {r}e..{r}e+{last})",
                        "re-save it as {reshape} to silence this (--repair assumed the row order)",
                        "sglang 0.5.23 reshapes it as stored (the doctor's verdict says what that gives)")),
    _refusal(
        "ISL-K310", "the config's r matches no factor",
        "{file}: tensor {key} has shape {shape}: its rank axis (dim {axis}) is {k}, but adapter_config.json says "
        "{r}; lora_{ab} is {expected}; no factor has rank {r} (their rank axes are {ranks}): fix r in "
        "adapter_config.json (--repair reads it from the factors when they all agree)",
        "Every factor has one rank, and it is not the config's r: the config (or a hand edit) is wrong. "
        "sglang 0.5.23 uses the config's r for its buffer views (mem_pool.py, load_lora_weight_to_buffer) and "
        "fails the load with an AssertionError. --repair (guess=True) assumes r is the factors' rank, keeps "
        "lora_alpha as written, and says so.",
        "A config copied from another adapter; r edited after training.",
        "Adapter.from_state({**ad.config, 'r': 8}, ad.weights)\n",
        "fixed = Adapter.from_state({**ad.config, 'r': 8}, ad.weights, guess=True)  # --repair: assumes r=4\n"
        "assert fixed.r == 4\n", related=("ISL-K206",),
        remedy="Correct r in adapter_config.json to the factors' rank, or let --repair read it from them.",
        upstream="sglang/srt/lora/mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer cuts its views at the config's r and fails (ISL-E016)", releases=EVERY_RELEASE,
        repaired=Repair("{file} says r={r} but every factor has rank {k}: assumed r={k} and lora_alpha={alpha} as "
                        "written (scaling {alpha}/{k}{rslora})",
                        'set "r": {k} in {config} if that is what it was trained with (--repair assumed it)')),
    _refusal(
        "ISL-K311", "PEFT named adapters in subfolders",
        "{file}: no adapter_config.json here, but this folder holds PEFT named adapters in subfolders: {names}; "
        "point at one of them, e.g. {folder}",
        "PEFT's save_pretrained writes the adapter named 'default' into the folder itself and every other "
        "named adapter into a subfolder of its name. sglang 0.5.23 reads adapter_config.json from the folder it "
        "is given (lora_config.py, LoRAConfig.get_lora_config) and fails with FileNotFoundError; give it, and "
        "the kit, the subfolder.",
        "A model with several adapters (add_adapter) saved in one go.",
        "root = il.scratch_folder()\n"
        "save_adapter(ad, root / 'math')\nload_adapter(root)\n",
        "root = il.scratch_folder()\n"
        "save_adapter(ad, root / 'math')\nload_adapter(root / 'math')\n", exc_type=FileNotFoundError,
        remedy='Point sglang and the kit at one of the subfolders.',
        upstream='sglang/srt/lora/lora_config.py: LoRAConfig.get_lora_config opens <folder>/adapter_config.json: FileNotFoundError', releases=EVERY_RELEASE),
    _warning(
        "ISL-W101", "rsLoRA: sglang serves the adapter sqrt(r) times too weak",
        "use_rslora is set: PEFT scales this adapter by lora_alpha/sqrt(r) = {alpha}/sqrt({r}) = {peft}; sglang "
        "{release} ignores use_rslora and scales by lora_alpha/r = {sglang}: the adapter is served sqrt(r) = {f} "
        "times too weak",
        "PEFT's rank-stabilised LoRA scales by lora_alpha/sqrt(r). sglang 0.5.23 computes "
        "scaling = lora_alpha / r (lora.py, LoRAAdapter.__init__) and never reads use_rslora, so every delta "
        "is sqrt(r) times too small. The fix changes nothing in PEFT's math: lora_alpha*sqrt(r) over r is "
        "lora_alpha over sqrt(r). inkling-lab convert writes PEFT's scaling into its pool.",
        "Any adapter trained with LoraConfig(use_rslora=True) and r > 1.",
        "saved(use_rslora=True)", "saved(lora_alpha=16.0, use_rslora=False)  # 8*sqrt(4)", related=("ISL-W102",),
        remedy='For sglang, save the adapter with lora_alpha times sqrt(r) and use_rslora false: the same math.',
        upstream='sglang/srt/lora/lora.py: LoRAAdapter.__init__ (scaling = lora_alpha / r; use_rslora is never read)', releases=EVERY_RELEASE),
    _warning(
        "ISL-W102", "alpha_pattern: sglang serves one lora_alpha for all modules",
        "alpha_pattern gives modules their own lora_alpha; sglang {release} reads one lora_alpha ({alpha}) for every "
        "module and ignores alpha_pattern: {detail}",
        "PEFT gives each module matched by an alpha_pattern key its own alpha (and rank_pattern its own rank). "
        "sglang 0.5.23 reads lora_alpha and r once per adapter (lora_config.py, LoRAConfig.__init__; lora.py, "
        "LoRAAdapter.__init__): those modules are served too weak or too strong, by the ratio in the message. "
        "inkling-lab convert folds each module's own scaling into its pool slot.",
        "An adapter trained with LoraConfig(alpha_pattern={...}).",
        "saved(alpha_pattern={'down_proj': 32})", "saved(alpha_pattern={})", related=("ISL-W101", "ISL-W112"),
        remedy="Fold each module's alpha over lora_alpha into its lora_B and drop alpha_pattern (inkling-lab convert writes that math), or split the adapter by alpha.",
        upstream='sglang/srt/lora/lora_config.py: LoRAConfig.__init__ reads one lora_alpha; sglang/srt/lora/lora.py: LoRAAdapter.__init__ one scaling', releases=EVERY_RELEASE),
    _warning(
        "ISL-W103", "the server never wraps the sink: its factors are loaded and never applied",
        "the server's target modules {targets} do not hold both gate_up_proj and down_proj (missing: {missing}): "
        "sglang {release} does not wrap the shared sink, so the adapter's sink factors are loaded and never "
        "applied: the sink serves the base model",
        "sglang 0.5.23 wraps an InklingBatchDenseMLP only when the server's target modules contain both "
        "gate_up_proj and down_proj (lora_manager.py, LoRAManager.init_lora_modules). The target modules are "
        "--lora-target-modules, or the union of the loaded adapters' target_modules, normalized by "
        "get_normalized_target_modules (utils.py): gate_proj and up_proj become gate_up_proj, but w1, w3 and w2 "
        "stay as they are. An adapter that targets gate/up only, down only, or the w-names leaves the sink "
        "unwrapped: whatever it trained there changes nothing.",
        "target_modules of gate_proj and up_proj only, or w1/w3/w2, and no --lora-target-modules.",
        "saved(target_modules=['gate_proj', 'up_proj'])", "saved(target_modules=['gate_proj', 'up_proj', 'down_proj'])",
        related=("ISL-W002",),
        remedy='Serve with --lora-target-modules naming gate_up_proj and down_proj besides the adapter\'s own target '
               'modules (sglang refuses a flag that leaves one of those out: ISL-E034), or list gate_proj, up_proj and '
               'down_proj in target_modules.',
        upstream='sglang/srt/lora/lora_manager.py: LoRAManager.init_lora_modules (wraps the sink only with gate_up_proj and down_proj); sglang/srt/lora/utils.py: get_normalized_target_modules (w1/w3/w2 not renamed)', releases=EVERY_RELEASE),
    _warning(
        "ISL-W105", "sglang serves NaN",
        "{what}: sglang {release} loads it without a word and every output of a request that uses it is NaN (or "
        "infinite)",
        "sglang 0.5.23 checks neither lora_alpha nor the factors' values (lora.py, LoRAAdapter.__init__; "
        "mem_pool.py, load_lora_weight_to_buffer): a NaN or infinite scaling, or one NaN in a factor, makes "
        "every output of the slot NaN. The kit refuses to convert it (ISL-K301, ISL-K302).",
        "A NaN, Infinity or 1e400 lora_alpha in the config; a diverged checkpoint.",
        "saved(lora_alpha=float('nan'))", "saved(lora_alpha=8.0)", related=("ISL-K301", "ISL-K302"),
        remedy='Re-export the adapter from a finite checkpoint and a finite lora_alpha.',
        upstream='sglang/srt/lora/lora.py: LoRAAdapter.__init__ and sglang/srt/lora/mem_pool.py: load_lora_weight_to_buffer check no values', releases=EVERY_RELEASE),
    _warning(
        "ISL-W106", "two keys for one factor: sglang keeps one silently",
        "{keys} are one factor: sglang {release} serves {kept} and silently drops the other ({how})",
        "See ISL-K307: which of the two factors sglang 0.5.23 serves is decided by its renaming "
        "(lora.py, LoRAAdapter._rename_expert_w_to_proj: the w-name wins) or by key order "
        "(mem_pool.py, load_lora_weight_to_buffer: the later expert key wins), not by the adapter.",
        "Two exports merged into one file.",
        "saved({**ad.weights, **{k.replace('gate_proj', 'w1'): v.clone() for k, v in ad.weights.items() if '.gate_proj.' in k}})",
        "saved()", related=("ISL-K307",),
        remedy='Keep one key per factor: the one that was trained.',
        upstream='sglang/srt/lora/lora.py: LoRAAdapter._rename_expert_w_to_proj; sglang/srt/lora/mem_pool.py: load_lora_weight_to_buffer (experts by int(index))', releases=EVERY_RELEASE),
    _warning(
        "ISL-W107", "PiSSA/OLoRA/CorDA/LoftQ: sglang applies the factors to the wrong base",
        "init_lora_weights is {init}: PEFT changed the base weights when it made this adapter ({method}), so the "
        "factors mean a delta on that residual base; sglang {release} loads them as plain LoRA on the model's own "
        "weights, which is right only for an adapter converted to plain LoRA when it was saved",
        "See ISL-K305. sglang 0.5.23 does not read init_lora_weights (lora_config.py, LoRAConfig.__init__): "
        "it adds the factors to the model's own weights, so an unconverted adapter computes something else.",
        "A PiSSA/OLoRA/CorDA/LoftQ adapter saved without PEFT's conversion.",
        "saved(init_lora_weights='pissa')", "saved(init_lora_weights=True)", related=("ISL-K305",),
        remedy="Re-save it converted to plain LoRA (PEFT's path_initial_model_for_weight_conversion), or serve it on its LoftQ base.",
        upstream='sglang/srt/lora/lora_config.py: LoRAConfig.__init__ does not read init_lora_weights', releases=EVERY_RELEASE),
    _warning(
        "ISL-W108", "lora_bias: sglang serves no LoRA bias",
        "lora_bias is set: PEFT adds a trained bias to each lora_B; sglang {release} has no LoRA bias (LoRAConfig "
        "does not read lora_bias and no buffer holds one), so the adapter's biases are not served",
        "See ISL-K304 (lora_config.py, LoRAConfig.__init__ reads r, lora_alpha, target_modules and use_dora "
        "only; mem_pool.py has A and B buffers only).",
        "An adapter trained with lora_bias=True.", "saved(lora_bias=True)", "saved(lora_bias=False)",
        related=("ISL-K304",),
        remedy='Merge the adapter into the base weights, or train with lora_bias=False.',
        upstream='sglang/srt/lora/lora_config.py: LoRAConfig.__init__ does not read lora_bias; sglang/srt/lora/mem_pool.py has A and B buffers only', releases=EVERY_RELEASE),
    _warning(
        "ISL-W109", "modules_to_save: sglang does not serve PEFT's saved modules",
        "modules_to_save {modules}: PEFT saved full trained copies of these modules; sglang {release}'s LoRAConfig "
        "does not read modules_to_save, so they are not served as replacements (the base modules are)",
        "PEFT's modules_to_save trains whole copies of the named modules (a classifier head, embeddings) and "
        "saves them with the adapter. sglang 0.5.23 has no such replacement (lora_config.py, "
        "LoRAConfig.__init__): the base modules serve. The sink's own factors are unaffected.",
        "A sequence-classification adapter (PEFT adds the score head), or modules_to_save=['lm_head'].",
        "saved(modules_to_save=['lm_head'])", "saved(modules_to_save=None)",
        remedy='Merge the adapter into the base model to serve the saved modules, or train without modules_to_save.',
        upstream='sglang/srt/lora/lora_config.py: LoRAConfig.__init__ does not read modules_to_save', releases=EVERY_RELEASE),
    _warning(
        "ISL-W111", "fan_in_fan_out changes nothing for the sink",
        "fan_in_fan_out is set: PEFT uses it only to merge deltas into Conv1D-style [in, out] weights (for "
        "torch.nn.Linear it turns it off with a warning); the factors keep their [r, in] / [out, r] shapes and "
        "read as usual, and sglang {release} does not read the field",
        "PEFT transposes the merged delta for Conv1D-style layers only; on a torch.nn.Linear target it warns "
        "and switches the field off (peft/tuners/lora/layer.py, where it dispatches the layer type). The shared "
        "sink's projections are linear layers; lora_A and lora_B are saved as usual. This note only says that the "
        "field was read and changes nothing.",
        "A config copied from a GPT-2 adapter.", "saved(fan_in_fan_out=True)", "saved(fan_in_fan_out=False)",
        remedy='None needed for the sink.',
        upstream='sglang/srt/lora/lora_config.py: LoRAConfig.__init__ does not read fan_in_fan_out', releases=EVERY_RELEASE),
    _warning(
        "ISL-W112", "rank_pattern: sglang reads one r for every module",
        "rank_pattern gives modules their own rank ({modules}); sglang {release} reads one r={r} for every module "
        "and ignores rank_pattern",
        "PEFT gives each module matched by a rank_pattern key its own rank. sglang 0.5.23 cuts every buffer "
        "view at the config's r (mem_pool.py, load_lora_weight_to_buffer): a module of another rank fails the "
        "load (AssertionError: LoRA buffer shape ... does not match weight shape ...), or, for a per-expert "
        "gate-up A, is read in the wrong rows. The fix keeps every module's math: zero-pad each module to one "
        "rank R and fold its own scaling over lora_alpha/R into its lora_B; never change r alone.",
        "An adapter trained with LoraConfig(rank_pattern={...}).",
        "saved(r=2, rank_pattern={'gate_proj': 4, 'up_proj': 4, 'down_proj': 4})", "saved(r=4, rank_pattern={})",
        related=("ISL-W102",),
        remedy='Zero-pad every module to one rank R, fold its own scaling over lora_alpha/R into its lora_B and save r=R without rank_pattern (inkling-lab convert writes that math); never change r alone.',
        upstream="sglang/srt/lora/mem_pool.py: LoRAMemoryPool.load_lora_weight_to_buffer cuts every view at the config's r (ISL-E016)", releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-W113", title="the model's activation is not SiLU: sglang's sink computes SiLU",
        exc_type=UpstreamDefectWarning, kind="warning",
        message="the model computes {activation}(gate) * up in its shared experts (config.hidden_act); sglang "
                "{release}'s shared sink computes silu(gate) * up whatever the model's hidden_act: every token's "
                "sink output differs from the model's, with the adapter or without it",
        meaning="transformers' InklingSharedExperts computes act_fn(gate) * up with act_fn = "
                "ACT2FN[config.hidden_act] (transformers' own Inkling tests use gelu). sglang's InklingBatchDenseMLP "
                "reads no activation: its _swiglu calls silu_and_mul (or its Triton kernel) always, and the LoRA "
                "wrappers add their deltas around that same SwiGLU. For such a model no adapter, and no re-export, "
                "makes sglang compute what the model computes. The kit computes the model's activation in its "
                "base forward and refuses a LoRA forward on it (ISL-K155).",
        when="A model trained or configured with hidden_act other than silu, served by sglang 0.5.23.",
        setup=SAVED, trigger="il.doctor(saved(), 2, 8, 6, hidden_act='gelu').warn()\n",
        fix="il.doctor(saved(), 2, 8, 6, hidden_act='silu').warn()  # the activation sglang computes\n",
        remedy="Serve the model where its activation is computed (transformers, or an engine that reads "
               "hidden_act); sglang 0.5.23's shared sink serves SiLU models only.",
        upstream="sglang/srt/models/inkling_common/dense_mlp.py: InklingBatchDenseMLP._swiglu (silu_and_mul, "
                 "silu_and_mul_triton), the same for its LoRA subclasses in inkling_common/lora.py",
        generation=_SERVES, adapter_caused=False, related=("ISL-K155", "ISL-K154"), releases=EVERY_RELEASE),
]
