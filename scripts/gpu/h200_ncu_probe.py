"""Run the triton backend's forward a few times at two points, for `ncu` to profile
its kernels (KERNEL_NOTES.md: where the time goes). On the GPU machine:
  ncu --clock-control none --kernel-name regex:"up_kernel|down_kernel|shrink_kernel" \
      --launch-skip 9 --launch-count 6 --section SpeedOfLight --section Occupancy \
      --section LaunchStats --csv python3 scripts/gpu/h200_ncu_probe.py
"""
import torch

from inkling_lab import profile as pr
from inkling_lab.forward.triton_backend import launch, plan

for c in (pr.Case.of("A", 16, 4, 1), pr.Case.of("A", 64, 4, 8192)):
    sc = c.scenario("cuda")
    ops, x, gammas, batch = sc.operands(), sc.x, sc.gammas, sc.batch
    p = plan(ops, c.T, batch, x.device)
    for _ in range(4):
        launch(ops, x, gammas, p)
    torch.cuda.synchronize()
    print(c, "done", flush=True)
