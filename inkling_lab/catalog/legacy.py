"""The catalog entries of the first round, to be split by origin into the group modules."""
from __future__ import annotations

from .entry import CatalogEntry, UpstreamDefectWarning

_SINK = "sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6)\n"
_POOL = "pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4)\n"
_FACTORS = "factors = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=4, seed=0)\n"

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-E001", title="a pool buffer is not 4D", exc_type=ValueError,
        message="Inkling shared-sink LoRA requires four 4D MoE buffers",
        pattern=r"Inkling shared-sink LoRA requires four 4D MoE buffers",
        meaning="set_lora_info takes exactly four buffers, each with four axes: gate-up A "
                "[S, O, 2R, H], gate-up B [S, n, 2F, R], down A [S, n, R, F], down B [S, O, H, R]. "
                "At least one has fewer or more axes: usually the slot axis or the expert axis is missing.",
        when="Handing one adapter's factors (3D, no slot axis) or PEFT's flat 2D matrices straight to "
             "set_lora_info, or a dense (non-MoE) LoRA buffer.",
        setup=_SINK + _POOL,
        trigger="ga, gb, da, db = pool.buffers()\nsink.set_lora_info(ga[0], gb, da, db)  # ga[0] has lost the slot axis\n",
        fix="ga, gb, da, db = pool.buffers()\nsink.set_lora_info(ga, gb, da, db)      # all four keep [S, ...]\n",
        related=("ISL-E004", "ISL-E006")),
    CatalogEntry(
        code="ISL-E002", title="an outer factor's expert dimension is neither 1 nor n", exc_type=ValueError,
        message="Inkling shared-sink LoRA outer factors must have expert dimension 1 or {n}",
        pattern=r"Inkling shared-sink LoRA outer factors must have expert dimension 1 or \d+",
        meaning="The outer factors (gate-up A and down B) are shared by all experts (dim 1 = 1) or "
                "given per expert (dim 1 = n). Any other count cannot be mapped onto the sink's experts.",
        when="An adapter exported for a model with another number of shared experts, or routed-expert "
             "factors (many experts) sent to the shared sink.",
        setup=_SINK,
        trigger="pool = il.LoRAPool(n=3, hidden=8, intermediate=6, slots=2, max_rank=4, outer=3)\n"
                "sink.set_lora_info(*pool.buffers())  # built for 3 experts; the sink has 2\n",
        fix="pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=2, max_rank=4, outer=2)\n"
            "sink.set_lora_info(*pool.buffers())\n",
        related=("ISL-E003", "ISL-E004")),
    CatalogEntry(
        code="ISL-E003", title="gate-up A and down B use different outer layouts", exc_type=ValueError,
        message="Inkling shared-sink gate-up A and down B must use the same expert layout",
        pattern=r"Inkling shared-sink gate-up A and down B must use the same expert layout",
        meaning="One outer factor is shared (dim 1 = 1) and the other per expert (dim 1 = n). The pool "
                "has one layout for both.",
        when="Mixing buffers from a shared-outer and a per-expert-outer export, or expanding only one "
             "factor by hand.",
        setup=_SINK + "pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=2, max_rank=4, outer=1)\n"
              "ga, gb, da, db = pool.buffers()\n",
        trigger="sink.set_lora_info(ga.expand(-1, 2, -1, -1), gb, da, db)  # only A made per expert\n",
        fix="sink.set_lora_info(ga.expand(-1, 2, -1, -1), gb, da, db.expand(-1, 2, -1, -1))  # both, exactly\n",
        related=("ISL-E002",)),
    CatalogEntry(
        code="ISL-E004", title="an inner factor's expert count is not n", exc_type=ValueError,
        message="Inkling shared-sink LoRA expert count does not match",
        pattern=r"Inkling shared-sink LoRA expert count does not match",
        meaning="Gate-up B and down A are always per expert: their dim 1 must equal the sink's "
                "n_shared_experts.",
        when="Flat PEFT factors given an expert axis of 1 instead of being split per expert, or an "
             "adapter for a model with another number of shared experts.",
        setup=_SINK + "pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=2, max_rank=4)\n"
              "ga, gb, da, db = pool.buffers()\n",
        trigger="flat_b = gb.reshape(2, 1, 24, 4)   # experts stacked along rows, expert axis 1\n"
                "sink.set_lora_info(ga, flat_b, da, db)\n",
        fix="flat_b = gb.reshape(2, 1, 24, 4)\n"
            "sink.set_lora_info(ga, flat_b.reshape(2, 2, 12, 4), da, db)  # split the stacked experts\n",
        related=("ISL-E001", "ISL-E002")),
    CatalogEntry(
        code="ISL-E005", title="rank dimensions disagree", exc_type=ValueError,
        message="Inkling shared-sink LoRA rank dimensions do not match",
        pattern=r"Inkling shared-sink LoRA rank dimensions do not match",
        meaning="R is read from gate-up B's last axis. Gate-up A must then have 2R rows (gate A, then up "
                "A), down A R rows and down B R columns.",
        when="Gate-up A holding one half only (R rows instead of 2R), a transposed factor, or buffers "
             "padded to different max ranks.",
        setup=_SINK + _POOL + "ga, gb, da, db = pool.buffers()\n",
        trigger="sink.set_lora_info(ga[:, :, :4], gb, da, db)  # gate A only: R rows, not 2R\n",
        fix="sink.set_lora_info(ga, gb, da, db)               # gate A at rows 0..R-1, up A at R..2R-1\n",
        related=("ISL-E016", "ISL-E006")),
    CatalogEntry(
        code="ISL-E006", title="pool buffers do not agree (V2 wrapper)", exc_type=ValueError,
        message="Inkling shared-sink LoRA pool buffers do not agree: expected gate-up A [slots, 1 or {n}, 2R, H], "
                "gate-up B [slots, {n}, 2F, R], down A [slots, {n}, R, F], down B [slots, 1 or {n}, H, R] with one layout",
        pattern=r"Inkling shared-sink LoRA pool buffers do not agree",
        meaning="The newer dense-engine wrapper (InklingBatchDenseMLPWithLoRAV2) folds the outer-dim, "
                "layout, expert-count and rank checks (ISL-E002..E005) into this one message. Run "
                "il.diagnose_pool on the same buffers to see which of the four it is.",
        when="Any of the ISL-E002..E005 situations, on the V2 wrapper.",
        setup="sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6, interleaved=False,\n"
              "                         dtype=torch.bfloat16)  # V2 needs the contiguous bf16 sink\n"
              "sink.initialize_lora(il.LoRABackend('triton_v2', 3), generation='v2')\n" + _POOL
              + "ga, gb, da, db = pool.buffers()\n",
        trigger="sink.set_lora_info(ga[:, :, :4], gb, da, db)  # a rank mismatch, in V2's words\n",
        fix="print(il.diagnose_pool(ga[:, :, :4], gb, da, db, n_shared_experts=2).codes)  # which check\n"
            "sink.set_lora_info(ga, gb, da, db)\n",
        related=("ISL-E002", "ISL-E003", "ISL-E004", "ISL-E005"), origin="sglang V2 dense engine"),
    CatalogEntry(
        code="ISL-E007", title="the pool's shape changed after initialization", exc_type=RuntimeError,
        message="Shared-sink LoRA pool shape changed after initialization: gate-up {old} -> {new}, "
                "down-A {old} -> {new}",
        pattern=r"Shared-sink LoRA pool shape changed after initialization",
        meaning="In the shared-outer layout the derived operands w1_delta [S, n*2F, 2R] and a_cat "
                "[S, R, n*F] are allocated once and kept at a fixed address, because CUDA graphs replay "
                "against it. A later set_lora_info whose buffers would change those shapes (more slots, "
                "another rank, another F) cannot be honoured in place. The shapes in the message are "
                "those of w1_delta and a_cat, not of the pool buffers; a change of H alone does not "
                "trigger it. Upstream has already adopted the new buffers when it raises (the next "
                "refresh then fails); the kit leaves the module as it was.",
        when="Re-creating the pool with another max_loras_per_batch or max_lora_rank while the model "
             "(and its captured graphs) lives on.",
        setup=_SINK + "small = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=2)\n"
              "sink.set_lora_info(*small.buffers())\n",
        trigger="big = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=4, max_rank=2)\n"
                "sink.set_lora_info(*big.buffers())  # 3 -> 4 slots\n",
        fix="sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6)  # a fresh module\n"
            "big = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=4, max_rank=2)\n"
            "sink.set_lora_info(*big.buffers())\n",
        related=("ISL-E008",)),
    CatalogEntry(
        code="ISL-E008", title="a refreshed slot is out of range", exc_type=IndexError,
        message="Shared-sink LoRA slot out of range: {sorted ids}",
        pattern=r"Shared-sink LoRA slot out of range: \[",
        meaning="After the pool changes a slot in place, on_lora_slots_updated copies it into the "
                "derived operands. Every id must be a slot 0..S-1; the message lists every requested "
                "id, sorted, not only the bad ones. Per-expert pools (and a module before set_lora_info) "
                "have nothing derived and accept any id silently.",
        when="An off-by-one between the engine's slot table and the pool, or -1 ('no adapter') passed "
             "as a slot to refresh.",
        setup=_SINK + _POOL + "sink.set_lora_info(*pool.buffers())\n" + _FACTORS
              + "pool.load(2, factors)\n",
        trigger="sink.on_lora_slots_updated([2, 3])  # the pool has slots 0..2\n",
        fix="sink.on_lora_slots_updated([2])\n",
        related=("ISL-E007", "ISL-K103")),
    CatalogEntry(
        code="ISL-E009", title="the dense LoRA wrapper is ineligible", exc_type=ValueError,
        message='InklingBatchDenseMLPWithLoRA is ineligible: {problems joined by "; "}',
        pattern=r"InklingBatchDenseMLPWithLoRA is ineligible: ",
        meaning="The first-generation wrapper needs the Triton backend whenever a batch can hold more "
                "than one adapter (problem 'multi-slot dense LoRA requires the Triton backend') and a "
                "sink whose weights are linearized in bf16, which only the interleaved base is "
                "('the shared sink does not use linearized BF16 weights').",
        when="Serving with --lora-backend other than triton and max_loras_per_batch > 1; a float32 or "
             "fp16 sink; a contiguous-layout sink on the first-generation wrapper.",
        setup="sink = il.SharedSinkLoRA(n_shared_experts=2, hidden_size=8, intermediate_size=6,\n"
              "                         interleaved=True, dtype=torch.bfloat16)\n",
        trigger="sink.initialize_lora(il.LoRABackend(name='csgmv', max_loras_per_batch=4))\n",
        fix="sink.initialize_lora(il.LoRABackend(name='triton', max_loras_per_batch=4))\n",
        related=("ISL-E014",)),
    CatalogEntry(
        code="ISL-E010", title="a flat down A's width is not divisible by n", exc_type=ValueError,
        message="Shared-sink down LoRA-A width must be divisible by {n}, got {width}",
        pattern=r"Shared-sink down LoRA-A width must be divisible by \d+, got \d+",
        meaning="A flat PEFT down A [r, n*F] holds the experts side by side; tensor-parallel slicing "
                "first splits it into [n, r, F], which needs its width to be a multiple of n.",
        when="An adapter for a sink with another n or F, or a down A that was already sharded.",
        setup=_SINK + "down_a = torch.randn(4, 13)\n",
        trigger="sink.slice_lora_a(down_a, tp_rank=0, target_module='down_proj', tp_size=1)  # 13 is not 2*F\n",
        fix="down_a = torch.randn(4, 12)  # [r, n*F] = [4, 2*6]\n"
            "sink.slice_lora_a(down_a, tp_rank=0, target_module='down_proj', tp_size=1)\n",
        related=("ISL-E011", "ISL-E012")),
    CatalogEntry(
        code="ISL-E011", title="a flat gate/up B's height is not divisible by n", exc_type=ValueError,
        message="Shared-sink gate/up LoRA-B height must be divisible by {n}, got {height}",
        pattern=r"Shared-sink gate/up LoRA-B height must be divisible by \d+, got \d+",
        meaning="A flat PEFT gate/up B [n*2F, r] holds the experts stacked; slicing first splits it "
                "into [n, 2F, r], which needs its height to be a multiple of n.",
        when="An adapter for a sink with another n or F, or a B from a dense (non-MoE) MLP.",
        setup=_SINK + "gate_up_b = torch.randn(25, 4)\n",
        trigger="sink.slice_lora_b(gate_up_b, tp_rank=0, target_module='gate_up_proj', tp_size=1)\n",
        fix="gate_up_b = torch.randn(24, 4)  # [n*2F, r] = [2*12, 4]\n"
            "sink.slice_lora_b(gate_up_b, tp_rank=0, target_module='gate_up_proj', tp_size=1)\n",
        related=("ISL-E010", "ISL-E012")),
    CatalogEntry(
        code="ISL-E012", title="a raw reshape error: a size that does not split", exc_type=RuntimeError,
        message="shape '[...]' is invalid for input of size {N}",
        pattern=r"shape '\[[-\d, ]*\]' is invalid for input of size \d+",
        meaning="Upstream does not check every size before it reshapes, so some mistakes surface as "
                "torch's own reshape error. In set_lora_info (shared outer) it means gate-up B's 2F "
                "is odd and cannot be split into gate and up halves; in adapter normalization it means "
                "a flat factor's width or height is not a multiple of n. The bracketed shape is what "
                "the code tried: [S, n, 2, F, R] for gate-up B, [r, n, F] for a flat down A.",
        when="A gate-up B whose gate and up halves have different sizes, a missing row, or a flat "
             "factor for another number of experts.",
        setup=_SINK + "pool = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=2, max_rank=4)\n"
              "ga, gb, da, db = pool.buffers()\n",
        trigger="sink.set_lora_info(ga, gb[:, :, :11], da, db)  # 2F = 11 is odd\n",
        fix="print(il.diagnose_pool(ga, gb[:, :, :11], da, db, n_shared_experts=2).codes)  # ISL-D103\n"
            "sink.set_lora_info(ga, gb, da, db)                # 2F = 12\n",
        related=("ISL-E010", "ISL-E011", "ISL-E013")),
    CatalogEntry(
        code="ISL-E013", title="a raw IndexError: buffers with different slot counts", exc_type=IndexError,
        message="index {i} is out of bounds for dimension 0 with size {S}",
        pattern=r"index -?\d+ is out of bounds for dimension \d+ with size \d+",
        meaning="set_lora_info does not compare the four buffers' slot counts. In the shared-outer "
                "layout it then builds the derived operands slot by slot over gate-up B's slots, and a "
                "down A with fewer slots runs out: torch's own IndexError.",
        when="Buffers cut to different numbers of slots, e.g. one of them sliced to the active slots "
             "only.",
        setup=_SINK + _POOL + "ga, gb, da, db = pool.buffers()\n",
        trigger="sink.set_lora_info(ga, gb, da[:2], db)  # down A has 2 slots, gate-up B 3\n",
        fix="print(il.diagnose_pool(ga, gb, da[:2], db, n_shared_experts=2).codes)  # ISL-D104\n"
            "sink.set_lora_info(ga, gb, da, db)\n",
        related=("ISL-E012",)),
    CatalogEntry(
        code="ISL-E014", title="the multi-slot kernels need Triton on CUDA", exc_type=RuntimeError,
        message="Multi-slot dense LoRA requires Triton on CUDA",
        pattern=r"Multi-slot dense LoRA requires Triton on CUDA",
        meaning="The Triton kernels run on a CUDA device (or, for tests, in Triton's CPU interpreter "
                "with TRITON_INTERPRET=1). On a CPU tensor use the 'torch' backend, or 'auto', which "
                "picks the fastest correct backend for the device.",
        when="Asking for backend='triton' with CPU tensors, e.g. a notebook written on a GPU machine "
             "run on a laptop.",
        setup=_SINK + _POOL + "sink.set_lora_info(*pool.buffers())\n"
              "x, gammas = torch.randn(5, 8), torch.rand(5, 2)\n"
              "batch = il.SlotBatch.from_token_slots([0, 0, 1, 2, -1], num_slots=3)\n",
        trigger="import os; os.environ.pop('TRITON_INTERPRET', None)\n"
                "sink(x, gammas, batch=batch, backend='triton')  # x is on the CPU\n",
        fix="sink(x, gammas, batch=batch, backend='auto')  # torch on CPU, triton on CUDA\n",
        related=("ISL-E009",)),
    CatalogEntry(
        code="ISL-E015", title="a per-expert outer adapter in a shared-outer pool", exc_type=ValueError,
        message="experts_shared_outer_loras is enabled but {gate_up_proj_moe lora_A | down_proj_moe lora_B} "
                "has expert_dim={k} (expected 1).",
        pattern=r"experts_shared_outer_loras is enabled but \w+ lora_[AB] has expert_dim=\d+ \(expected 1\)",
        meaning="The pool was sized for shared outer factors (one gate-up A and one down B for all "
                "experts); this adapter ships k of them. Either its k outer factors are all equal (then "
                "keep one: exact), or the pool must be per-expert outer.",
        when="Loading a per-expert export with --experts-shared-outer-loras, or into a pool whose "
             "layout was auto-detected from other adapters.",
        setup=_POOL + "factors = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=4, outer=2, seed=0)\n",
        trigger="pool.load(0, factors)\n",
        fix="per_expert = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=4, outer=2)\n"
            "per_expert.load(0, factors)\n",
        related=("ISL-E002", "ISL-E003")),
    CatalogEntry(
        code="ISL-E016", title="an adapter does not fit its pool slot", exc_type=AssertionError,
        message="LoRA buffer shape {buffer view} does not match weight shape {weight}.",
        pattern=r"LoRA buffer shape .* does not match weight shape",
        meaning="Loading copies each factor into its slot's view of the buffer. The view is cut at the "
                "pool's max rank, H and F; an adapter of a larger rank, or of another H or F, does not "
                "fit. A rank above max_rank needs a bigger pool (--max-lora-rank); another H or F is "
                "another model.",
        when="An r=16 adapter in a pool sized with max_lora_rank=8; an adapter trained with another "
             "tensor-parallel F.",
        setup=_POOL + "factors = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=8, seed=0)\n",
        trigger="pool.load(0, factors)  # rank 8 > max_rank 4\n",
        fix="big = il.LoRAPool(n=2, hidden=8, intermediate=6, slots=3, max_rank=8)\n"
            "big.load(0, factors)\n",
        related=("ISL-E005",)),
    # -- the kit's own refusals --------------------------------------------------------
    CatalogEntry(
        code="ISL-K101", title="tp_rank outside the tensor-parallel group", exc_type=ValueError,
        message="tp_rank {r} is outside the tensor-parallel group of size {tp}: use a rank in 0..{tp-1}",
        pattern=r"tp_rank -?\d+ is outside the tensor-parallel group of size -?\d+",
        meaning="Upstream's slicing does not check the rank: a rank past the end yields empty or "
                "misplaced slices and a silently wrong (or zero) LoRA delta. The kit refuses it.",
        when="A tp_rank/tp_size pair from another launch, or a 1-based rank.",
        setup=_SINK + "down_a = torch.randn(4, 12)\n",
        trigger="sink.slice_lora_a(down_a, tp_rank=2, target_module='down_proj', tp_size=2)\n",
        fix="sink.slice_lora_a(down_a, tp_rank=1, target_module='down_proj', tp_size=2)\n",
        related=("ISL-K102",), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K102", title="the intermediate size does not split over tp ranks", exc_type=ValueError,
        message="{factor}: intermediate size {F} is not divisible by tp_size={tp}",
        pattern=r"intermediate size \d+ is not divisible by tp_size=\d+",
        meaning="Each tensor-parallel rank holds F/tp features of every expert, so F must be a "
                "multiple of tp; otherwise the LoRA shards and the base shards would not line up.",
        when="Sharding an adapter (or a sink) for a tp that does not divide F.",
        setup=_SINK + "down_a = torch.randn(4, 12)  # n=2 experts of F=6\n",
        trigger="sink.slice_lora_a(down_a, tp_rank=0, target_module='down_proj', tp_size=4)\n",
        fix="sink.slice_lora_a(down_a, tp_rank=0, target_module='down_proj', tp_size=3)\n",
        related=("ISL-K101",), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K103", title="a batch names a slot the pool does not have", exc_type=ValueError,
        message="SlotBatch: {token|segment} {i} uses slot {s}, but the pool has slots 0..{S-1} "
                "(-1 means base model only); {k} {token|segment}(s) out of range",
        pattern=r"SlotBatch: \w+ \d+ uses slot -?\d+, but the pool has slots",
        meaning="Every token names a slot of the pool, or -1 for the base model only. Upstream's "
                "kernels would read another slot's (or unallocated) memory; the kit refuses.",
        when="Slot ids from the engine's adapter table (which can be larger than the pool) instead of "
             "the pool's slot indices.",
        setup="",
        trigger="il.SlotBatch.from_token_slots([0, 1, 3], num_slots=3)\n",
        fix="il.SlotBatch.from_token_slots([0, 1, 2], num_slots=3)\n",
        related=("ISL-E008", "ISL-K104"), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K104", title="loading into a slot the pool does not have", exc_type=IndexError,
        message="LoRAPool slot {s} is outside the pool: use a slot in 0..{S-1}",
        pattern=r"LoRAPool slot -?\d+ is outside the pool",
        meaning="A pool has max_loras_per_batch slots, numbered from 0.",
        when="A 1-based slot number, or more adapters than slots.",
        setup=_POOL + _FACTORS,
        trigger="pool.load(3, factors)\n",
        fix="pool.load(2, factors)\n",
        related=("ISL-K103",), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K105", title="the launched world size is not the asked tp", exc_type=ValueError,
        message="torchrun started {w} process(es) (WORLD_SIZE={w}) but tp={tp} was asked: run torchrun "
                "--nproc-per-node {tp} ..., or pass --tp {w}",
        pattern=r"torchrun started \d+ process\(es\) \(WORLD_SIZE=\d+\) but tp=\d+ was asked",
        meaning="Each process of a tensor-parallel run holds one rank's shard; the shards only sum to the "
                "sink's output when there are exactly tp of them.",
        when="A torchrun --nproc-per-node that differs from --tp, e.g. after changing one of them in a "
             "launch script.",
        setup="",
        trigger="il.parallel.check_world_size(tp=2, world_size=4)  # torchrun --nproc-per-node 4 ... --tp 2\n",
        fix="il.parallel.check_world_size(tp=4, world_size=4)\n",
        related=("ISL-K101", "ISL-K106"), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K106", title="NCCL without one GPU per rank", exc_type=ValueError,
        message="NCCL needs one GPU per rank: tp={tp}, but this machine shows {g} CUDA device(s); use "
                "dist_backend='gloo' (CPU) or a smaller tp",
        pattern=r"NCCL needs one GPU per rank: tp=\d+",
        meaning="NCCL all-reduces between GPUs, one rank per GPU. On a machine with fewer GPUs than tp "
                "(or none), run the same check over gloo on the CPU.",
        when="Running a GPU launch script on a laptop or a single-GPU machine.",
        setup="",
        trigger="il.parallel.resolve_dist_backend('nccl', tp=64)\n",
        fix="il.parallel.resolve_dist_backend('gloo', tp=64)  # or 'auto': nccl when there are enough GPUs\n",
        related=("ISL-K105",), origin="inkling_lab"),
    # -- adapters (issue 3): entries for the adapter loader and converter go here ------
    CatalogEntry(
        code="ISL-K201", title="no adapter_config.json in the adapter folder", exc_type=FileNotFoundError,
        message="{folder}/adapter_config.json: no adapter_config.json: a PEFT adapter is a folder with "
                "adapter_config.json and adapter_model.safetensors",
        pattern=r"no adapter_config\.json",
        meaning="load_adapter (and inkling-lab doctor/convert) read a PEFT adapter folder: its config gives "
                "the rank r and lora_alpha, without which the factors cannot be checked or scaled. The path "
                "named no such file: a wrong folder, a parent folder, or a checkpoint saved without its config.",
        when="Pointing at the training run's output folder instead of the adapter inside it, a typo, or "
             "copying only the weights file.",
        setup=("import tempfile\nfrom pathlib import Path\n"
              "from inkling_lab.adapters import load_adapter, save_adapter, synthetic_adapter\n"
              "folder = Path(tempfile.mkdtemp()) / 'my_adapter'\n"
              "save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4), folder)\n"),
        trigger="(folder / 'adapter_config.json').unlink()  # only the weights are left\n"
                "load_adapter(folder)\n",
        fix="load_adapter(folder)  # the folder that holds adapter_config.json and adapter_model.safetensors\n",
        related=("ISL-K202", "ISL-K203"), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K202", title="a malformed adapter config", exc_type=ValueError,
        message="{folder}/adapter_config.json: malformed adapter config: {what is wrong}",
        pattern=r"malformed adapter config: ",
        meaning="adapter_config.json must be a JSON object of a LoRA adapter with a positive integer r and "
                "a numeric lora_alpha (PEFT's default 8 when absent). The message names the field and the "
                "value found.",
        when="A hand-edited config (a string for r, a trailing comma), a config of another PEFT method, or "
             "a file truncated on copy.",
        setup="import tempfile\nfrom pathlib import Path\n"
              "from inkling_lab.adapters import load_adapter, save_adapter, synthetic_adapter\n"
              "folder = Path(tempfile.mkdtemp()) / 'my_adapter'\n"
              "save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4), folder)\n"
              "config = folder / 'adapter_config.json'\n",
        trigger="config.write_text('{\"peft_type\": \"LORA\", \"r\": \"four\", \"lora_alpha\": 8}')\n"
                "load_adapter(folder)\n",
        fix="config.write_text('{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8}')\n"
            "load_adapter(folder)\n",
        related=("ISL-K201", "ISL-K206"), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K203", title="no adapter_model.safetensors (pickle checkpoints are refused)",
        exc_type=FileNotFoundError,
        message="{folder}/adapter_model.safetensors: no adapter_model.safetensors{ (found adapter_model.bin: "
                "pickle checkpoints are never loaded ...)}",
        pattern=r"no adapter_model\.safetensors",
        meaning="The kit loads adapter weights only from safetensors: unpickling a .bin or .pt file can run "
                "arbitrary code, so such files are never opened. Convert a checkpoint you trust once, with "
                "torch.load(..., weights_only=True) and safetensors.torch.save_file.",
        when="Old PEFT versions (adapter_model.bin), or a folder whose weights were not copied.",
        setup="import tempfile\nfrom pathlib import Path\n"
              "from inkling_lab.adapters import load_adapter, save_adapter, synthetic_adapter\n"
              "folder = Path(tempfile.mkdtemp()) / 'my_adapter'\n"
              "save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4), folder)\n"
              "from safetensors.torch import load_file, save_file\n"
              "bin_path = folder / 'adapter_model.bin'\n"
              "torch.save(load_file(folder / 'adapter_model.safetensors'), bin_path)\n"
              "(folder / 'adapter_model.safetensors').unlink()  # an old-style folder: weights as a pickle\n",
        trigger="load_adapter(folder)\n",
        fix="save_file(torch.load(bin_path, weights_only=True), folder / 'adapter_model.safetensors')\n"
            "load_adapter(folder)\n",
        related=("ISL-K201", "ISL-K204"), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K204", title="a truncated or corrupt safetensors file", exc_type=ValueError,
        message="{folder}/adapter_model.safetensors: not a readable safetensors file ({size} bytes: {reason}); "
                "it is truncated or corrupt: export or download it again",
        pattern=r"not a readable safetensors file",
        meaning="The weights file does not parse as safetensors: its header or its data is cut short or "
                "overwritten. Nothing of it is used.",
        when="An interrupted download or copy, a full disk during export, a Git LFS pointer file instead of "
             "the weights.",
        setup="import tempfile\nfrom pathlib import Path\n"
              "from inkling_lab.adapters import load_adapter, save_adapter, synthetic_adapter\n"
              "folder = Path(tempfile.mkdtemp()) / 'my_adapter'\n"
              "save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4), folder)\n"
              "weights = folder / 'adapter_model.safetensors'\ncomplete = weights.read_bytes()\n",
        trigger="weights.write_bytes(complete[:100])  # cut short\nload_adapter(folder)\n",
        fix="weights.write_bytes(complete)  # the whole file again\nload_adapter(folder)\n",
        related=("ISL-K203",), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K205", title="a shared-sink factor that is not a 2D matrix", exc_type=ValueError,
        message="{file}: tensor '{key}' is {k}D [...]; a shared-sink LoRA factor is a 2D matrix {expected}: ...",
        pattern=r"a shared-sink LoRA factor is a 2D matrix",
        meaning="In a PEFT file every shared-sink factor is one plain matrix: A [r, in], B [out, r], with the "
                "experts stacked (B) or side by side (down A) in the flat layout. The pool's expert and slot "
                "axes are added by normalization and the converter, not stored in the adapter.",
        when="An adapter re-saved from an engine's pool or from an MoE framework that keeps an expert axis.",
        setup=("from inkling_lab.adapters import Adapter, synthetic_adapter\n"
              "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)  # flat factors, PEFT names\n"
              "key = 'base_model.model.model.layers.0.mlp.shared_experts.down_proj.lora_A.weight'\n"),
        trigger="Adapter.from_state(ad.config, {**ad.weights, key: ad.weights[key].reshape(4, 2, 6)})  # [r, n, F]\n",
        fix="Adapter.from_state(ad.config, ad.weights)  # down A as PEFT stores it: [r, n*F] = [4, 12]\n",
        related=("ISL-K206", "ISL-E001"), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K206", title="a factor's rank axis does not match r", exc_type=ValueError,
        message="{file}: tensor '{key}' has shape [...]: its rank axis (dim {0 or 1}) is {k}, but "
                "adapter_config.json says r={r}; ...",
        pattern=r"its rank axis \(dim \d\) is \d+, but adapter_config\.json says r=\d+",
        meaning="A is [r, in] (rank axis 0), B is [out, r] (rank axis 1), and r comes from the config. A "
                "factor whose other axis is r is stored transposed: load_adapter transposes it and reports "
                "the repair (repair=False refuses). Otherwise the config's r or the factor is wrong.",
        when="An export that wrote A or B transposed (a Linear's weight vs. a matmul operand), an r edited in "
             "the config, or a config of another adapter.",
        setup=("from inkling_lab.adapters import Adapter, synthetic_adapter\n"
              "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)  # flat factors, PEFT names\n"
              "key = 'base_model.model.model.layers.0.mlp.shared_experts.down_proj.lora_A.weight'\n"),
        trigger="Adapter.from_state(ad.config, {**ad.weights, key: ad.weights[key].T}, repair=False)  # [n*F, r]\n",
        fix="repaired = Adapter.from_state(ad.config, {**ad.weights, key: ad.weights[key].T})  # repair=True\n"
            "print(repaired.findings[0].code, 'repaired:', list(repaired.weights[key].shape))\n",
        related=("ISL-K202", "ISL-K205"), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K207", title="a tensor under shared_experts names no shared-sink projection", exc_type=ValueError,
        message="{file}: tensor '{key}' is under shared_experts but is no shared-sink LoRA factor: expected "
                "'<module>.shared_experts[.<e>].<proj>.lora_A.weight' (or lora_B) with <proj> one of ...",
        pattern=r"is under shared_experts but is no shared-sink LoRA factor",
        meaning="The shared sink's projections are gate_proj, up_proj, gate_up_proj and down_proj (or w1, "
                "w3, w2). A key under shared_experts with another name, or that is no lora_A/lora_B weight, "
                "would be silently skipped by an engine; the kit refuses it and suggests the closest name.",
        when="A typo in an export script, another model family's names, or DoRA/bias tensors under the sink.",
        setup=("from inkling_lab.adapters import Adapter, synthetic_adapter\n"
              "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)  # flat factors, PEFT names\n"
              "key = 'base_model.model.model.layers.0.mlp.shared_experts.down_proj.lora_A.weight'\n"),
        trigger="typo = {k.replace('gate_proj', 'gate_prj'): v for k, v in ad.weights.items()}\n"
                "Adapter.from_state(ad.config, typo)\n",
        fix="Adapter.from_state(ad.config, ad.weights)  # gate_proj, up_proj, down_proj\n",
        related=("ISL-K208",), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K208", title="no shared-sink LoRA factors in the adapter", exc_type=ValueError,
        message="{file}: no shared-sink LoRA factors: no tensor is named "
                "'<module>.mlp.shared_experts.<proj>.lora_A.weight' (or lora_B), ...",
        pattern=r"no shared-sink LoRA factors",
        meaning="The adapter trains other modules only (attention, routed experts): there is nothing to put "
                "in the shared sink's pool.",
        when="An adapter whose target_modules did not include the shared experts' projections.",
        setup=("from inkling_lab.adapters import Adapter, synthetic_adapter\n"
              "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)  # flat factors, PEFT names\n"
              "key = 'base_model.model.model.layers.0.mlp.shared_experts.down_proj.lora_A.weight'\n"),
        trigger="attention_only = {'model.layers.0.self_attn.q_proj.lora_A.weight': torch.zeros(4, 8),\n"
                "                  'model.layers.0.self_attn.q_proj.lora_B.weight': torch.zeros(8, 4)}\n"
                "Adapter.from_state(ad.config, attention_only)\n",
        fix="Adapter.from_state(ad.config, ad.weights)  # trained with the shared experts in target_modules\n",
        related=("ISL-K207",), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K209", title="a LoRA A without its B (or B without A)", exc_type=ValueError,
        message="{file}: '{key}' has no matching '{other key}': every LoRA factor needs its A and its B",
        pattern=r"has no matching .*: every LoRA factor needs its A and its B",
        meaning="A LoRA delta is B @ A: one without the other is no delta at all, and usually means a tensor "
                "was lost or renamed on export.",
        when="A filtered or merged state dict, a renamed key.",
        setup=("from inkling_lab.adapters import Adapter, synthetic_adapter\n"
              "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)  # flat factors, PEFT names\n"
              "key = 'base_model.model.model.layers.0.mlp.shared_experts.down_proj.lora_A.weight'\n"),
        trigger="no_b = {k: v for k, v in ad.weights.items() if k != key.replace('lora_A', 'lora_B')}\n"
                "Adapter.from_state(ad.config, no_b)\n",
        fix="Adapter.from_state(ad.config, ad.weights)\n",
        related=("ISL-K208",), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K210", title="per-expert factors that do not cover the sink's experts", exc_type=ValueError,
        message="{file}: per-expert factor {module}.<e>.{proj}.lora_{A|B} is given for experts [...] but the "
                "sink has n={n} shared experts (it needs experts 0..{n-1})",
        pattern=r"per-expert factor .* is given (for experts|both)",
        meaning="Per-expert named factors (shared_experts.<e>.<proj>...) give one factor per expert; the "
                "pool needs exactly experts 0..n-1, and one form per factor (not also a shared one).",
        when="An adapter exported for a model with another number of shared experts, or a lost expert.",
        setup="from inkling_lab.adapters import synthetic_adapter\n"
              "per_expert = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, per_expert=True)\n",
        trigger="per_expert.factors(3)  # exported for 2 experts\n",
        fix="per_expert.factors(2)\n",
        related=("ISL-E004", "ISL-E012"), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K211", title="an up_proj without its gate_proj", exc_type=ValueError,
        message="{file}: {module}: up_proj has no gate_proj, so upstream leaves it unstacked and never "
                "applies it; ...",
        pattern=r"up_proj has no gate_proj, so upstream leaves it unstacked",
        meaning="Upstream's normalization stacks gate and up into gate_up_proj; a gate alone gets a zero up, "
                "but an up alone stays unstacked and never reaches the pool: sglang serves the base model for "
                "it, silently. The converter stacks it with a zero gate (exact) and reports it; repair=False "
                "refuses.",
        when="Training only up_proj of the shared experts.",
        setup="from inkling_lab.adapters import Adapter, synthetic_adapter\n"
              "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)  # flat factors, PEFT names\n"
              "key = 'base_model.model.model.layers.0.mlp.shared_experts.down_proj.lora_A.weight'\n"
              "up_only = {k: v for k, v in ad.weights.items() if '.gate_proj.' not in k}\n",
        trigger="Adapter.from_state(ad.config, up_only, repair=False).factors(2)\n",
        fix="repaired = Adapter.from_state(ad.config, up_only)  # repair=True\n"
            "repaired.factors(2)\nprint(repaired.findings[-1].code, 'stacked with a zero gate')\n",
        related=("ISL-K212",), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K212", title="one outer factor per expert, the other shared", exc_type=ValueError,
        message="{file}: {module}: {gate-up A | down B} is given per expert but {the other} is shared; both "
                "outer factors must use one layout: ...",
        pattern=r"both outer factors must use one layout",
        meaning="A pool slot has one outer layout (O = 1 or n) for gate-up A and down B together. When one "
                "of them is per expert and the other shared, giving the shared one to every expert is exact: "
                "the converter does that and reports it; repair=False refuses.",
        when="A per-expert export that kept down B (or gate/up A) shared.",
        setup="from inkling_lab.adapters import Adapter, synthetic_adapter\n"
              "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)  # flat factors, PEFT names\n"
              "key = 'base_model.model.model.layers.0.mlp.shared_experts.down_proj.lora_A.weight'\n"
              "per_expert = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4, per_expert=True)\n"
              "mixed = {k: v for k, v in per_expert.weights.items() if 'down_proj' not in k}\n"
              "mixed.update({k: v for k, v in ad.weights.items() if 'down_proj' in k})\n",
        trigger="Adapter.from_state(ad.config, mixed, repair=False).factors(2)\n",
        fix="repaired = Adapter.from_state(ad.config, mixed)  # repair=True\n"
            "print(next(iter(repaired.factors(2).values())).down_b.shape)  # down B for each of the 2 experts\n",
        related=("ISL-E003", "ISL-K211"), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K213", title="refusing to write over a file", exc_type=FileExistsError,
        message="refusing to write {file}: it already exists; pass --force (force=True) to replace it | it is "
                "one of the input adapters' files ...",
        pattern=r"refusing to write .*: it (already exists|is one of the input adapters' files)",
        meaning="The converter never replaces a file unless told to (--force), and never writes over one of "
                "its input adapters, even with --force. Its writes are atomic: a reader sees the old file or "
                "the whole new one.",
        when="Re-running inkling-lab convert with the same -o, or -o pointing into an adapter folder.",
        setup="import tempfile\nfrom pathlib import Path\n"
              "from inkling_lab.adapters import load_adapter, save_adapter, synthetic_adapter\n"
              "folder = Path(tempfile.mkdtemp()) / 'my_adapter'\n"
              "save_adapter(synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4), folder)\n"
              "from inkling_lab.convert import convert\n"
              "pool = convert([load_adapter(folder)], n_shared_experts=2)\n"
              "out = folder.parent / 'pool.safetensors'\npool.save(out)\n",
        trigger="pool.save(out)  # a second time\n",
        fix="pool.save(out, force=True)\n",
        related=(), origin="inkling_lab"),
    CatalogEntry(
        code="ISL-K214", title="factors of one projection with different shapes", exc_type=ValueError,
        message="{file}: '{key}' is [...] but '{other key}' is [...]: the factors of one projection must have "
                "one shape (gate and up alike, every expert alike); re-export the adapter",
        pattern=r"the factors of one projection must have one shape",
        meaning="Normalization stacks gate and up (their A along the rank axis, their B along the feature "
                "axis) and stacks per-expert factors along the expert axis: they must have one shape. "
                "Upstream would fail with torch's raw cat or stack error; the kit names the two tensors.",
        when="Gate and up exported with different ranks or for different F, or one expert's factor cut short.",
        setup="from inkling_lab.adapters import Adapter, synthetic_adapter\n"
              "ad = synthetic_adapter(n=2, hidden=8, intermediate=6, rank=4)  # flat factors, PEFT names\n"
              "up_b = 'base_model.model.model.layers.0.mlp.shared_experts.up_proj.lora_B.weight'  # [n*F, r]\n",
        trigger="Adapter.from_state(ad.config, {**ad.weights, up_b: ad.weights[up_b][:10]})  # F=5 for up\n",
        fix="Adapter.from_state(ad.config, ad.weights)  # gate B and up B both [12, 4]\n",
        related=("ISL-K205", "ISL-E012"), origin="inkling_lab"),
    # -- warnings (issue 7): the per-expert outer defect goes here -----------------------
    CatalogEntry(
        code="ISL-W001", title="a per-expert outer adapter is computed wrongly by sglang 0.5.23",
        exc_type=UpstreamDefectWarning,
        message="{adapter or pool} uses the per-expert outer LoRA layout (O = {n}): sglang 0.5.23 computes a "
                "wrong gate/up delta for it without raising (relative error {e} of the sink output on random "
                "inputs); what to do: inkling-lab explain ISL-W001",
        pattern=r"uses the per-expert outer LoRA layout \(O = \d+\): sglang 0\.5\.23 computes a wrong "
                r"gate/up delta",
        meaning="In the per-expert outer layout (O = n: every expert has its own gate-up A and down B) "
                "sglang 0.5.23 loads and serves the adapter, but its gate/up delta is wrong: the up half of "
                "gate-up A is never read (the gate shrink feeds the up B too), and gate-up B's [gate | up] "
                "rows are added in contiguous order onto the interleaved activation input, so gate and up "
                "deltas land on the wrong features. The down delta is right; the shared outer layout is "
                "right. Upstream's own code, run on random inputs, was off by 0.6-1.2 of the sink output; "
                "defect_report measures it for a given adapter. "
                "When every expert's outer factors are the same, collapse them to shared outer (exact; "
                "inkling-lab convert does it); otherwise do not serve the adapter from a per-expert pool "
                "on sglang 0.5.23 (merge it into the base weights, or export shared outer factors).",
        when="An adapter whose shared-sink factors are saved per expert (shared_experts.<e>.<proj>...), "
             "e.g. a trainer that exports every expert's outer factors, or a pool created with outer=n.",
        setup="from inkling_lab.upstream_defect import collapse_identical_outer, defect_report\n"
              "shared = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=4, seed=0)\n"
              "factors = il.LoRAFactors(shared.gate_up_a.expand(2, -1, -1), shared.gate_up_b, shared.down_a,\n"
              "                         shared.down_b.expand(2, -1, -1))  # the same outer factors, once per expert\n",
        trigger="defect_report(factors).warn()  # runs both computations; warns for the per-expert layout\n",
        fix="ga, db, collapsed = collapse_identical_outer(factors.gate_up_a, factors.down_b)  # exact\n"
            "fixed = il.LoRAFactors(ga, factors.gate_up_b, factors.down_a, db)\n"
            "defect_report(fixed).warn()  # shared outer: computed as intended upstream, no warning\n",
        related=("ISL-E015", "ISL-E003"), origin="sglang 0.5.23 (silent)"),
]

