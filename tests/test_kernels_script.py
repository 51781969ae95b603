"""``scripts/gpu/h200_kernels.py`` on the CPU (``interpreted.gpu_script``): the forward it profiles at a point is the
kit's routed forward, right against the float64 reference, and sglang's base is asked for without its adapter."""
import sys

from interpreted import gpu_script, import_interpreted
from inkling_lab import profile as pr, records
from inkling_lab.forward.reference import reference_forward


def test_a_point_profiles_the_routed_forward_its_launches_bare_and_the_base_without_lora(monkeypatch):
    tb = import_interpreted("inkling_lab.forward.kernels", "inkling_lab.forward.triton_backend")
    with gpu_script("h200_kernels") as module:
        sys.modules.pop("h200_pdl", None)  # the script's neighbour, imported with it: no other test sees it
        monkeypatch.setattr(module, "tb", tb)  # the backend interpreted, whatever imported the library first
        seen = {}

        class Base:  # sglang's base stands in as the sink's own base forward; the call's arguments are kept
            def __init__(self, sink, batch, min_slots):
                self.sink, seen["min_slots"] = sink, min_slots

            def forward(self, x, gammas, lora=True):
                seen["lora"] = lora
                return self.sink.base_forward(x, gammas)

        def rows(fn, top):  # the profiler needs CUDA: run the forward once and keep its output
            seen.setdefault("outs", []).append(fn().clone())
            return [{"kernel": "k", "calls_per_forward": 1.0, "us_per_forward": 1.0}]

        monkeypatch.setattr(module, "kernel_rows", rows)
        monkeypatch.setattr(pr.Case, "of", _toy_case())
        row = module.point(Base, "B", 16, 3, 40, device="cpu")
        assert row["plan"] == {"grouped": "", "single_slot": -1, "cats": False, "down_runs": False, "act_runs": False}
        assert seen["lora"] is False and seen["min_slots"] == 2
        sc = pr.Case.of("B", 16, 3, 40).scenario("cpu")
        ops = sc.sink.operands()
        kit, bare, base = seen["outs"]
        assert records.relative_error(kit, reference_forward(ops, sc.x, sc.gammas, sc.batch), "fro") < 1e-5
        for no_lora in (bare, base):  # the kit's own launches without an adapter, and sglang's base
            assert records.relative_error(no_lora, reference_forward(ops, sc.x, sc.gammas, None), "fro") < 1e-5
        assert set(row) == {"shape", "R", "S", "T", "plan", "kit", "kit_bare", "sglang_base"}
        assert module.points("") == module.POINTS
        assert module.points("A:16:1:8,Inkling-TP8:64:8:32") == [("A", 16, 1, 8), ("Inkling-TP8", 64, 8, 32)]


def _toy_case():
    """``Case.of`` at a toy geometry in float32 (the interpreter's sizes), the same one every call."""
    from inkling_lab.geometry import Geometry

    def of(shape, R, S, T, **kw):
        return pr.Case("toy", Geometry(2, 24, 10, 4, S, 1), T, dtype="float32")
    return staticmethod(of)
