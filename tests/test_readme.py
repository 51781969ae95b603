"""The README's code is a promise: its Python block runs, and its commands exist."""
import re
import subprocess
import sys
from pathlib import Path

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


def test_the_cli_commands_shown_exist():
    shown = set(re.findall(r"^inkling-lab (\w+)", README, flags=re.M))
    assert shown >= {"doctor", "convert", "explain", "profile"}
    for command in shown:
        done = subprocess.run([sys.executable, "-m", "inkling_lab.cli", command, "--help"],
                              capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr


def test_the_module_map_names_every_module_of_the_library():
    section = README.split("### The library, module by module", 1)[1].split("## Notes for contributors", 1)[0]
    named = set(re.findall(r"`([\w/]+(?:\.py|/))`", section))
    package = ROOT / "inkling_lab"
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    modules |= {p.name + "/" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert modules <= named, f"the README's module map misses {sorted(modules - named)}"
    assert named <= modules, f"the README's module map names modules that do not exist: {sorted(named - modules)}"
