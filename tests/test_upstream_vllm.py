"""``upstream_vllm``: vLLM's files come out of its wheel only where the wheel's RECORD vouches
for them, travel with a provenance that ``load`` checks again, and (with the real wheel here,
``pip download --no-deps vllm==0.33.0 -d /work/wheels``) its punica ops driving the shared
sink compute the float64 reference's forward: fp16 under Triton's interpreter (bf16 is wrong
there, SPEC §9), both gate/up layouts, mixed, base-only and rank-0 tokens."""
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from interpreted import interpreter_on, without_overflow_checks
from inkling_lab import upstream_vllm as uv
from inkling_lab.forward.reference import reference_forward
from inkling_lab.geometry import Geometry
from inkling_lab.records import relative_error
from inkling_lab.scenario import Scenario
from inkling_lab.batch import SlotBatch
from inkling_lab.upstream_wheel import record_digest

REAL_WHEEL = Path("/work/wheels/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl")


def _fake_wheel(path: Path, tamper: str | None = None) -> Path:
    lines = []
    with zipfile.ZipFile(path, "w") as z:
        for name in uv.FILES:
            data = f"# {name}\n".encode()
            z.writestr(name, data + (b"# changed\n" if name == tamper else b""))
            lines.append(f"{name},sha256={record_digest(data)},{len(data)}")
        z.writestr("vllm-0.33.0.dist-info/RECORD", "\n".join(lines) + "\n")
    return path


def test_extract_checks_every_file_against_record_and_load_checks_them_again(tmp_path):
    prov = uv.extract(_fake_wheel(tmp_path / "ok.whl"), tmp_path / "files")
    assert sorted(prov["files_sha256_record"]) == sorted(uv.FILES)
    assert (tmp_path / "files" / "vllm/envs.py").read_text().count("= False") == 3  # vLLM's defaults
    with pytest.raises(RuntimeError, match="does not match the wheel's RECORD"):
        uv.extract(_fake_wheel(tmp_path / "bad.whl", tamper=uv.FILES[1]), tmp_path / "files2")
    (tmp_path / "files" / uv.FILES[0]).write_text("# edited after extraction\n")
    with pytest.raises(RuntimeError, match="is not the wheel's file"):
        uv.load(tmp_path / "files")


@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> Path:
    """The wheel's files, taken out once (the wheel's sha256 reads its 336 MB) for both layouts."""
    dest = tmp_path_factory.mktemp("vllm")
    uv.extract(REAL_WHEEL, dest)
    return dest


@pytest.mark.slow
@pytest.mark.skipif(not REAL_WHEEL.exists(), reason="needs the vllm 0.33.0 wheel (pip download --no-deps)")
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
def test_vllm_punica_forward_matches_the_reference(extracted, monkeypatch, interleaved):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))  # the stub platform asks
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    try:
        with interpreter_on(), without_overflow_checks():
            for k in saved:
                del sys.modules[k]
            uv.load(extracted)
            g = Geometry(n=2, hidden=64, intermediate=32, max_rank=16, slots=3, outer=1)
            sc = Scenario.random(g, tokens=7, seed=3, dtype=torch.float16, interleaved=interleaved,
                                 token_slots=[0, 0, 1, -1, 2, 2, 1])
            batch = SlotBatch.from_token_slots([0, 0, 1, -1, 2, 2, 1], 3, lora_ranks=[16, 0, 16])  # slot 1: rank 0
            out = uv.VllmSink(sc.sink, batch).forward(sc.x, sc.gammas)
    finally:
        sys.path.remove(str(extracted))
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    ops = sc.sink.operands()
    ref = reference_forward(ops, sc.x, sc.gammas, batch)
    assert relative_error(out, ref, "fro") < 2e-3
    assert relative_error(reference_forward(ops, sc.x, sc.gammas, None), ref, "fro") > 0.05  # the LoRA matters
