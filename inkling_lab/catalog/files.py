"""Adapter files and pool files: PEFT target_parameters exports, pool files (the
``files`` engineer's codes, ``ISL-K401..K449``)."""
from __future__ import annotations

from .entry import CatalogEntry

_PEFT_SETUP = ("import json, tempfile\nfrom pathlib import Path\n"
               "from inkling_lab.adapters import load_adapter\n"
               "from inkling_lab.transformers_interop import make_peft_sink_adapter\n"
               "made = make_peft_sink_adapter(Path(tempfile.mkdtemp()) / 'peft')  # PEFT on transformers' sink\n"
               "config_file = made.folder / 'adapter_config.json'\n"
               "config = json.loads(config_file.read_text())\n")

ENTRIES = [
    CatalogEntry(
        code="ISL-K401", title="a PEFT target_parameters export whose nesting the config does not explain",
        exc_type=ValueError,
        message="{file}: {module}: the file holds a PEFT target_parameters export ({k} nested factor pair(s): "
                "{depths}) but adapter_config.json's target_parameters {targets} name {m} of {module}'s "
                "parameters {parameters}: the nesting cannot be read without them; restore target_parameters "
                "as saved by PEFT",
        meaning="PEFT's target_parameters route wraps each targeted 3D parameter of transformers' "
                "InklingSharedExperts in its own ParamWrapper, nested in the order the module registers them "
                "(gate_proj innermost, then up_proj, then down_proj), so the file names its factors only "
                "'shared_experts[.base_layer...].lora_A.weight': which projection a pair belongs to follows from "
                "how many of the three the config's target_parameters name (peft/tuners/tuners_utils.py, "
                "_inject_parameters). When the list and the nesting disagree, the factors cannot be assigned.",
        when="A config edited by hand or copied from another adapter, or a file whose weights were filtered "
             "after PEFT saved them.",
        setup=_PEFT_SETUP,
        trigger="config_file.write_text(json.dumps({**config, 'target_parameters': ['mlp.shared_experts.up_proj']}))\n"
                "load_adapter(made.folder)\n",
        fix="config_file.write_text(json.dumps(config))  # target_parameters as PEFT saved them\n"
            "load_adapter(made.folder)\n",
        related=("ISL-K402", "ISL-K207"), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K402", title="a PEFT target_parameters factor that does not split into experts of rank r",
        exc_type=ValueError,
        message="{file}: {module} {proj} (PEFT target_parameters): lora_A is {shape_a} and lora_B {shape_b}; a "
                "ParamWrapper over n experts of rank r={r} stores lora_A [n*r, in] and lora_B [out, n*r]: "
                "re-export the adapter, or fix r in adapter_config.json",
        meaning="A ParamWrapper over a 3D parameter of n experts keeps one rank-r pair per expert inside two 2D "
                "matrices: lora_A [n*r, in] (expert e is rows e*r..e*r+r-1) and lora_B [out, n*r] (expert e is "
                "columns e, e+n, e+2n, ...) (peft/tuners/lora/layer.py, ParamWrapper.update_layer and "
                "get_delta_weight). Rows that do not split into whole experts of the config's r, or an A and a "
                "B that disagree, mean the config's r is not the adapter's.",
        when="An r edited in the config, a rank_pattern entry for the sink, or a damaged file.",
        setup=_PEFT_SETUP,
        trigger="config_file.write_text(json.dumps({**config, 'r': 5}))  # the adapter has r=2\n"
                "load_adapter(made.folder)\n",
        fix="config_file.write_text(json.dumps(config))\nload_adapter(made.folder)\n",
        related=("ISL-K401", "ISL-K206"), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K403", title="not an inkling-lab pool file", exc_type=ValueError,
        message="{file}: not an inkling-lab pool file ({why}); make one with `inkling-lab convert`",
        meaning="load_pool reads only files that inkling-lab convert (or ConvertedPool.save) wrote: a "
                "safetensors file whose metadata holds the pool's format, geometry, slots and modules, and "
                "the four buffers of every module it lists. Anything else (an adapter's weights, another "
                "safetensors file, a damaged or truncated pool) is refused with the file named.",
        when="Passing an adapter's adapter_model.safetensors, or a pool file that was cut short or edited.",
        setup="import tempfile\nfrom pathlib import Path\n"
              "from inkling_lab.adapters import save_adapter, synthetic_adapter, load_adapter\n"
              "from inkling_lab.convert import convert, load_pool\n"
              "folder = save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4),\n"
              "                      Path(tempfile.mkdtemp()) / 'my_adapter')\n",
        trigger="load_pool(folder / 'adapter_model.safetensors')  # an adapter, not a pool\n",
        fix="pool_file = convert([load_adapter(folder)], 2).save(folder.parent / 'pool.safetensors')\n"
            "load_pool(pool_file)\n",
        related=("ISL-K213", "ISL-K204"), origin="inkling_lab"),
]
