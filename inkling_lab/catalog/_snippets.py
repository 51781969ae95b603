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
FOLDER = ("import tempfile\nfrom pathlib import Path\n"
          "from inkling_lab.adapters import load_adapter, save_adapter, synthetic_adapter\n"
          "folder = Path(tempfile.mkdtemp()) / 'my_adapter'\n"
          "save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4), folder)\n")
