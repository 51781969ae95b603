"""Profiling the batched forward: the roofline model, the benchmark grid, the side by
side with sglang's own paths, the graph check, and their JSON records (issues 4 and 15).

One module per part, each importable alone; this package's names are the whole of them:

* ``roofline_model``: the points (``Case``, a geometry plus ``T``; ``SHAPES``, the grids),
  the fewest bytes and FLOPs of one forward, the roofline, the targets, issue 4's
  upstream µs (``issue4_upstream``, read at the first call, never at import);
* ``timing``: the L2 flush, CUDA-graph and eager timing, the ceilings, host time;
* ``benchmark``: the correctness check, the grid per backend, kernel tables, the summary;
* ``side_by_side``: the kit against sglang 0.5.23's paths from its wheel (``--vs-upstream``);
* ``passes``: how two passes of the side by side agree (``--show FIRST --against SECOND``);
* ``graph_capture``: the user-level forward in a CUDA graph (``--graph-check``);
* ``host_phases``: a recorded run's host cost per call in the CPU's fast and slow phases (target 4);
* ``command``: ``inkling-lab profile`` (``register_cli``; ``python -m inkling_lab.profile``).

Every case's inputs come from the one seeded factory (``Case.scenario`` ->
``Scenario.random``) and every check is against the float64 reference backend
(``forward.reference``, on the device).
"""
from .benchmark import (Record, backend_runner, check_correctness, correctness_cases, grid, kernel_table,
                        load_record, run_grid, summary_table, time_case)
from .command import main, profile_command, register_cli
from .graph_capture import graph_check
from .host_phases import host_phase_rows, host_phase_table, phase_windows
from .passes import pass_agreement, pass_agreement_text
from .roofline_model import (GRID_RANKS, GRID_SLOTS, GRID_TOKENS, RECORD_FIELDS, SHAPES, SIDE_SHAPES, SIDE_TOKENS,
                             TARGET_LARGE_T, TARGET_SMALL_T, TARGET_VS_BASE_LARGE_T, UPSTREAM_ISSUE4, Case, Issue4,
                             Roofline, case_bytes, case_flops, issue4_upstream, roofline, target_ratio, upstream_us)
from .side_by_side import (BASE_SPREAD, KIT_VARIANTS, UPSTREAM_VARIANTS, base_outliers, kits, load_side_by_side,
                           run_side_by_side, side_by_side_case, side_by_side_cases, side_by_side_rows,
                           side_by_side_summary, side_by_side_table, side_by_side_variants, stream_ceiling_table)
from .timing import (L2Flush, capture, host_us, measure_ceilings, quantile, stats, time_eager, time_graph,
                     time_interleaved)

__all__ = [
    "Case", "Issue4", "Record", "Roofline", "L2Flush", "SHAPES", "RECORD_FIELDS", "GRID_RANKS", "GRID_SLOTS",
    "GRID_TOKENS", "SIDE_SHAPES", "SIDE_TOKENS", "TARGET_LARGE_T", "TARGET_SMALL_T", "TARGET_VS_BASE_LARGE_T",
    "UPSTREAM_ISSUE4", "UPSTREAM_VARIANTS",
    "case_bytes", "case_flops", "roofline", "target_ratio", "issue4_upstream", "upstream_us",
    "capture", "host_us", "measure_ceilings", "quantile", "stats", "time_eager", "time_graph", "time_interleaved",
    "backend_runner", "check_correctness", "correctness_cases", "grid", "kernel_table", "load_record", "run_grid",
    "summary_table", "time_case",
    "load_side_by_side", "run_side_by_side", "side_by_side_case", "side_by_side_cases", "side_by_side_rows",
    "side_by_side_summary", "side_by_side_table", "side_by_side_variants", "stream_ceiling_table", "KIT_VARIANTS",
    "kits", "base_outliers", "BASE_SPREAD",
    "pass_agreement", "pass_agreement_text", "graph_check", "host_phase_rows", "host_phase_table", "phase_windows",
    "main", "profile_command", "register_cli",
]
