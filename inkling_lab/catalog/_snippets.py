"""Setup lines the entries' snippets share (``torch`` and ``il`` are imported)."""

SINK = "sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6)\n"
POOL = "pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4)\n"
FACTORS = "factors = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=4, seed=0)\n"
BUFFERS = "ga, gb, da, db = pool.buffers()\n"
V2_SINK = ("sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6, interleaved=False)\n"
           "sink.initialize_lora(il.LoRABackend('triton', 3), generation='v2')\n")
ADAPTER = ("from inkling_lab.adapters import Adapter, synthetic_adapter\n"
           "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)  # flat factors, PEFT names\n"
           "key = 'base_model.model.model.layers.0.mlp.shared_experts.down_proj.lora_A.weight'\n")
FOLDER = ("from inkling_lab.adapters import load_adapter, save_adapter, synthetic_adapter\n"
          "folder = il.scratch_folder() / 'my_adapter'\n"
          "save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4), folder)\n")
DOCTOR_ADAPTER = ("from inkling_lab.adapters import Adapter, load_adapter, save_adapter, synthetic_adapter\n"
                  "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)"
                  "  # r=4, lora_alpha=8, flat PEFT factors\n"
                  "key = 'base_model.model.model.layers.0.mlp.shared_experts.down_proj.lora_A.weight'\n")
# The doctor's setup: ``saved(weights, **config)`` writes ``ad`` (changed) as a PEFT folder.
SAVED = (DOCTOR_ADAPTER +
         "def saved(weights=None, **config):  # the adapter as a PEFT folder, config fields changed\n"
         "    config = {**ad.config, **config}\n"
         "    a = Adapter(ad.name, config['r'], config['lora_alpha'], config['target_modules'], weights or ad.weights,"
         " config)\n"
         "    return save_adapter(a, il.scratch_folder() / 'adapter')\n")
