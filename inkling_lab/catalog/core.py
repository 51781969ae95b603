"""The kit's own refusals at the forward's and the batch's inputs (codes ISL-K150..K179)."""
from __future__ import annotations

from ._snippets import FOLDER, SINK
from .entry import EVERY_RELEASE, KIT, CatalogEntry

_UPSTREAM_FORWARD = ("sglang/srt/models/inkling_common/lora.py: InklingBatchDenseMLPWithLoRA._forward_bf16_linearized "
                     "runs torch.mm(x_td, w13_lin.T) on what it is given")

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-K150", title="the tokens are of another dtype than the sink", exc_type=TypeError,
        message="x is {got} but the sink's weights are {want}: pass x.to({want}) (or build the sink with dtype={got})",
        meaning="The sink computes in its weights' dtype: the up GEMM multiplies x by w13 as they are. "
                "Tokens of another dtype would fail inside torch's matmul with words that name neither x "
                "nor the sink; the kit refuses them first. (gammas may be of any floating dtype: they are "
                "read in float32.)",
        when="float32 tokens from torch.randn next to a bfloat16 sink; a sink built in float64 for the "
             "reference next to the model's bf16 activations.",
        setup=SINK + "x, gammas = torch.randn(5, 8, dtype=torch.float64), torch.rand(5, 2)\n",
        trigger="sink(x, gammas)  # the sink is float32\n",
        fix="sink(x.to(sink.dtype), gammas)\n",
        remedy="Cast the tokens to the sink's dtype (x.to(sink.dtype)), or build the sink in the tokens' dtype.",
        upstream=_UPSTREAM_FORWARD + ", where another dtype is torch's own RuntimeError (mat1 and mat2 dtypes); "
                 "sglang's engine always hands it the model's dtype.",
        generation=KIT, related=("ISL-K151",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K151", title="an input lives on another device than the sink", exc_type=ValueError,
        message="{what} is on {got} but the sink's weights are on {want}: pass {what}.to('{want}')",
        meaning="Every tensor of one forward must be on the sink's device; the kit names the one that is not "
                "instead of torch's device-mismatch error from inside a matmul or a kernel.",
        when="A sink moved to CUDA with tokens still on the CPU, or the other way round.",
        setup=SINK + "x, gammas = torch.randn(5, 8, device='meta'), torch.rand(5, 2)\n",
        trigger="sink(x, gammas)  # the sink is on the CPU\n",
        fix="sink(torch.randn(5, 8), gammas)\n",
        remedy="Move the input to the sink's device (x.to(sink.device)), or the sink to the input's.",
        upstream=_UPSTREAM_FORWARD + ", where another device is torch's own RuntimeError; sglang's engine "
                 "keeps every tensor on the rank's GPU.",
        generation=KIT, related=("ISL-K150",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K152", title="a batch's slot ids are not whole numbers", exc_type=TypeError,
        message="SlotBatch: {what} must hold integers, but {what}[{index}] is {value} ({kind}): pass whole numbers",
        meaning="A slot id, a segment length and a rank are whole numbers. Turned into integers they would be "
                "truncated (0.7 -> slot 0), booleans would become slots 0 and 1: the kit refuses them instead.",
        when="Slot ids computed with a division, read from JSON as floats, or a mask passed where ids were meant.",
        setup="",
        trigger="il.SlotBatch.from_token_slots([0.7, 1.2, 2.9], num_slots=3)\n",
        fix="il.SlotBatch.from_token_slots([0, 1, 2], num_slots=3)\n",
        remedy="Pass integer slot ids (-1 for base model only): round them yourself where a fraction is expected.",
        upstream="sglang builds its LoRABatchInfo from the scheduler's integer buffer ids "
                 "(sglang/srt/lora/lora_manager.py: LoRAManager.prepare_lora_batch), so it never sees a float id.",
        generation=KIT, related=("ISL-K103",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K153", title="the pool's intermediate size is not the sink's", exc_type=ValueError,
        message="the LoRA pool does not fit the sink's F = {F}: {problems}; sglang 0.5.23's set_lora_info "
                "accepted it, but gate-up B's rows cannot be split into the gate and up halves of the sink's "
                "features: build the pool for this sink, gate_up_b [S, n, 2F, R] = {want_gate_up_b} and down_a "
                "[S, n, R, F] = {want_down_a}",
        meaning="The LoRA delta of each expert adds to the sink's own 2F gate-up rows and reads its F "
                "activation features, so gate-up B must hold 2F rows and down A F columns, F being the sink's. "
                "Neither generation of upstream's set_lora_info compares the pool to the module: the second "
                "one accepts an odd 2F in the shared outer layout (then the kit builds no w1_delta) and both "
                "accept a pool of another F in the per-expert layout. The kit's forward refuses such a pool "
                "before any backend reads it, instead of a shape error (or a None) inside a matmul.",
        when="Pool buffers allocated for another model or another tensor-parallel size (the full F next to "
             "a sharded sink, or F/tp next to the full one); a gate-up B with an extra row.",
        setup="sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6, "
              "interleaved=False, dtype=torch.bfloat16)\n"
              "sink.initialize_lora(il.LoRABackend('triton_v2', 3), generation='v2')\n"
              "pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4, dtype=torch.bfloat16)\n"
              "ga, gb, da, db = pool.buffers()\n"
              "x, gammas = torch.randn(3, 8, dtype=torch.bfloat16), torch.rand(3, 2)\n"
              "batch = il.SlotBatch.from_token_slots([0, 1, 2], num_slots=3)\n",
        trigger="sink.set_lora_info(ga, torch.cat([gb, gb[:, :, :1]], dim=2), da, db)  # 2F = 13: accepted\n"
                "sink(x, gammas, batch=batch)\n",
        fix="sink.set_lora_info(ga, gb, da, db)\nsink(x, gammas, batch=batch)\n",
        remedy="Allocate the pool for the sink it serves: gate-up B [S, n, 2F, R] and down A [S, n, R, F] "
               "with the sink's (per-rank) F, e.g. il.LoRAPool(n, hidden, F, slots, max_rank).",
        upstream="sglang/srt/models/inkling_common/lora.py: InklingBatchDenseMLPWithLoRAV2.set_lora_info "
                 "takes 2F from gate-up B and F as 2F // 2 without comparing either to the module's "
                 "intermediate size (nor does InklingBatchDenseMLPWithLoRA.set_lora_info); its dense engine "
                 "then cuts gate-up B at multiples of 2F // 2.",
        generation=KIT, related=("ISL-K102",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K154", title="an activation the kit does not compute", exc_type=ValueError,
        message="activation '{name}' is not one the kit computes; it computes {known} (transformers' ACT2FN "
                "names): build the sink with one of them, or check the model's config.hidden_act",
        meaning="transformers' InklingSharedExperts computes act_fn(gate) * up with act_fn = "
                "ACT2FN[config.hidden_act]; the kit computes the same for the names it knows (each checked "
                "against transformers' own ACT2FN in its tests). A name it does not know is refused, never "
                "replaced by SiLU: the sink would compute another function than the model's.",
        when="A model config whose hidden_act is a rare ACT2FN name (or a typo) read by sink_from_checkpoint "
             "or passed as activation=.",
        setup="",
        trigger="il.SharedSink(2, 8, 6, activation='gelu_fancy')\n",
        fix="il.SharedSink(2, 8, 6, activation='gelu')\n",
        remedy="Pass one of the kit's activations (inkling_lab.sink.ACTIVATIONS: transformers' ACT2FN names).",
        upstream="sglang/srt/models/inkling_common/dense_mlp.py: InklingBatchDenseMLP._swiglu computes "
                 "silu_and_mul whatever the model's hidden_act: sglang reads no activation at all.",
        generation=KIT, related=("ISL-K155",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K155", title="a LoRA forward on a sink whose activation is not SiLU", exc_type=ValueError,
        message="this sink computes {activation}(gate) * up, but the LoRA forward is sglang 0.5.23's, which "
                "computes silu(gate) * up (dense_mlp.py, InklingBatchDenseMLP._swiglu) whatever the model's "
                "hidden_act: the kit refuses rather than compute SiLU for a {activation} model; its base "
                "forward (no batch) computes the model's own output",
        meaning="sglang's shared sink is SwiGLU only: a model trained with another hidden_act (transformers' "
                "own Inkling tests use gelu) is served with SiLU, base and LoRA alike. The kit's LoRA forward "
                "models sglang's, so on such a sink it would compute neither the model nor the adapter: it "
                "refuses. The base forward and PEFT's math (inkling_lab.peft_reference) stay the model's.",
        when="sink_from_transformers or sink_from_checkpoint of a model whose config.hidden_act is not silu, "
             "then a forward with a batch.",
        setup="sink = il.SharedSinkLoRA(2, 8, 6, activation='gelu')\n"
              "pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=1, max_rank=4)\n"
              "sink.set_lora_info(*pool.buffers())\n"
              "x, gammas = torch.randn(3, 8), torch.rand(3, 2)\n"
              "batch = il.SlotBatch.from_token_slots([0, 0, 0], num_slots=1)\n",
        trigger="sink(x, gammas, batch=batch)\n",
        fix="sink(x, gammas)  # the model's own base output; sglang would compute SiLU for this model\n",
        remedy="Serve such a model only where its activation is computed (not sglang 0.5.23's shared sink); "
               "the kit's base forward and peft_reference give the model's and the adapter's math.",
        upstream="sglang/srt/models/inkling_common/dense_mlp.py: InklingBatchDenseMLP._swiglu (silu_and_mul, "
                 "silu_and_mul_triton) and its LoRA subclasses in sglang/srt/models/inkling_common/lora.py.",
        generation=KIT, related=("ISL-K154",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K161", title="the pool's dtype is not the sink's", exc_type=TypeError,
        message="the LoRA pool's buffers are {pool} but the sink's weights are {sink}: build the pool in the "
                "sink's dtype (LoRAPool(..., dtype=sink.dtype), convert --dtype)",
        meaning="The forward adds the LoRA delta to the sink's own GEMMs, in the sink's dtype: the pool's "
                "four buffers must have it too. torch would fail inside a matmul with words that name neither "
                "(expected m1 and m2 to have the same dtype), a kernel would read the bytes as another type; "
                "the kit refuses the forward first and names both dtypes.",
        when="A float32 pool from LoRAPool's default next to a bfloat16 sink, or a pool file converted with "
             "another --dtype than the model serves in.",
        setup=SINK + "pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4, dtype=torch.bfloat16)\n"
              "sink.set_lora_info(*pool.buffers())\n"
              "batch = il.SlotBatch.from_token_slots([0, 1], num_slots=3)\n",
        trigger="sink(torch.randn(2, 8), torch.rand(2, 2), batch=batch)  # a float32 sink\n",
        fix=SINK + "sink.set_lora_info(*il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4).buffers())\n"
            "sink(torch.randn(2, 8), torch.rand(2, 2), batch=batch)  # a fresh sink: its derived operands keep "
            "the first pool's dtype, as upstream's do\n",
        remedy="Build (or convert) the pool in the dtype the sink serves in; sglang's pool takes the base "
               "model's dtype.",
        upstream="sglang allocates its LoRA buffers in the base model's dtype (sglang/srt/lora/mem_pool.py: "
                 "LoRAMemoryPool.init_buffers), so they always match; the kit's pools are built by hand.",
        generation=KIT, related=("ISL-K150", "ISL-K153"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K162", title="a size past any model (a typo)", exc_type=ValueError,
        message="{what} must be in {low}..{limit} (the kit's bound on one axis, 2**31 - 1), got {value}{about}",
        meaning="Every size the kit takes (n, H, F, the ranks, the slots, the tokens) is one axis of a tensor it "
                "would allocate. A size past 2**31 - 1 (what an int32 index holds) belongs to no model: it is a "
                "typo, and allocating it would fail with torch's allocator text, or take the machine's memory. "
                "The kit refuses it at once and, where an adapter is at hand, says that adapter's own sizes.",
        when="--hidden 1000000000000 for a model of hidden size 1024, a count pasted twice, a seed given where a "
             "size was meant.",
        setup="",
        trigger="il.Geometry(n=2, hidden=10 ** 12, intermediate=6)\n",
        fix="il.Geometry(n=2, hidden=8, intermediate=6)\n",
        remedy="Give the model's sizes from its config.json (hidden_size, the shared experts' intermediate size); "
               "inkling-lab doctor says the adapter's own.",
        upstream="sglang takes its sizes from the model's config (sglang/srt/lora/mem_pool.py: "
                 "LoRAMemoryPool.init_buffers), never from a command line; the kit's arguments are typed by hand.",
        generation=KIT, related=("ISL-E016",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K163", title="compare's random sink would not fit in memory", exc_type=ValueError,
        message="compare: a random sink of n={n}, H={hidden}, F={intermediate} with {tokens} tokens needs a "
                "float64 tensor of {gib} GiB, past what compare allocates; the adapters: {adapters}: pass the "
                "model's --hidden and --intermediate",
        meaning="compare draws a seeded random sink (gate, up and down [n, F, H] in float64) and a batch [T, H] "
                "to compare the three deltas on. Sizes that would make one of them larger than 2 GiB are a typo "
                "(the real Inkling sink needs a seventh of it), and allocating them would fail or take the "
                "machine's memory: compare refuses first and says the adapters' own sizes.",
        when="--hidden 1000000000000, or --tokens 10000000000, given to inkling-lab compare.",
        setup=FOLDER.replace("from inkling_lab.adapters", "from inkling_lab.compare import compare\nfrom inkling_lab.adapters"),
        trigger="compare([folder], 2, hidden=10 ** 9, intermediate=6)\n",
        fix="compare([folder], 2, hidden=8, intermediate=6)\n",
        remedy="Give compare the model's sizes (config.json: hidden_size, the shared experts' intermediate size) "
               "and a few tokens (the default 8 is enough to see a difference).",
        upstream="Nothing upstream: compare is the kit's own check; sglang serves the sizes of the model it "
                 "loaded (sglang/srt/lora/mem_pool.py: LoRAMemoryPool.init_buffers).",
        generation=KIT, related=("ISL-K162",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K164", title="a tensor past the kit's bound (sizes that multiply past any model)",
        exc_type=ValueError,
        message="{what} {shape} would hold {count} values ({gib} GiB in float32), past the kit's bound of "
                "2**31 - 1 values in one tensor{about}: check the sizes (a mistyped one?), the max rank above all",
        meaning="Each size may be within bounds (ISL-K162) and their product still past any model: a pool of max "
                "rank 2**30 at H 8 is a gate-up A of 2**34 values, 64 GiB. The kit computes every tensor's size "
                "from the sizes alone and refuses such a one before anything is allocated (torch would fail with "
                "its allocator's words, or take the machine's memory first). The bound is what an int32 index "
                "holds; the real Inkling sink's largest buffer at rank 64 holds a thousandth of it.",
        when="--max-rank 1073741824 given to inkling-lab doctor or convert, LoRAPool(..., slots=2**31 - 1), a "
             "Geometry whose H and F are both in the millions.",
        setup="",
        trigger="il.LoRAPool(n=2, hidden=8, intermediate=6, slots=1, max_rank=2 ** 30)\n",
        fix="il.LoRAPool(n=2, hidden=8, intermediate=6, slots=1, max_rank=8)\n",
        remedy="Give the pool the max rank the server runs with (sglang's --max-lora-rank, at least the "
               "adapters' largest r) and the model's sizes (config.json); inkling-lab doctor says the adapter's own.",
        doctor_fix="give --max-rank the server's --max-lora-rank (at least the adapter's r, which the message "
                   "names) and --hidden/--intermediate the model's",
        upstream="sglang allocates its LoRA pool at startup from --max-lora-rank, --max-loras-per-batch and the "
                 "model's config, torch.zeros per layer in the model's dtype on its GPU "
                 "(sglang/srt/lora/mem_pool.py: LoRAMemoryPool.init_buffers); it bounds none of them, so a pool "
                 "past the GPU's memory fails there with torch's out-of-memory error.",
        generation=KIT, related=("ISL-K162", "ISL-K163"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K165", title="the derived operands kept the first pool's dtype", exc_type=TypeError,
        message="the sink's derived operands are {operands}, built from its first pool, but the pool and the "
                "sink are now {pool}: set_lora_info keeps the operands it built first (as upstream's does); call "
                "sink.clear_pool() before set_lora_info with a pool of another dtype (or use a fresh sink)",
        meaning="In the shared-outer layout the first set_lora_info allocates the derived operands w1_delta and "
                "a_cat from the first pool's tensors, in their dtype, and keeps them (their storage must stay at "
                "one address for CUDA graphs); a later call only checks their shapes and copies the new pool "
                "into them. A second pool of another dtype is thus copied into operands of the first one's: the "
                "forward would fail inside a matmul with torch's words (expected both to have the same dtype). "
                "The kit refuses the forward first and names the operands.",
        when="A float32 pool set on a bfloat16 sink (refused, ISL-K161), then the bfloat16 pool the sink needs "
             "set on the same sink.",
        setup="sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6, "
              "dtype=torch.bfloat16)\n"
              "sink.set_lora_info(*il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4).buffers())\n"
              "sink.set_lora_info(*il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4, "
              "dtype=torch.bfloat16).buffers())\n"
              "batch = il.SlotBatch.from_token_slots([0, 1], num_slots=3)\n"
              "x, gammas = torch.randn(2, 8, dtype=torch.bfloat16), torch.rand(2, 2)\n",
        trigger="sink(x, gammas, batch=batch)\n",
        fix="sink.clear_pool()\n"
            "sink.set_lora_info(*il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4, "
            "dtype=torch.bfloat16).buffers())\n"
            "sink(x, gammas, batch=batch)\n",
        remedy="Call sink.clear_pool() (or initialize_lora) before handing a pool of another dtype, or build the "
               "sink afresh.",
        upstream="sglang/srt/models/inkling_common/lora.py: InklingBatchDenseMLPWithLoRA.set_lora_info allocates "
                 "_w1_delta and _a_cat with new_empty from the first pool's gate-up B and down A and keeps them; "
                 "sglang's pool always has the model's dtype (sglang/srt/lora/mem_pool.py: "
                 "LoRAMemoryPool.init_buffers), so it never meets this.",
        generation=KIT, related=("ISL-K161",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K166", title="merged weights asked for a slot the pool cannot merge", exc_type=ValueError,
        message="keep_merged: {problem}; nothing was kept or changed",
        meaning="keep_merged folds a slot's adapter into its own copy of the base weights: each expert's gate "
                "and up rows of w13_lin plus scaling * gate_up_b @ gate_up_a, its rows of w2_lin plus scaling * "
                "down_a^T @ down_b^T, read from the pool's own factors (either outer layout). That needs a pool, "
                "one of the sink's F and dtype (the forward refuses others too: ISL-K153, ISL-K161), a slot of "
                "it, and the finite scaling the batch will carry for it: a NaN or infinite scaling would make "
                "every weight of the copy NaN or infinite. The kit refuses each before it allocates anything.",
        when="keep_merged called before set_lora_info, with a slot id past the pool, or a scaling read as None "
             "or NaN.",
        setup="sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6)\n"
              "sink.set_lora_info(*il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4).buffers())\n",
        trigger="sink.keep_merged({3: 2.0})  # the pool has slots 0..2\n",
        fix="sink.keep_merged({2: 2.0})\n",
        remedy="Keep merges of the pool's slots after set_lora_info, each at the finite scaling its batches "
               "carry (1.0 for a pool that folded alpha / r into its B factors, as the kit's LoRAPool does).",
        upstream="sglang 0.5.23 keeps no merged weights: its shared-sink layers run the LoRA factors at every "
                 "forward (sglang/srt/models/inkling_common/lora.py: "
                 "InklingBatchDenseMLPWithLoRA._forward_bf16_linearized -> "
                 "sglang/srt/lora/trtllm_lora_temp/inkling_dense.py: forward_with_lora; "
                 "InklingBatchDenseMLPWithLoRAV2._forward_bf16_linearized -> _lora_gemm); "
                 "the kit's copies follow the pool through the call upstream makes after it writes a slot "
                 "(sglang/srt/lora/lora_manager.py: LoRAManager.fetch_new_loras -> _notify_lora_slots_updated).",
        generation=KIT, related=("ISL-K165",), releases=EVERY_RELEASE),
]
