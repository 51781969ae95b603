"""The side-by-side harness without a GPU: the wheel check, upstream's one-slot path
through the stand-in layer against the float64 reference, and the rows."""
import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from in_process import run_cli
from inkling_lab import profile as pr
from inkling_lab import records
from inkling_lab import upstream_wheel as uw
from inkling_lab.forward.reference import reference_forward
from inkling_lab.geometry import Geometry

REAL_WHEEL = Path("/work/upstream") / uw.WHEEL_NAME
SIDE_RECORD = Path(__file__).resolve().parents[1] / "data" / "profiles" / "h200_side_by_side.json"
H100_RECORD = SIDE_RECORD.with_name("h100_side_by_side.json")
"""The side by side on an H100 (2026-12-06), whose summaries KERNEL_NOTES carries beside the H200's."""


def _fake_wheel(path: Path, tamper: str | None = None) -> Path:
    lines = []
    with zipfile.ZipFile(path, "w") as z:
        for name in uw.FILES:
            data = f"# {name}\n".encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            z.writestr(name, data + (b"# changed\n" if name == tamper else b""))
            lines.append(f"{name},sha256={digest},{len(data)}")
        z.writestr(uw.RECORD_PATH, "\n".join(lines) + "\n")
    return path


def test_unpack_checks_every_file_against_record(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    prov = uw.unpack(_fake_wheel(tmp_path / "ok.whl"), tmp_path / "cache")
    assert sorted(prov["files_sha256_record"]) == sorted(uw.FILES)
    assert (tmp_path / "cache" / "sglang/srt/lora/utils.py").read_text().startswith("from dataclasses")
    bad = _fake_wheel(tmp_path / "bad.whl", tamper=uw.FILES[3])
    with pytest.raises(RuntimeError, match="does not match the wheel's RECORD"):
        uw.unpack(bad, tmp_path / "cache2")


def test_the_cut_wheel_holds_the_checked_files_and_unpacks_as_the_wheel_does(tmp_path, monkeypatch):
    """``scripts/gpu/cut_wheel.py`` (what the device calls carry instead of the 38 MB wheel): the cut zip holds
    ``FILES`` and ``RECORD`` alone, ``unpack`` finds the same files with the same RECORD hashes, and a wheel
    whose file does not match its RECORD is refused with nothing written."""
    from interpreted import gpu_script

    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    wheel = _fake_wheel(tmp_path / "ok.whl")
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("sglang/srt/models/other.py", b"# not read by the harness\n")
    with gpu_script("cut_wheel") as cw:
        out = cw.cut(wheel, tmp_path / "trim" / "cut.zip")
        with zipfile.ZipFile(out) as z:
            assert sorted(z.namelist()) == sorted([*uw.FILES, uw.RECORD_PATH])
        assert uw.unpack(out, tmp_path / "a")["files_sha256_record"] == uw.unpack(wheel, tmp_path / "b")["files_sha256_record"]
        assert cw.cut(wheel, tmp_path / "again.zip").read_bytes() == out.read_bytes()  # a record's sha256 can be remade
        with pytest.raises(RuntimeError, match="does not match the wheel's RECORD"):
            cw.cut(_fake_wheel(tmp_path / "bad.whl", tamper=uw.FILES[2]), tmp_path / "bad.zip")
        assert not (tmp_path / "bad.zip").exists()


def _case(S, T, outer=1, R=3):
    return pr.Case("toy", Geometry(2, 24, 10, R, S, outer), T, dtype="float32")


@pytest.mark.skipif(not REAL_WHEEL.exists(), reason="needs the sglang 0.5.23 wheel (pip download --no-deps)")
def test_upstream_one_slot_path_matches_the_reference(tmp_path):
    from inkling_lab.sink import swiglu_sink

    uw.unpack(REAL_WHEEL, tmp_path)
    sc = _case(1, 40).scenario("cpu")
    sink, x, g, batch = sc.sink, sc.x, sc.gammas, sc.batch
    up = uw.UpstreamSink(sink, batch)
    up.layer._swiglu = lambda y, gam: swiglu_sink(y, gam, True)  # upstream's activation needs CUDA
    ops = sink.operands()
    assert records.relative_error(up.forward(x, g), reference_forward(ops, x, g, batch), "fro") < 1e-5
    assert records.relative_error(up.forward(x, g, lora=False), reference_forward(ops, x, g, None), "fro") < 1e-5


def _point(T, kit, multi, base, one=None):
    c = pr.Case.of("A", 64, 1 if one else 4, T)
    roof = pr.roofline(c, 4.2, 780)
    times = {"kit_triton": kit, "sglang_multi": multi, "sglang_base": base}
    if one:
        times["sglang_one_slot"] = one
    return {"case": c.record(), "roofline_us": roof.us, "bound": roof.bound, "rel_err": {},
            "times": {"read": {k: {"median_us": v} for k, v in times.items()}}}


def test_side_by_side_rows_apply_issue_15_targets():
    rec = {"points": [_point(1, 10.0, 40.0, 12.0), _point(8192, 200.0, 500.0, 185.0, one=190.0)]}
    small, large = pr.side_by_side_rows(rec)
    assert small["best_upstream_us"] == 40.0 and small["targets"]["beats_base"]
    assert small["targets"]["roofline"] == (10.0 / small["roofline_us"] <= 3.0)
    assert large["best_upstream_us"] == 190.0 and not large["targets"]["beats_upstream"]
    assert large["targets"]["beats_base"]  # 200 <= 1.1 * 185
    table = pr.side_by_side_table(rec)
    assert "| A | 64 | 1 | 8192 | 200.0 | 500.0 | 190.0 | 185.0 |" in table and "beats_upstream" in table


def test_a_base_off_its_shapes_median_is_named_with_what_it_does_to_the_target():
    """sglang's base runs no LoRA, so its time at one shape and token count should not depend on R or S. Three 8-token
    points whose bases are 90, 91 and 98 µs (median 91): the slow one is named, and the kit's 95 µs, under it but over
    the median, is in its target by the base's time alone; three at 2048 tokens whose bases are 600, 660 and 662:
    the fast one's kit, 1.12x it but 1.02x the median, is out by the base alone; within the spread, nothing."""
    small = [_point(8, kit, 500.0, base) for kit, base in ((93.0, 90.0), (93.0, 91.0), (95.0, 98.0))]
    large = [_point(2048, kit, 5e3, base) for kit, base in ((672.0, 600.0), (700.0, 660.0), (700.0, 662.0))]
    text = pr.base_outliers({"points": small + large}).splitlines()
    assert len(text) == 2
    assert text[0].startswith("- A R64 S4 T8: sglang_base 98.0 µs, 1.077x the median of its shape and tokens "
                              "(91.0 µs over 3 points); kit_triton 0.969x it, 1.044x the median")
    assert text[0].endswith("(in its target by the base's time alone)")
    assert text[1].startswith("- A R64 S4 T2048: sglang_base 600.0 µs, 0.909x the median")
    assert text[1].endswith("(out of its target by the base's time alone)")
    assert pr.base_outliers({"points": small[:2] + large[1:]}) == "none"
    assert "by the base" not in pr.base_outliers({"points": small}, spread=0.0).split("\n")[0]  # 90 vs 91: no flip


def test_the_kept_kit_is_counted_on_its_own_points():
    """``kit_kept`` runs only where a pool can merge: its summary counts the points it ran at, and
    the default kit's counts stay the default kit's."""
    ran, skipped = _point(8192, 240.0, 500.0, 200.0, one=260.0), _point(8192, 300.0, 500.0, 200.0)
    ran["times"]["read"]["kit_kept"] = {"median_us": 205.0}
    rec = {"points": [ran, skipped]}
    assert pr.kits(rec) == ["kit_triton", "kit_kept"] and pr.kits({"points": [skipped]}) == ["kit_triton"]
    kept = pr.side_by_side_summary(rec, "read", "kit_kept")
    lo, hi = sorted(200.0 / p["roofline_us"] for p in (ran, skipped))  # the base over each point's roofline
    where = sum(b <= 1.2 for b in (lo, hi))
    assert f"| A | 1 | 1/1 | 0/0 | 0/0 | 0/1 | 0/{int(200.0 / ran['roofline_us'] <= 1.2)} | 1/1 |" in kept  # 205 <= 1.1 * 200
    assert f"| A | 2 | 2/2 | 0/0 | 0/0 | 0/2 | 0/{where} | 0/2 | {lo:.2f}-{hi:.2f} |" in pr.side_by_side_summary(rec, "read")


def test_target_3s_roofline_clause_counts_only_where_the_base_is_within_it():
    """Three points at 8192 tokens: the base within 1.2x of the roofline at two (the kit too at one of them),
    over it at the third (where the kit is within it, which the clause does not count); the last column is the
    base's own ratio over all three, each worked out here from the roofline the point carries."""
    pts = [_point(8192, 0.0, 1e4, 0.0) for _ in range(3)]
    roof = pts[0]["roofline_us"]
    for p, (kit, base) in zip(pts, ((1.1, 1.15), (1.3, 1.05), (1.1, 1.4))):
        p["times"]["read"]["kit_triton"]["median_us"] = kit * roof
        p["times"]["read"]["sglang_base"]["median_us"] = base * roof
    summary = pr.side_by_side_summary({"points": pts})
    assert "| A | 3 | 3/3 | 0/0 | 0/0 | 2/3 | 1/2 | 2/3 | 1.05-1.40 |" in summary
    assert "T>=2048 roofline where the base is" in summary.splitlines()[0]


@pytest.mark.skipif(not SIDE_RECORD.exists(), reason="no side-by-side record yet")
def test_the_recorded_side_by_side_is_complete():
    rec = pr.load_side_by_side(SIDE_RECORD)
    commit = rec["environment"]["git_commit"]  # the caller's INKLING_LAB_COMMIT: full, or abbreviated (v14's)
    assert rec["environment"]["device"] == "NVIDIA H200" and len(commit) >= 7 and int(commit, 16) >= 0
    assert set(rec["upstream"]["files_sha256_record"]) == set(uw.FILES)
    assert len(rec["points"]) == len(pr.side_by_side_cases())
    rows = pr.side_by_side_rows(rec)
    assert all(r["kit_us"] and r["sglang_multi_us"] and r["sglang_base_us"] for r in rows)
    assert all(max(p["rel_err"].values()) < 1e-2 for p in rec["points"])


@pytest.mark.skipif(not SIDE_RECORD.exists(), reason="no side-by-side record yet")
def test_kernel_notes_carry_the_generated_table():
    notes = (Path(__file__).resolve().parents[1] / "KERNEL_NOTES.md").read_text()
    rec = pr.load_side_by_side(SIDE_RECORD)
    assert pr.side_by_side_table(rec, "read") in notes
    assert pr.side_by_side_summary(rec, "read") in notes


def test_the_stream_ceiling_table_divides_the_ceiling_by_each_contenders_time():
    """Issue 26's fraction of the stream ceiling, on a record made here: the ceiling's µs over each
    contender's, min-max per shape at one token and at T <= 32 (the 2048-token point left out), a
    shape the ceiling record lacks left out, and the ceiling's lower-case shape names matched."""
    def point(shape, T, **us):
        return {"case": {"shape": shape, "T": T}, "times": {"read": {k: {"median_us": v} for k, v in us.items()}}}

    record = {"points": [point("A", 1, kit_triton=20.0, sglang_base=25.0),
                         point("A", 8, kit_triton=40.0, sglang_base=20.0),
                         point("A", 2048, kit_triton=1.0, sglang_base=1.0),
                         point("B", 1, kit_triton=5.0, sglang_base=5.0)]}
    ceiling = {"rows": [{"shape": "a", "us": {"stream": 10.0}}]}
    assert pr.stream_ceiling_table(record, ceiling).splitlines() == [
        "| shape | tokens | stream µs | kit_triton | sglang_base |", "|---|---|---|---|---|",
        "| A | T = 1 | 10.0 | 0.50-0.50 | 0.40-0.40 |",
        "| A | T <= 32 | 10.0 | 0.25-0.50 | 0.40-0.50 |"]


@pytest.mark.parametrize("card", ["h200", "h100"])
def test_kernel_notes_carry_each_cards_stream_ceiling_table(card):
    """The fraction KERNEL_NOTES quotes for each card's recorded side by side, from that card's own ceilings."""
    ceiling = {"h200": "h200_stream_ceiling.json", "h100": "h100_stream_ceiling_b.json"}[card]
    rec = pr.load_side_by_side(SIDE_RECORD.with_name(f"{card}_side_by_side.json"))
    stream = json.loads(SIDE_RECORD.with_name(ceiling).read_text())
    assert pr.stream_ceiling_table(rec, stream) in (Path(__file__).resolve().parents[1] / "KERNEL_NOTES.md").read_text()


@pytest.mark.skipif(not H100_RECORD.exists(), reason="no H100 side-by-side record")
def test_the_h100_record_is_complete_and_kernel_notes_carry_its_summaries():
    rec = pr.load_side_by_side(H100_RECORD)
    assert rec["environment"]["device"] == "NVIDIA H100 80GB HBM3"
    assert set(rec["upstream"]["files_sha256_record"]) == set(uw.FILES)
    assert len(rec["points"]) == len(pr.side_by_side_cases())
    assert all(max(p["rel_err"].values()) < 1e-2 for p in rec["points"])
    notes = (Path(__file__).resolve().parents[1] / "KERNEL_NOTES.md").read_text()
    for kit in ("kit_triton", "kit_kept"):
        for flush in ("read", "write"):
            assert pr.side_by_side_summary(rec, flush, kit) in notes, (kit, flush)
    second = pr.load_side_by_side(H100_RECORD.parent / "history" / "h100_side_by_side_2.json")
    for r in (rec, second):  # the base's outliers of both passes, as KERNEL_NOTES quotes them
        assert pr.base_outliers(r, "read") in notes
    shown = run_cli("profile", "--show", str(H100_RECORD))
    assert shown.returncode == 0 and pr.base_outliers(rec, "write", "kit_kept").encode() in shown.stdout
