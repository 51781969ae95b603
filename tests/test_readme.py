"""The README's code is a promise: its Python block runs, and its commands exist."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_python_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    assert "✓ raised as expected: ISL-E005" in capsys.readouterr().out


def test_the_two_commands_are_the_makefile_and_ci():
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    assert "make lab" in quick and "make test" in quick
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lab: setup$", makefile, flags=re.M) and re.search(r"^test: setup$", makefile, flags=re.M)
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("make test")


def test_the_cli_commands_shown_exist(capsys):
    # In process, through the command's own parser (the console script itself runs in
    # tests/test_cli.py): one subprocess per command cost a torch import each.
    from inkling_lab.cli import build_parser

    shown = set(re.findall(r"^inkling-lab (\w+)", README, flags=re.M))
    assert shown >= {"doctor", "convert", "explain", "profile"}
    for command in shown:
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([command, "--help"])
        assert done.value.code == 0, capsys.readouterr().err
        assert f"usage: inkling-lab {command}" in capsys.readouterr().out


def test_the_module_map_names_every_module_of_the_library():
    section = README.split("### The library, module by module", 1)[1].split("## Notes for contributors", 1)[0]
    named = set(re.findall(r"`([\w/]+(?:\.py|/))`", section))
    package = ROOT / "inkling_lab"
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    modules |= {p.name + "/" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert modules <= named, f"the README's module map misses {sorted(modules - named)}"
    assert named <= modules, f"the README's module map names modules that do not exist: {sorted(named - modules)}"
