"""Warnings: sglang raises nothing, but computes something else than the adapter means."""
from __future__ import annotations

from .entry import EVERY_RELEASE, INKLING_LORA, CatalogEntry, UpstreamDefectWarning

_SAME_OUTER = ("shared = il.LoRAFactors.random(n=2, hidden=8, intermediate=6, rank=4, seed=0)\n"
               "same = il.LoRAFactors(shared.gate_up_a.expand(2, -1, -1), shared.gate_up_b, shared.down_a,\n"
               "                      shared.down_b.expand(2, -1, -1))  # the same outer factors, once per expert\n")

ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        code="ISL-W001", title="a per-expert outer adapter is computed wrongly by sglang 0.5.23",
        exc_type=UpstreamDefectWarning, kind="warning",
        message="{subject} uses the per-expert outer LoRA layout (O = {n}): sglang 0.5.23 computes a wrong "
                "gate/up delta for it without raising (relative error {error} of the sink output on random "
                "inputs); what to do: inkling-lab explain ISL-W001",
        meaning="In the per-expert outer layout (O = n: every expert has its own gate-up A and down B) "
                "sglang 0.5.23 loads and serves the adapter, but its gate/up delta is wrong: the up half of "
                "gate-up A is never read (the gate shrink feeds the up B too), and gate-up B's [gate | up] "
                "rows are added in contiguous order onto the interleaved activation input, so gate and up "
                "deltas land on the wrong features. The down delta is right; the shared outer layout is "
                "right. Upstream's own code, run on random inputs, was off by 0.6-1.2 of the sink output; "
                "defect_report measures it for a given adapter.",
        when="An adapter whose shared-sink factors are saved per expert (shared_experts.<e>.<proj>...), "
             "e.g. a trainer that exports every expert's outer factors, or a pool created with outer=n.",
        setup="from inkling_lab.upstream_defect import collapse_identical_outer, defect_report\n" + _SAME_OUTER,
        trigger="defect_report(same).warn()  # runs both computations; warns for the per-expert layout\n",
        fix="ga, db, collapsed = collapse_identical_outer(same.gate_up_a, same.down_b)  # exact\n"
            "fixed = il.LoRAFactors(ga, same.gate_up_b, same.down_a, db)\n"
            "defect_report(fixed).warn()  # shared outer: computed as intended upstream, no warning\n",
        remedy="When every expert's outer factors are the same, collapse them to shared outer (exact; "
               "inkling-lab convert does it); otherwise do not serve the adapter from a per-expert pool on "
               "sglang 0.5.23 (merge it into the base weights, or export shared outer factors).",
        upstream=f"{INKLING_LORA}: InklingBatchDenseMLPWithLoRA._forward_bf16_linearized, per-expert outer "
                 "branch (inkling_lab.upstream_defect reproduces it).",
        generation="inkling_lab (a warning: sglang 0.5.23's first wrapper generation raises nothing here and "
                   "computes a wrong gate/up delta)",
        consequence="sglang 0.5.23 loads it without an error and serves a wrong gate/up delta: the up half of "
                    "gate-up A is never read, and gate-up B's rows land on the wrong features; the down delta is "
                    "right",
        adapter_caused=True, related=("ISL-E015", "ISL-E003", "ISL-N001"), releases=EVERY_RELEASE),
    CatalogEntry(
        code="ISL-N001", title="identical per-expert outer factors, collapsed to shared outer", exc_type=None,
        kind="note",
        message="adapter {name}: {module}: its per-expert outer factors are the same for all {n} experts; "
                "collapsed to the shared outer layout (exact), which sglang 0.5.23 computes right",
        meaning="Every expert of this module has the same outer factors (gate-up A, down B): the adapter is the "
                "same adapter in the shared outer layout (O = 1), so the converter stores them once. The math "
                "is exactly the same, and it is the layout sglang 0.5.23 computes as intended; served per "
                "expert it would not be (ISL-W001).",
        when="A trainer that ties the outer factors of the shared experts but saves them once per expert.",
        setup="from inkling_lab.pool import collapse_pool_outer\n" + _SAME_OUTER,
        trigger="collapse_pool_outer([{'layer0': same}], ['tuned'], None)[1]  # the converter's step, and its note\n",
        fix="collapse_pool_outer([{'layer0': shared}], ['tuned'], None)[1]  # saved shared outer: nothing to collapse\n",
        remedy="none needed: the converter collapsed them",
        upstream=f"{INKLING_LORA}: InklingBatchDenseMLPWithLoRA._forward_bf16_linearized computes the shared outer "
                 "branch as intended and the per-expert outer branch wrongly (ISL-W001).",
        generation="inkling_lab convert (a note; nothing to fix)",
        consequence="served per expert, sglang 0.5.23 would compute a wrong gate/up delta (ISL-W001)",
        related=("ISL-W001",), releases=EVERY_RELEASE),
]
