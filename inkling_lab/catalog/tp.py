"""Errors of tensor-parallel slicing and of the tensor-parallel runner."""
from __future__ import annotations

from ._snippets import SINK
from .entry import BOTH, EVERY_RELEASE, INKLING_LORA, KIT, OTHER_REVISION, CatalogEntry

_SLICE_A = f"{INKLING_LORA}: InklingBatchDenseMLPWithLoRA.slice_moe_lora_a_weights"
_SLICE_B = f"{INKLING_LORA}: InklingBatchDenseMLPWithLoRA.slice_moe_lora_b_weights"
_V2_SHARES = " (the second generation uses the same method)"

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-E010", title="a flat down A's width is not divisible by n", exc_type=ValueError,
        message="Shared-sink down LoRA-A width must be divisible by {n}, got {width}",
        meaning="A flat PEFT down A [r, n*F] holds the experts side by side; tensor-parallel slicing "
                "first splits it into [n, r, F], which needs its width to be a multiple of n.",
        when="An adapter for a sink with another n or F, or a down A that was already sharded.",
        setup=SINK + "down_a = torch.randn(4, 13)\n",
        trigger="sink.slice_lora_a(down_a, tp_rank=0, target_module='down_proj', tp_size=1)  # 13 is not 2*F\n",
        fix="down_a = torch.randn(4, 12)  # [r, n*F] = [4, 2*6]\n"
            "sink.slice_lora_a(down_a, tp_rank=0, target_module='down_proj', tp_size=1)\n",
        remedy="Export down A unsharded as [r, n*F] for this model's n and F (the width in the message "
               "should be n_shared_experts times the shared expert's intermediate size).",
        upstream=_SLICE_A + _V2_SHARES + ".",
        generation=BOTH, adapter_caused=True, related=("ISL-E011", "ISL-E012", "ISL-E024"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E011", title="a flat gate/up B's height is not divisible by n", exc_type=ValueError,
        message="Shared-sink gate/up LoRA-B height must be divisible by {n}, got {height}",
        meaning="A flat PEFT gate/up B [n*2F, r] holds the experts stacked; slicing first splits it "
                "into [n, 2F, r], which needs its height to be a multiple of n.",
        when="An adapter for a sink with another n or F, or a B from a dense (non-MoE) MLP.",
        setup=SINK + "gate_up_b = torch.randn(25, 4)\n",
        trigger="sink.slice_lora_b(gate_up_b, tp_rank=0, target_module='gate_up_proj', tp_size=1)\n",
        fix="gate_up_b = torch.randn(24, 4)  # [n*2F, r] = [2*12, 4]\n"
            "sink.slice_lora_b(gate_up_b, tp_rank=0, target_module='gate_up_proj', tp_size=1)\n",
        remedy="Export gate/up B unsharded as [n*2F, r] (each expert's gate rows, then its up rows) for this "
               "model's n and F.",
        upstream=_SLICE_B + _V2_SHARES + ".",
        generation=BOTH, adapter_caused=True, related=("ISL-E010", "ISL-E012", "ISL-E024"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-E024", title="a flat factor's extent is not divisible by n (folded message)",
        exc_type=ValueError,
        message="Shared-sink {target_module} LoRA factor extent {extent} is not divisible by the {n} experts",
        meaning="The same mistake as ISL-E010 (a flat down A whose width is not a multiple of n) or ISL-E011 "
                "(a flat gate/up B whose height is not), in the words of an sglang revision that folds the "
                "two checks into one message; target_module says which factor (down_proj_moe: down A's "
                "width; gate_up_proj_moe: gate/up B's height).",
        when="The same adapters as ISL-E010/E011, served by a build of that revision.",
        setup=SINK + "down_a = torch.randn(4, 85)\n",
        trigger="sink.slice_lora_a(down_a, tp_rank=0, target_module='down_proj_moe', tp_size=1)  "
                "# the kit speaks 0.5.23: ISL-E010\n",
        fix="down_a = torch.randn(4, 12)  # [r, n*F] = [4, 2*6]\n"
            "sink.slice_lora_a(down_a, tp_rank=0, target_module='down_proj_moe', tp_size=1)\n",
        remedy="As for ISL-E010 (down_proj_moe) or ISL-E011 (gate_up_proj_moe): export the flat factor "
               "unsharded for this model's n and F.",
        upstream=f"{INKLING_LORA}: slice_moe_lora_a_weights / slice_moe_lora_b_weights of that revision; "
                 "sglang 0.5.23 raises ISL-E010 or ISL-E011 instead (checked: the message is not in its wheel).",
        generation=OTHER_REVISION, adapter_caused=True, reproduced=False, kit_code="ISL-E010",
        sample="ValueError: Shared-sink down_proj_moe LoRA factor extent 85 is not divisible by the 2 experts",
        related=("ISL-E010", "ISL-E011"), releases=()),
    CatalogEntry(
        code="ISL-K101", title="tp_rank outside the tensor-parallel group", exc_type=ValueError,
        message="tp_rank {tp_rank} is outside the tensor-parallel group of size {tp_size}: use a rank in "
                "0..{last}",
        meaning="A shard is one rank's slice of F; a rank outside 0..tp-1 has no slice. The kit refuses it "
                "instead of returning an empty or misplaced slice.",
        when="A tp_rank/tp_size pair from another launch, or a 1-based rank.",
        setup=SINK + "down_a = torch.randn(4, 12)\n",
        trigger="sink.slice_lora_a(down_a, tp_rank=2, target_module='down_proj', tp_size=2)\n",
        fix="sink.slice_lora_a(down_a, tp_rank=1, target_module='down_proj', tp_size=2)\n",
        remedy="Use the 0-based rank of this process in its tensor-parallel group (0..tp_size-1).",
        upstream=f"sglang takes tp_rank from the running process and does not check it: {INKLING_LORA}: "
                 "_slice_down_lora_a / _slice_gate_up_lora_b cut [tp_rank*F/tp, (tp_rank+1)*F/tp), which for "
                 "a rank past the end (or a negative one) is an empty slice; loading that into the pool then "
                 "fails mem_pool's shape assertion (ISL-E016).",
        generation=KIT, related=("ISL-K102", "ISL-E016"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K102", title="the intermediate size does not split over tp ranks", exc_type=ValueError,
        message="{what}: intermediate size {intermediate} is not divisible by tp_size={tp_size}; each rank "
                "holds F/tp features of every expert, so use a tp in {divisors}",
        meaning="Each tensor-parallel rank holds F/tp features of every expert, so F must be a "
                "multiple of tp; otherwise the LoRA shards and the base shards would not line up.",
        when="Sharding an adapter (or a sink) for a tp that does not divide F.",
        setup=SINK + "down_a = torch.randn(4, 12)  # n=2 experts of F=6\n",
        trigger="sink.slice_lora_a(down_a, tp_rank=0, target_module='down_proj', tp_size=4)\n",
        fix="sink.slice_lora_a(down_a, tp_rank=0, target_module='down_proj', tp_size=3)\n",
        remedy="Pick a tensor-parallel size that divides the shared expert's intermediate size F (the size "
               "in the message): one of F's divisors, e.g. 1, 2 or 3 for F = 6.",
        doctor_fix="use a --tp that divides the model's intermediate size F (each rank holds F/tp features)",
        upstream="sglang 0.5.23 does not check it: sglang/srt/models/inkling_common/dense_mlp.py: "
                 "InklingBatchDenseMLP.__init__ sets intermediate_size_per_partition = F // tp (floor), so "
                 "the LoRA slicing (_slice_down_lora_a / _slice_gate_up_lora_b) gives every rank floor(F/tp) "
                 "features and the last F mod tp features of every expert get no LoRA delta on any rank.",
        generation=KIT, related=("ISL-K101",), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K105", title="the launched world size is not the asked tp", exc_type=ValueError,
        message="torchrun started {world} process(es) (WORLD_SIZE={world}) but tp={tp} was asked: run torchrun "
                "--nproc-per-node {tp} ..., or pass --tp {world}",
        meaning="Each process of a tensor-parallel run holds one rank's shard; the shards only sum to the "
                "sink's output when there are exactly tp of them.",
        when="A torchrun --nproc-per-node that differs from --tp, e.g. after changing one of them in a "
             "launch script.",
        setup="",
        trigger="il.parallel.check_world_size(tp=2, world_size=4)  # torchrun --nproc-per-node 4 ... --tp 2\n",
        fix="il.parallel.check_world_size(tp=4, world_size=4)\n",
        remedy="Launch as many processes as the tp you ask for: torchrun --nproc-per-node T ... --tp T.",
        upstream="Nothing upstream: this is the kit's own runner (python -m inkling_lab.parallel); sglang "
                 "sizes its tensor-parallel group from --tp itself.",
        generation=KIT, related=("ISL-K101", "ISL-K106"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-K106", title="NCCL without one GPU per rank", exc_type=ValueError,
        message="NCCL needs one GPU per rank: tp={tp}, but this machine shows {gpus} CUDA device(s){detail}; "
                "use dist_backend='gloo' (CPU) or a smaller tp",
        meaning="NCCL all-reduces between GPUs, one rank per GPU. On a machine with fewer GPUs than tp "
                "(or none, or a torch without NCCL), run the same check over gloo on the CPU.",
        when="Running a GPU launch script on a laptop or a single-GPU machine.",
        setup="",
        trigger="il.parallel.resolve_dist_backend('nccl', tp=64)\n",
        fix="il.parallel.resolve_dist_backend('gloo', tp=64)  # or 'auto': nccl when there are enough GPUs\n",
        remedy="Run with --dist-backend gloo (or auto) on this machine, or on a machine with at least tp GPUs.",
        upstream="Nothing upstream: this is the kit's own runner; sglang places one rank per GPU and never "
                 "runs its tensor-parallel path over gloo.",
        generation=KIT, related=("ISL-K105",), releases=EVERY_RELEASE),
]
