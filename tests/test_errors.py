"""The catalog is closed and complete (in the spirit of rustc's error index):
every entry's trigger raises exactly its error through the library, every fix runs
clean, every message is recognised by ``explain``, and notebook 03 walks every code."""
import json
import re
from pathlib import Path

import pytest

import inkling_lab as il
from inkling_lab.errors import CATALOG, NoCatalogEntry, demonstrate, expect_error, find_entry, format_traceback

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("code", sorted(CATALOG))
def test_trigger_raises_exactly_its_error_and_the_fix_runs(code, capsys):
    demonstrate(code, show=True)
    out = capsys.readouterr().out
    entry = CATALOG[code]
    if not entry.reproduced:
        shown = f"{entry.generation} says:"
    elif entry.kind in ("finding", "note"):
        shown = f"✓ reported as expected: {code}"
    else:
        shown = f"✓ raised as expected: {code}"
    assert shown in out and "✓ the fix runs clean" in out


@pytest.mark.parametrize("code", sorted(CATALOG))
def test_the_error_comes_from_the_library(code):
    entry = CATALOG[code]
    if entry.kind in ("finding", "note") or (not entry.reproduced and not entry.kit_code):
        pytest.skip("raises nothing: findings, notes and messages the kit does not write")
    with expect_error(entry.kit_code or code, show=False) as caught:
        exec(entry.trigger_source(), {})
    if caught.exception is not None:  # warnings carry no traceback
        frames = [f.filename for f in __import__("traceback").extract_tb(caught.exception.__traceback__)]
        assert any("inkling_lab" in f for f in frames), f"{code} was raised outside the library: {frames}"


@pytest.mark.parametrize("code", sorted(CATALOG))
def test_entries_are_complete_and_explain_finds_them(code):
    e = CATALOG[code]
    assert re.fullmatch(r"ISL-[EKWDN]\d{3}", code)
    assert all([e.title, e.message, e.meaning, e.when, e.trigger, e.fix, e.remedy, e.upstream, e.generation]), code
    assert all(r in CATALOG for r in e.related), f"{code} relates to unknown codes {e.related}"
    assert il.explain(code) is e
    assert code in e.explain() and e.meaning.split()[0] in e.explain()


def test_explain_reads_pasted_tracebacks_and_exceptions():
    pasted = """Traceback (most recent call last):
  File "/srv/sglang/python/sglang/srt/models/inkling_common/lora.py", line 412, in set_lora_info
    raise ValueError(
ValueError: Inkling shared-sink LoRA outer factors must have expert dimension 1 or 4
[2026-11-29 10:00:01] Scheduler hit an exception"""
    assert il.explain(pasted).code == "ISL-E002"
    assert il.explain(ValueError("Inkling shared-sink LoRA requires four 4D MoE buffers")).code == "ISL-E001"
    assert il.explain("IndexError: Shared-sink LoRA slot out of range: [-1, 0, 2, 7]").code == "ISL-E008"
    assert il.explain("RuntimeError: shape '[2, 3, 4]' is invalid for input of size 26").code == "ISL-E012"


def test_explain_without_a_match_says_so_and_suggests():
    with pytest.raises(NoCatalogEntry, match="no catalog entry matches 'Inkling shared-sink LoRA rank dims"):
        il.explain("Inkling shared-sink LoRA rank dims do not agree")
    with pytest.raises(NoCatalogEntry, match="closest: ISL-E005") as caught:
        il.explain("Inkling shared-sink LoRA rank dimensions do not agree")
    assert 1 <= len(caught.value.closest) <= 3 and "'rank'" in caught.value.closest[0][1]
    assert "inkling-lab explain --list" in str(caught.value)
    assert find_entry("nothing like it") is None


@pytest.mark.parametrize("code", ["ISL-E005", "isl-e005", "Isl-E005", "E005", "e005", " isl-e005 "])
def test_explain_finds_a_code_in_any_case(code):
    assert il.explain(code).code == "ISL-E005"


def test_explain_finds_an_unambiguous_fragment_of_a_message():
    assert il.explain("requires four 4D").code == "ISL-E001"
    assert il.explain("REQUIRES   four 4d moe").code == "ISL-E001"
    assert il.explain("must select contiguous W13").code == "ISL-E019"
    # a fragment several messages hold names them as the closest, not one at random
    with pytest.raises(NoCatalogEntry) as caught:
        il.explain("does not match")
    holding = [entry.code for entry, _ in caught.value.closest]
    assert len(holding) >= 2 and all("does not match" in il.CATALOG[c].message for c in holding)
    assert all("its message holds" in why for _, why in caught.value.closest)
    with pytest.raises(NoCatalogEntry):
        il.explain("LoRA")  # too short to name anything


@pytest.mark.parametrize("text", ["CUDA out of memory. Tried to allocate 2.00 GiB",
                                  "RuntimeError: CUDA error: out of shared memory", "something unrelated"])
def test_explain_says_an_unrelated_message_is_no_shared_sink_error_and_suggests_nothing(text):
    with pytest.raises(NoCatalogEntry, match="is not a shared-sink LoRA error") as caught:
        il.explain(text)
    assert caught.value.closest == []


def test_a_traceback_through_sglangs_lora_code_is_about_the_sink_even_when_its_line_is_generic():
    pasted = ('Traceback (most recent call last):\n  File "sglang/srt/lora/lora_manager.py", line 9, in load\n'
              "ZeroDivisionError: division by zero")
    with pytest.raises(NoCatalogEntry, match="no catalog entry matches 'ZeroDivisionError"):
        il.explain(pasted)


def test_expect_error_fails_when_nothing_or_something_else_is_raised():
    with pytest.raises(AssertionError, match="expected ISL-E001 .* but nothing was raised"):
        with expect_error("ISL-E001", show=False):
            pass
    with pytest.raises(AssertionError, match=r"expected ISL-E001 .* but got ValueError: .*\[ISL-E004\]"):
        with expect_error("ISL-E001", show=False):
            raise ValueError("Inkling shared-sink LoRA expert count does not match")
    with pytest.raises(AssertionError, match=r"\[not in the catalog\]"):
        with expect_error("ISL-E001", show=False):
            raise ValueError("something else")
    with pytest.raises(AssertionError, match="but got IndexError"):  # right words, wrong type
        with expect_error("ISL-E001", show=False):
            raise IndexError("Inkling shared-sink LoRA requires four 4D MoE buffers")
    with pytest.raises(KeyError, match="unknown catalog code"):
        expect_error("ISL-E999")


def test_tracebacks_show_no_machine_paths():
    try:
        il.SharedSinkLoRA(2, 8, 6).set_lora_info(*il.LoRAPool(2, 8, 6, 1, 4).buffers()[:3], None)
    except Exception as exc:  # noqa: BLE001 - any failure will do
        text = format_traceback(exc)
    assert "/work/" not in text and "/tmp/" not in text and str(ROOT) not in text
    assert 'File "inkling_lab/' in text


def test_notebook_03_walks_every_code():
    cells = [c for path in sorted((ROOT / "notebooks" / "03_errors").glob("*.ipynb"))
             for c in json.loads(path.read_text())["cells"]]
    shown = "".join("".join(o.get("text", "")) for c in cells if c["cell_type"] == "code"
                    for o in c.get("outputs", []))
    markers = {code: (f"✓ raised as expected: {code}", f"✓ reported as expected: {code}", f"explain({code!r})")
               for code in CATALOG}
    missing = [code for code in CATALOG if not any(m in shown for m in markers[code])]
    assert not missing, f"notebook 03 does not demonstrate {missing}: re-run it"


def test_expect_finding_fails_when_the_finding_is_not_reported():
    from inkling_lab.errors import expect_finding

    good = il.diagnose_pool((1, 1, 8, 8), (1, 2, 12, 4), (1, 2, 4, 6), (1, 1, 8, 4), n_shared_experts=2)
    with pytest.raises(AssertionError, match="expected finding ISL-D103 .* reports nothing"):
        expect_finding("ISL-D103", good, show=False)
    odd = il.diagnose_pool((1, 1, 8, 8), (1, 2, 11, 4), (1, 2, 4, 6), (1, 1, 8, 4), n_shared_experts=2)
    assert expect_finding("ISL-D103", odd, show=False) is odd
