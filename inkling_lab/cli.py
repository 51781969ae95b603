"""The ``inkling-lab`` command: ``doctor``, ``compare``, ``convert``, ``export``, ``explain``,
``selfcheck`` (and ``profile`` where the profiling module is installed). A thin front over the library:
every answer comes from ``inkling_lab.doctor``, ``inkling_lab.compare``,
``inkling_lab.convert``, ``inkling_lab.export`` and ``inkling_lab.errors``.

Exit status: 0 done; 1 sglang 0.5.23 would fail to load the adapter or serve something
other than its math (doctor, compare), the conversion or export was refused, or no catalog entry
matched; 2 a usage error.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Sequence, TextIO

import torch

from .errors import NoCatalogEntry, explain, find_entry, read_pasted
from .geometry import check_seed

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}

_SINK_HELP = ("the model the adapter is for, from its config.json: --n-shared-experts "
              "(n_shared_experts), --hidden (hidden_size) and --intermediate (the intermediate size of one "
              "shared expert, before tensor parallelism)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {value}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    try:
        return check_seed("the seed", value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_sink_args(p: argparse.ArgumentParser, required: bool, pool: bool = True) -> None:
    """The sink's sizes; ``pool``: also the pool's max rank and the TP size (compare has
    neither: it compares at each adapter's own rank, unsharded, and so takes no such flag
    rather than ignore it)."""
    g = p.add_argument_group("the sink", _SINK_HELP)
    g.add_argument("--n-shared-experts", "-n", type=_positive, required=True, metavar="N",
                   help="number of shared experts n")
    g.add_argument("--hidden", type=_positive, required=required, metavar="H", help="hidden size H"
                   + ("" if required else " (default: the adapter's)"))
    g.add_argument("--intermediate", type=_positive, required=required, metavar="F",
                   help="intermediate size F of one expert" + ("" if required else " (default: the adapter's)"))
    if not pool:
        return
    g.add_argument("--max-rank", type=_positive, metavar="R",
                   help="the pool's max LoRA rank, sglang's --max-lora-rank (default: the largest adapter rank)")
    g.add_argument("--tp", type=_positive, default=1, metavar="T",
                   help="tensor-parallel size: each rank holds F/T features of every expert (default 1)")


def _json(record: dict) -> str:
    """A report as valid JSON: a NaN or infinity is ``null`` with a ``..._not_finite`` field
    saying what it was (``records.json_ready``), never the bare ``NaN`` no JSON reader takes."""
    from .records import json_ready

    return json.dumps(json_ready(record), indent=2, allow_nan=False)


def _fail(command: str, exc: BaseException) -> int:
    """A refused command: the error, its notes and where to read more, on stderr."""
    print(f"inkling-lab {command}: {type(exc).__name__}: {exc}", file=sys.stderr)
    for note in getattr(exc, "__notes__", []):
        print(f"  {note}", file=sys.stderr)
    entry = find_entry(exc)
    if entry is not None:
        print(f"  more: inkling-lab explain {entry.code}  ({entry.title})", file=sys.stderr)
    return 1


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor

    try:  # the doctor reports on any adapter; arguments it cannot take (sizes past any model) are refused
        report = doctor(args.adapter, args.n_shared_experts, args.hidden, args.intermediate,
                        max_rank=args.max_rank, tp=args.tp, target_modules=args.lora_target_modules,
                        repair=args.repair, hidden_act=args.hidden_act, config=args.config, sglang=args.sglang)
    except (ValueError, TypeError, OSError, MemoryError) as exc:
        return _fail("doctor", exc)
    print(_json(report.to_dict()) if args.json else report)
    return report.exit_status


def _compare(args: argparse.Namespace) -> int:
    from .compare import compare

    try:
        report = compare(args.adapters, args.n_shared_experts, args.hidden, args.intermediate,
                         target_modules=args.lora_target_modules, repair=args.repair, tokens=args.tokens,
                         seed=args.seed, sglang=args.sglang)
    except (ValueError, TypeError, OSError, MemoryError) as exc:  # sizes past any model (ISL-K162, K163)
        return _fail("compare", exc)
    print(_json(report.to_dict()) if args.json else report)
    return 0 if report.agree else 1


def _add_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora-target-modules", nargs="+", metavar="MODULE",
                   help="the server's --lora-target-modules (default: the adapter's own target_modules); the sink "
                        "is wrapped only when they hold gate_up_proj and down_proj")
    p.add_argument("--repair", action="store_true",
                   help="let the converter make repairs that guess (a folded down A, a rank read from the factors); "
                        "the report says what was assumed")
    p.add_argument("--json", action="store_true", help="print the report as JSON, for scripts")
    _add_release_arg(p)


def _add_activation_args(p: argparse.ArgumentParser, other: str) -> None:
    from .sink import ACTIVATIONS

    p.add_argument("--hidden-act", default=None, choices=sorted(ACTIVATIONS), metavar="ACT",
                   help=f"the model's config.hidden_act ({other}); default: read from --config, else from a "
                        "config.json in the adapter folder or of the local base model its adapter_config.json "
                        "names, else silu (the report says where it came from)")
    p.add_argument("--config", metavar="CONFIG_JSON",
                   help="the base model's config.json (or its folder), read for hidden_act")


def _release(text: str) -> str:
    from .releases import release

    try:
        return release(text).version
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_release_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sglang", type=_release, default="0.5.23", metavar="VERSION",
                   help="the sglang release the server runs, 0.5.16 ... 0.5.23 (default 0.5.23): the verdicts are "
                        "that release's, and the first line names it")


def _convert(args: argparse.Namespace) -> int:
    from .adapters import load_adapter
    from .convert import convert_to_file
    from .doctor import serving_findings

    outer = {"auto": None, "shared": 1, "per-expert": args.n_shared_experts}[args.outer]
    try:
        adapters = [load_adapter(path) for path in args.adapters]
        pool = convert_to_file(adapters, args.output, args.n_shared_experts, force=args.force, hidden=args.hidden,
                               intermediate=args.intermediate, max_rank=args.max_rank, outer=outer,
                               tp_rank=args.tp_rank, tp_size=args.tp,
                               dtype=DTYPES[args.dtype] if args.dtype else None,
                               progress=False if args.quiet else None)
        written = args.output
        # the converter writes the adapters' math; what sglang 0.5.23 would serve instead is the doctor's to say
        findings = pool.findings + serving_findings(adapters, pool)
    except (OSError, ValueError, RuntimeError, AssertionError, MemoryError) as exc:
        return _fail("convert", exc)
    if args.json:
        print(_json({"output": str(written), **pool.summary(), "inferred": pool.inferred,
                     "findings": [asdict(f) for f in findings]}))
        return 0
    print(f"wrote {written}: {pool!r}")
    for said in pool.inferred:
        print(f"  inferred {said}")
    for s in pool.slots:
        print(f"  slot {s.slot}: {s.adapter} (r={s.rank}, scaling {s.scaling:g} folded into B, "
              f"sha256 {s.sha256[:12]}…)")
    for f in findings:
        print(f)
    return 0


def _export(args: argparse.Namespace) -> int:
    from .export import export_for_sglang

    try:  # the refusals of its arguments (a size past any model); the adapter's own are in the report
        report = export_for_sglang(args.adapter, args.output, args.n_shared_experts, hidden=args.hidden,
                                   intermediate=args.intermediate, tp=args.tp, force=args.force,
                                   progress=False if args.quiet else None, sglang=args.sglang,
                                   hidden_act=args.hidden_act, config=args.config)
    except (ValueError, TypeError) as exc:
        return _fail("export", exc)
    if args.json:
        print(_json(report.to_dict()))
    elif report.written:
        print(report)
    else:
        print(report, file=sys.stderr)
    return report.exit_status


def _explain(args: argparse.Namespace) -> int:
    from .catalog import CATALOG

    if args.list:
        for entry in CATALOG.values():
            print(f"{entry.code}  {entry.title}")
        return 0
    if not args.message:
        print("inkling-lab explain: give an error message, a code such as ISL-E001, - to read stdin, "
              "or --list", file=sys.stderr)
        return 2
    text, note = read_pasted(sys.stdin) if args.message == ["-"] else (" ".join(args.message), "")
    if note:
        print(f"inkling-lab explain: {note}", file=sys.stderr)
    try:
        entry = explain(text)
    except NoCatalogEntry as exc:
        print(f"inkling-lab explain: {exc.headline}", file=sys.stderr)
        if exc.closest:
            print("  closest:", file=sys.stderr)
            for entry, why in exc.closest:
                print(f"    {entry.code}  {entry.title} ({why})", file=sys.stderr)
            print("  paste the whole error line (type and message), a traceback (inkling-lab explain - < log.txt) "
                  "or a code", file=sys.stderr)
        print("  every entry: inkling-lab explain --list", file=sys.stderr)
        return 1
    from .releases import raised_line

    print(raised_line(entry, args.sglang))
    print(entry.explain())
    return 0


def _selfcheck(args: argparse.Namespace) -> int:
    from .selfcheck import download, selfcheck, wheel_cache

    cache = args.cache or wheel_cache()
    try:
        wheel = download(args.download, cache) if args.download else args.wheel
        report = selfcheck(wheel, cases=args.cases, seed=args.seed)
    except (OSError, ValueError, RuntimeError, subprocess.CalledProcessError, zipfile.BadZipFile) as exc:
        return _fail("selfcheck", exc)
    print(_json(report.to_dict()) if args.json else report)
    return report.exit_status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inkling-lab",
        description="Check, convert and explain LoRA adapters for the shared-expert sink of Inkling models "
                    "served by sglang 0.5.23.",
        epilog="Start with: inkling-lab doctor ADAPTER_FOLDER -n 2 --hidden 4096 --intermediate 2048")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    p = sub.add_parser(
        "doctor", help="what sglang 0.5.23 does with this adapter: loads/raises, what it computes, what "
                       "the converter writes",
        description="Walk a PEFT adapter down sglang 0.5.23's loading path for the sink you give (read, "
                    "normalize, target modules, shard, pool, set_lora_info, forward) and give three verdicts: "
                    "whether sglang loads it (or the exact error, after the exact warning it logs for weights "
                    "that match no target module), "
                    "whether it then computes the adapter's math (or what else, and why), and what "
                    "inkling-lab convert writes. Every finding with its fix. Exit status 1 when sglang would "
                    "fail or serve something other than the adapter's math.")
    p.add_argument("adapter", metavar="ADAPTER", help="a PEFT adapter folder (adapter_config.json + "
                   "adapter_model.safetensors)")
    _add_sink_args(p, required=True)
    _add_server_args(p)
    _add_activation_args(p, "another is ISL-W113: sglang's sink computes SiLU")
    p.set_defaults(func=_doctor)

    p = sub.add_parser(
        "compare", help="PEFT's math, what sglang 0.5.23 serves and the kit's pool, side by side",
        description="For a seeded random batch on a seeded random sink, each shared expert's LoRA delta three "
                    "ways (float64): PEFT's merged weights computed by PEFT itself (the kit's reading where PEFT is "
                    "absent, and it says so), as sglang 0.5.23 serves it, and "
                    "from the pool inkling-lab convert writes. Reports, per module, slot and expert, the "
                    "mismatched elements and the greatest absolute and relative difference, where, and the cause. "
                    "Exit status 1 unless all three agree.")
    p.add_argument("adapters", nargs="+", metavar="ADAPTER", help="PEFT adapter folders, one per slot")
    _add_sink_args(p, required=True, pool=False)
    _add_server_args(p)
    p.add_argument("--tokens", type=_positive, default=8, metavar="T", help="tokens in the batch (default 8)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the sink and the batch (default 0)")
    p.set_defaults(func=_compare)

    p = sub.add_parser(
        "convert", help="re-export adapters as the four pool buffers (one slot each), in one safetensors file",
        description="The multi-slot dense converter: slot i holds the i-th adapter; per shared-sink module "
                    "the four 4D buffers gate_up_a [S, O, 2R, H], gate_up_b [S, n, 2F, R], down_a "
                    "[S, n, R, F], down_b [S, O, H, R], ranks padded to R, scaling folded into B. Repairs "
                    "where the intent is plain (each reported), refuses the rest with the reason. Writes "
                    "atomically, never over an input; refuses to replace OUT without --force.")
    p.add_argument("adapters", nargs="+", metavar="ADAPTER", help="PEFT adapter folders, one per slot")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the .safetensors file to write")
    _add_sink_args(p, required=False)
    p.add_argument("--tp-rank", type=int, default=0, metavar="K",
                   help="write tensor-parallel rank K's shard, 0..T-1 (default 0)")
    p.add_argument("--outer", choices=("auto", "shared", "per-expert"), default="auto",
                   help="outer layout: shared (O=1) or per expert (O=n); auto: shared when every adapter's is")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="buffer dtype (default: the adapters' own, lossless); B is scaled in the adapters' dtype, "
                        "then cast, as sglang does")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=_convert)

    p = sub.add_parser(
        "export", help="the cure: re-write an adapter as a PEFT folder sglang 0.5.23 serves as trained, proven",
        description="Write OUT, a PEFT adapter folder that sglang 0.5.23 loads and serves as exactly the "
                    "adapter's math: each projection's PEFT scaling folded into lora_B (rsLoRA, alpha_pattern, "
                    "rank_pattern), per-expert outer factors (PEFT target_parameters exports) re-expressed as "
                    "shared outer at rank n*r, one r for the file, the names and target_modules sglang maps to "
                    "the shared sink; other modules' LoRA kept with the same math. The output is read back "
                    "through the kit's model of sglang's loading path and compared with PEFT's delta before it "
                    "gets its name; a refusal (exit status 1) leaves nothing behind. Prints the server flags "
                    "it needs and the TP sizes it can be served at.")
    p.add_argument("adapter", metavar="ADAPTER", help="a PEFT adapter folder (adapter_config.json + "
                   "adapter_model.safetensors)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the adapter folder to write")
    g = p.add_argument_group("the sink", _SINK_HELP)
    g.add_argument("--n-shared-experts", "-n", type=_positive, required=True, metavar="N",
                   help="number of shared experts n")
    g.add_argument("--hidden", type=_positive, metavar="H", help="hidden size H (default: the adapter's)")
    g.add_argument("--intermediate", type=_positive, metavar="F",
                   help="intermediate size F of one expert (default: the adapter's)")
    g.add_argument("--tp", type=_positive, default=1, metavar="T",
                   help="the server's tensor-parallel size, checked to split F (default 1)")
    _add_activation_args(p, "another is refused, ISL-K507: sglang's sink computes SiLU")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_release_arg(p)
    p.set_defaults(func=_export)

    p = sub.add_parser(
        "explain", help="the catalog entry for an error message, a pasted traceback or a code",
        description="Find the catalog entry for an error of the shared-sink LoRA path: what it means, when it "
                    "happens, a minimal example and its fix. Exit status 1 when nothing matches.")
    p.add_argument("message", nargs="*", metavar="MESSAGE",
                   help="the error text (quote it) or a fragment of it, a code such as ISL-E005 (any case), "
                        "or - to read stdin")
    p.add_argument("--list", action="store_true", help="list every catalog entry, code and title")
    _add_release_arg(p)
    p.set_defaults(func=_explain)

    p = sub.add_parser(
        "selfcheck", help="the kit against the code inside an sglang wheel (on a CPU, sglang not imported)",
        description="Read an sglang wheel as a zip (every file checked against its RECORD), take out its "
                    "shared-sink LoRA wrappers, adapter normalization, tensor-parallel slicing and target-module "
                    "normalization with ast, run them on stand-ins and compare them with the kit on seeded "
                    "generated cases. Prints agree/disagree per area with the first disagreement, and whether "
                    "the release table knows the wheel (else which files differ from the closest release). "
                    "Exit status 0 only when every area agrees.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--wheel", metavar="PATH", help="an sglang wheel (pip download --no-deps sglang==0.5.X)")
    src.add_argument("--download", metavar="VERSION",
                     help="fetch sglang VERSION's wheel into the cache once (pip download), then check it")
    p.add_argument("--cache", type=Path, metavar="DIR",
                   help="the wheel cache (default: $INKLING_LAB_WHEELS, else ~/.cache/inkling-lab/wheels)")
    p.add_argument("--cases", type=_positive, default=300, metavar="N", help="generated cases per area (default 300)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the generated cases (default 0)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_selfcheck)

    # The profiling command ships with its own module; offer it where that module is installed.
    if importlib.util.find_spec("inkling_lab.profile") is not None:
        importlib.import_module("inkling_lab.profile").register_cli(sub)
    return parser


_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\udc80-\udcff]")


def _escape(m: re.Match) -> str:
    c = m.group()
    if c == "\r" and m.start() == 0:
        return c
    if "\udc80" <= c <= "\udcff":  # a byte of a file name that is not UTF-8 (surrogateescape)
        return f"\\x{ord(c) - 0xDC00:02x}"
    return c.encode("unicode_escape").decode("ascii")


def printable(text: str, encoding: str | None = "utf-8") -> str:
    """``text`` safe for a terminal: control characters (terminal escape sequences such as
    ``\\x1b]0;title\\x07``), bidirectional overrides and the undecodable bytes of file
    names as backslash escapes; newlines and tabs kept; anything ``encoding`` cannot
    encode as a backslash escape. A ``\\r`` is kept only at the start (a progress bar
    redrawing its line)."""
    text = _UNSAFE.sub(_escape, text)
    if encoding:
        text = text.encode(encoding, "backslashreplace").decode(encoding)
    return text


_BREAKS = ("\n", "\t")
"""What ``printable`` keeps (the report's own lines and columns), but a name must not carry."""


def _names(args: argparse.Namespace) -> list[str]:
    """The names the command was given (its path arguments, each component) and those it
    reads (the entries of the folders given), where they hold a newline or a tab: printed
    as they are, a name ``x\nExit status 0`` would forge a line of the report."""
    paths = []
    for attr in ("adapter", "adapters", "output", "wheel", "cache"):
        value = getattr(args, attr, None)
        paths += [str(v) for v in (value if isinstance(value, list) else [value]) if v is not None]
    names = set()
    for path in paths:
        names.update([path, *Path(path).parts])
        try:
            with os.scandir(path) as entries:  # a folder's own files, as far as a few thousand go
                names.update(e.name for _, e in zip(range(4096), entries))
        except OSError:
            pass  # not a folder the kit can list: nothing more is named from it
    # as Python holds it (undecodable bytes as surrogates) and as a library decoding the bytes writes it (U+FFFD)
    names |= {os.fsencode(n).decode("utf-8", "replace") for n in names}
    return sorted((n for n in names if any(b in n for b in _BREAKS) and n.strip()), key=len, reverse=True)


def _escape_names(text: str, names: Sequence[str]) -> str:
    for name in names:
        if name in text:
            text = text.replace(name, name.replace("\n", "\\n").replace("\t", "\\t"))
    return text


class _SafeStream(io.TextIOBase):
    """Everything the command prints goes through ``printable``: one place, every printer
    (names read from files included), whatever the stream's encoding; ``names`` (the
    command's own, ``_names``) with their newlines and tabs escaped too."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._encoding = getattr(stream, "encoding", None) or "utf-8"
        self.names: Sequence[str] = ()

    def write(self, text: str) -> int:
        self._stream.write(printable(_escape_names(text, self.names), self._encoding))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return self._encoding


def _quiet_after_broken_pipe() -> int:
    """The reader went away (``inkling-lab ... | head``): point stdout at /dev/null so that
    the interpreter's final flush does not fail too, and exit as a tool killed by SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # stdout is no file descriptor (a notebook, a test's capture): nothing to flush there
    return 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _SafeStream(out), _SafeStream(err)
    try:  # pasted logs may hold bytes that are not UTF-8: read them, print them escaped
        sys.stdin.reconfigure(errors="surrogateescape")
    except (AttributeError, ValueError, io.UnsupportedOperation):
        pass  # no stdin, or not a text file: nothing to read from it anyway
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        sys.stdout.names = sys.stderr.names = _names(args)
        if not hasattr(args, "func"):
            parser.print_help()
            return 2
        code = args.func(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _quiet_after_broken_pipe()
    finally:
        sys.stdout, sys.stderr = out, err


if __name__ == "__main__":
    sys.exit(main())
