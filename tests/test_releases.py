"""The release table and the catalog's ``releases``: checked against the wheels of the
local cache where they are there (the wheels, not the kit's reading, say which release
writes which message)."""
from __future__ import annotations

import ast
import zipfile

import pytest

from inkling_lab.catalog import ENTRIES, RELEASES, V2, find_in_line
from inkling_lab.releases import DEFAULT, FILES, TABLE, closest, release
from inkling_lab.selfcheck import cached_wheel, wheel_cache
from inkling_lab.upstream_wheel import record_of


def test_every_entry_says_in_which_releases_it_is_raised():
    missing = [e.code for e in ENTRIES if e.releases is None]
    assert not missing, f"catalog entries without releases: {missing}"
    for e in ENTRIES:
        assert set(e.releases) <= set(RELEASES), e.code
        if e.generation == V2:  # the second generation exists in 0.5.23 only
            assert e.releases == ("0.5.23",), e.code
        if not e.by_upstream:  # the kit's own words: it says them whichever release it models
            assert e.releases == RELEASES, e.code


def test_the_releases_know_their_generations_and_codes():
    assert list(TABLE) == list(RELEASES) and DEFAULT == RELEASES[-1]
    assert release().version == "0.5.23" and release("sglang==0.5.22").version == "0.5.22"
    assert release("0.5.23").has("v2") and not release("0.5.22").has("v2")
    assert release("0.5.23").raises_code("ISL-E006") and not release("0.5.22").raises_code("ISL-E006")
    assert all(release(v).raises_code("ISL-E001") for v in RELEASES)
    assert closest(dict(release("0.5.20").record)) == (release("0.5.20"), [])


@pytest.mark.parametrize("version", ["0.5.15", "0.4.9", "0.6.0", "latest"])
def test_an_unknown_or_older_release_is_refused_with_the_known_ones(version):
    with pytest.raises(ValueError) as info:
        release(version)
    assert ", ".join(RELEASES) in str(info.value)
    if version in ("0.5.15", "0.4.9"):
        assert "first appears in 0.5.16" in str(info.value)


def _strings(wheel) -> list[str]:
    """Every string constant of the wheel's LoRA and model-loader files, f-strings with
    their fields as ``{}`` (the words sglang can print)."""
    out = []
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.endswith(".py") and name.startswith(("sglang/srt/lora/", "sglang/srt/models/inkling_common/",
                                                           "sglang/srt/model_loader/")):
                for node in ast.walk(ast.parse(z.read(name))):
                    if isinstance(node, ast.JoinedStr):
                        out.append("".join(v.value if isinstance(v, ast.Constant) else "" for v in node.values))
                    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                        out.append(node.value)
    return out


def test_each_message_of_sglang_is_in_the_wheels_of_its_releases():
    wheels = {v: w for v in RELEASES if (w := cached_wheel(v))}
    if not wheels:
        pytest.skip(f"no sglang wheel in {wheel_cache()} ($INKLING_LAB_WHEELS)")
    words = {v: _strings(w) for v, w in wheels.items()}
    # Python's and torch's own words (no wheel holds them), and V2's pool-shape message,
    # whose text the first generation's message also matches
    not_by_text = {"ISL-E012", "ISL-E013", "ISL-E020", "ISL-E021", "ISL-E022", "ISL-E023", "ISL-E030"}
    for e in ENTRIES:
        if not e.by_upstream or e.code in not_by_text:
            continue
        literals = tuple(p for p in e._literals if p)
        found = {v for v, ws in words.items() if any(find_in_line(literals, w) for w in ws)}
        assert found == set(e.releases) & set(wheels), f"{e.code}: in the wheels of {sorted(found)}"


def test_the_record_hashes_are_the_wheels():
    wheels = {v: w for v in RELEASES if (w := cached_wheel(v))}
    if not wheels:
        pytest.skip(f"no sglang wheel in {wheel_cache()} ($INKLING_LAB_WHEELS)")
    for version, wheel in wheels.items():
        got = record_of(wheel, [f"sglang/{f}" for f in FILES])
        assert {f.removeprefix("sglang/"): h for f, h in got.items()} == TABLE[version].record, version


def test_the_recorded_run_covers_every_release_and_agrees_with_the_table():
    from pathlib import Path

    from inkling_lab.records import load_record

    record = load_record(Path(__file__).resolve().parents[1] / "data" / "releases" / "selfcheck.json",
                         required=("environment", "releases"))
    assert list(record["releases"]) == list(RELEASES)
    for version, run in record["releases"].items():
        assert run["agrees"] and run["known"], version
        assert run["areas"]["v2"]["status"] == ("agree" if TABLE[version].has("v2") else "absent"), version
        assert "record_selfcheck.py" in record["environment"]["command"]
