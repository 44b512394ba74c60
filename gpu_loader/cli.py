"""The `gpu-loader` command: demo, make-dataset, bench, inspect, verify.

Errors a user can cause (missing path, empty folder, bad option) print one line naming
the option and exit with status 2; a run that fails on its data (too many bad files)
prints one line and exits with status 1 (`inspect`, when every image it sampled failed,
lists them under it; `verify` exits with 3 when a list it was asked to write could not be
written). Neither shows a traceback. A reader of stdout
that goes away (`| head`) ends the command quietly with status 141, after any file it was
asked to write (`verify --good-list/--json`) is written.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import gpu_loader
from gpu_loader._failed import counted, is_utf8, shown_key
from gpu_loader._resources import cache_root

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNWRITTEN = 3
"""`verify`: a list asked for (``--good-list``, ``--json``) could not be written; the
check itself ran and its report was printed (1 would not tell a script whether the data or
the output was at fault)."""
EXIT_PIPE = 141
"""stdout's reader went away (`| head`): 128 + SIGPIPE, as a shell reports a command that
signal ended."""


class CliError(Exception):
    """A user-facing error: printed as one line, exit status ``code`` (2: usage)."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def in_flags(message: str, flags: dict[str, str]) -> str:
    """``message`` with the library's `parameter` names replaced by the command's flags."""
    return re.sub(r"`(\w+)`", lambda m: flags.get(m.group(1), m.group(0)), message)


# Library parameter -> the flag that sets it, per command.
_DEMO_FLAGS = {
    "decode_threads": "--threads",
    "device": "--device",
    "batch_size": "--batch-size",
    "size": "--size",
}


def _in_demo_flags(message: str) -> str:
    """A library message in `demo`'s terms: its flags, and ``--device cuda`` for
    ``device='cuda'``."""
    return re.sub(r"device='([\w:]+)'", r"--device \1", in_flags(message, _DEMO_FLAGS))


_MAKE_FLAGS = {
    "num_images": "--num",
    "num_classes": "--classes",
    "min_side": "--min-side",
    "max_side": "--max-side",
    "heavy_fraction": "--heavy-fraction",
    "seed": "--seed",
}


def cache_dir() -> Path:
    """Where generated datasets are kept (`gpu_loader._resources.cache_root`)."""
    return cache_root()


# ---------------------------------------------------------------------------- parser
class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the fix, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpu-loader",
        description=(
            "A thread-based PyTorch image data loader: GPU batch decode, fused CUDA "
            "transforms, straggler-aware batching and live GPU-idleness monitoring."
        ),
    )
    parser.add_argument(
        "--version", action="version", version=f"gpu-loader {gpu_loader.__version__}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = sub.add_parser(
        "demo",
        help="run the loader through a simulated training loop and report what it sees",
        description=(
            "Run ImageLoader for a few epochs through a simulated training step and print "
            "the report: throughput, data-stall %, GPU idleness (or 'no GPU'), a per-stage "
            "table, the bottleneck and failures. Without --data it uses a built-in dataset of "
            "generated photo-like images, created once in the cache folder "
            "($GPU_LOADER_CACHE, else $XDG_CACHE_HOME/gpu_loader or ~/.cache/gpu_loader, else "
            "a per-user folder in the temporary directory)."
        ),
    )
    demo.add_argument("--data", help=_DATA_HELP)
    demo.add_argument(
        "--num-images", type=int, default=1000, help="size of the built-in dataset (default: 1000)"
    )
    demo.add_argument("--epochs", type=int, default=2, help="epochs to run (default: 2)")
    demo.add_argument("--batch-size", type=int, default=64, help="default: 64")
    demo.add_argument("--size", type=int, default=224, help="output side in pixels (default: 224)")
    demo.add_argument(
        "--device",
        default="auto",
        help="auto (cuda if usable, else cpu), cpu, cuda or cuda:N (default: auto)",
    )
    demo.add_argument(
        "--decode-on",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="where images are decoded and transformed: auto is the GPU path on a CUDA "
        "device, cpu the CPU path (whose batches are then copied to the device; it was "
        "the faster on the one GPU machine measured, see the README's GPU vs CPU), gpu "
        "needs a CUDA device (default: auto)",
    )
    demo.add_argument(
        "--batching",
        choices=("ordered", "straggler"),
        default="straggler",
        help="batch formation (default: straggler)",
    )
    demo.add_argument(
        "--step-ms",
        type=float,
        default=20.0,
        help="simulated training step per batch in ms, GIL-free (default: 20)",
    )
    demo.add_argument("--threads", type=int, help="decode threads (default: CPU count)")
    demo.add_argument(
        "--json", type=Path, metavar="PATH", help="also write the final stats as JSON here"
    )
    demo.add_argument(
        "--log-jsonl",
        type=Path,
        metavar="PATH",
        help="append periodic stats snapshots (JSON lines) here",
    )
    demo.add_argument(
        "--max-failures",
        type=_failure_limit,
        default=0.01,
        metavar="N|RATE|none",
        help="bad files tolerated per epoch before the run stops: a count, a rate in (0, 1], "
        "or none for no limit (default: 0.01); bad files are listed in the report (the "
        "first 20 in the text; --json has all, with their errors)",
    )
    demo.add_argument("--no-progress", action="store_true", help="no live progress bar")
    demo.set_defaults(func=cmd_demo)

    make = sub.add_parser(
        "make-dataset",
        help="write a generated photo-like ImageFolder dataset",
        description="Write a deterministic ImageFolder of generated photo-like images "
        "(JPEG, a few PNG and grayscale files) to OUT. OUT may be new, empty, or an earlier "
        "generated dataset: the same parameters reuse it, others replace it (either said "
        "on stderr); a folder holding any other file is refused.",
    )
    make.add_argument("out", type=Path, metavar="OUT", help="folder to write")
    make.add_argument("--num", type=int, default=2000, help="number of images (default: 2000)")
    make.add_argument("--classes", type=int, default=10, help="number of classes (default: 10)")
    make.add_argument("--seed", type=int, default=0, help="generator seed (default: 0)")
    make.add_argument("--min-side", type=int, default=200, help="default: 200")
    make.add_argument("--max-side", type=int, default=800, help="default: 800")
    make.add_argument(
        "--heavy-fraction",
        type=float,
        default=0.0,
        help="fraction of images with 3-4x the sides (stragglers; default: 0)",
    )
    make.set_defaults(func=cmd_make_dataset)

    bench = sub.add_parser(
        "bench",
        help="run the comparison benchmarks that apply on this machine",
        description="Run the benchmarks in benchmarks/ that apply here (CPU loaders vs "
        "DataLoader/SPDL/DALI, engine overhead, stragglers, and GPU vs CPU when a GPU is "
        "usable), write their JSON and a PNG chart, and print the tables.",
    )
    bench.add_argument(
        "--only",
        help="comma list of benchmarks, of cpu_loaders, pipeline_overhead, stragglers, "
        "gpu_vs_cpu, gpu_profile (default: all that apply)",
    )
    bench.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        help="folder for JSON and PNG (default: ./bench-results)",
    )
    bench.set_defaults(func=cmd_bench)

    inspect = sub.add_parser(
        "inspect",
        help="profile each stage alone at several thread counts and recommend settings",
        description="Time the read stage and the decode+transform stage alone at several "
        "thread counts on a sample of the data, and recommend thread counts for this machine.",
    )
    inspect.add_argument("--data", required=True, help=_DATA_HELP)
    inspect.add_argument("--samples", type=int, default=256, help="images to time (default: 256)")
    inspect.add_argument("--size", type=int, default=224, help="output side (default: 224)")
    inspect.set_defaults(func=cmd_inspect)

    verify = sub.add_parser(
        "verify",
        help="read and fully decode every image; list the bad ones; write a clean list",
        description="Read and decode every image of the data at full size with the CPU "
        "decoders, print each file that fails with its key and error, and optionally "
        "write the good ones as a CSV list the loader takes. Exit status 1 when a file "
        "is bad, or when a good one cannot be listed in --good-list (a name that is not "
        "UTF-8, which a CSV cannot hold: it is left out and named); 3 when --good-list "
        "or --json cannot be written (named after the report). Worth running before "
        "training on the GPU path, which may deliver a JPEG with damaged compressed data "
        "instead of reporting it.",
    )
    verify.add_argument("--data", required=True, help=_DATA_HELP)
    verify.add_argument("--threads", type=int, help="threads per stage (default: CPU count)")
    verify.add_argument(
        "--good-list",
        type=Path,
        metavar="CSV",
        help="write the good samples here (path,label); for a folder or CSV list, not tar "
        "shards; a plain file is replaced whole, a link, FIFO or shared file written in place",
    )
    verify.add_argument(
        "--json", type=Path, metavar="PATH", help="write the bad files here as JSON"
    )
    verify.set_defaults(func=cmd_verify)
    return parser


# ---------------------------------------------------------------------------- helpers
def _failure_limit(text: str) -> int | float | None:
    """``--max-failures``: ``none``, a count, or a rate in (0, 1]."""
    if text.lower() == "none":
        return None
    from gpu_loader.pipeline._defs import check_max_failures

    try:
        value: int | float = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a count, a rate or none") from None
    try:
        check_max_failures(value)  # the loader's own rule
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r}: a count >= 0 or a rate in (0, 1]") from None
    return value


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise CliError(f"--{name} must be > 0, got {value}")


MAX_OUTPUT_SIDE = 8192
"""The largest ``--size``: one float32 image of 8192 x 8192 is 0.8 GB (QA58: 30000 ran for
minutes, each sample a 10.8 GB output, then failed as a batch too large)."""


def _output_side(value: int) -> None:
    _positive("size", value)
    if value > MAX_OUTPUT_SIDE:
        raise CliError(
            f"--size must be at most {MAX_OUTPUT_SIDE} (one float32 image of that side is "
            f"{3 * 4 * MAX_OUTPUT_SIDE**2 / 2**30:.1f} GiB), got {value}"
        )


_DATA_HELP = (
    "a folder (one sub-folder per class), a .csv list or .tar shards (brace patterns "
    "allowed), as a path or an fsspec URL"
)


def _open_data(location: str | Path) -> gpu_loader.sources.SampleIndex:
    """What ``--data`` names, opened as `ImageLoader` would (`sources.open_index`)."""
    from gpu_loader.sources import is_url, open_index
    from gpu_loader.sources._open import kind_by_name

    text = os.fspath(location)  # a str: a Path would turn memory://x into memory:/x
    shown = f"--data {shown_key(text)}"  # one line, whatever the name holds (QA63)
    if not is_url(text) and "{" not in text and not os.path.exists(text):
        raise CliError(f"{shown}: no such folder or file")
    if not is_url(text) and os.path.isfile(text) and kind_by_name(text) == "folder":
        raise CliError(
            f"{shown}: is a file, and --data takes a folder, a .csv list or .tar shards "
            "(a list must be a CSV file named *.csv, with a header row path,label)"
        )
    try:
        index = open_index(text)
    except (ValueError, OSError, ImportError) as exc:  # ImportError: "Install s3fs to ..."
        raise CliError(f"{shown}: {_in_cli_terms(str(exc))}") from None
    except Exception as exc:  # a filesystem's own (a credentials error): still one line
        raise CliError(f"{shown}: {type(exc).__name__}: {exc}") from None
    if len(index) == 0:  # a CSV list with its header alone, shards with no image
        raise CliError(f"{shown}: {index!r} has no samples (an empty list or shard set?)")
    return index


def _in_cli_terms(message: str) -> str:
    """ImageFolder's hint names its own arguments, which the commands do not have."""
    return message.replace(
        "(pass extensions=... to change them, or allow_empty=True to keep empty classes)",
        "(convert or rename the files, remove class folders that hold no images, or list "
        "the files in a CSV: path,label)",
    )


def _check_backend() -> None:
    """``$GPU_LOADER_CPU_BACKEND`` misspelt, or `native` without the extension built: one
    error up front. Raised by every decode, it made `verify` report each file as bad (and
    write an empty clean list) and `inspect` find no readable image."""
    from gpu_loader.ops._backend import native_module

    try:
        native_module()
    except (ValueError, ImportError) as exc:
        raise CliError(str(exc)) from None


def _check_output_paths(paths: dict[str, Path | None]) -> None:
    """Each file a command will write (``{flag: path}``, None: not asked for) can be:
    not a folder, in a folder that exists, and not one another of them names, by another
    path or a hard link (QA58: the CSV was replaced by the JSON without a word; QA63: by
    a hard link to it). Errors name the flag."""
    seen: dict[object, str] = {}
    for flag, path in paths.items():
        if path is None:
            continue
        shown = f"{flag} {shown_key(str(path))}"
        try:  # is_dir() raises what it does not take for "no": a name too long (QA72)
            is_dir, parent_is_dir = path.is_dir(), path.parent.is_dir()
        except OSError as exc:
            raise CliError(f"{shown}: cannot be a file here ({exc.strerror})") from None
        if is_dir:
            raise CliError(f"{shown}: is a folder; give a file path")
        if not parent_is_dir:
            raise CliError(f"{shown}: folder {shown_key(str(path.parent))} does not exist")
        if _is_stdout(path):
            continue  # both lists may go to stdout, one after the other
        names: list[object] = [os.path.realpath(path)]
        with contextlib.suppress(OSError):  # a file that does not exist yet has no inode
            info = os.stat(path)
            names.append((info.st_dev, info.st_ino))
        for name in names:
            if name in seen:
                raise CliError(f"{seen[name]} and {shown} name one file; give each its own")
            seen[name] = shown


def cached_dataset(name: str, what: str, **params: Any) -> Path:
    """``make_image_folder(cache_dir() / name, **params)`` (generated once, then reused);
    a cache folder that cannot be written is a `CliError` saying how to choose another.
    ``what`` names the dataset in that message (also used by the training example)."""
    from gpu_loader.datasets import make_image_folder

    try:
        return make_image_folder(cache_dir() / name, progress=True, **params)
    except OSError as exc:
        raise CliError(
            f"cannot write the {what} dataset into the cache folder {cache_dir()} ({exc}); "
            "set GPU_LOADER_CACHE to a writable folder, or pass --data"
        ) from None


def demo_dataset(num_images: int) -> Path:
    """The built-in dataset, generated once into the cache folder."""
    name = f"demo-photos-{num_images}"
    print(f"dataset: {cache_dir() / name}", file=sys.stderr)
    return cached_dataset(name, "demo", num_images=num_images, num_classes=10, seed=0)


# ---------------------------------------------------------------------------- commands
def cmd_demo(args: argparse.Namespace) -> int:
    from gpu_loader.demo import run_demo
    from gpu_loader.loader import _resolve_device
    from gpu_loader.pipeline import PipelineFailure

    for name in ("num_images", "epochs", "batch_size"):
        _positive(name.replace("_", "-"), getattr(args, name))
    _output_side(args.size)
    if args.threads is not None:
        _positive("threads", args.threads)
    device = args.device.strip().lower()
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise CliError(f"--device must be auto, cpu, cuda or cuda:N, got {args.device!r}")
    if args.step_ms < 0:
        raise CliError(f"--step-ms must be >= 0, got {args.step_ms}")
    # Before the run, which they outlive.
    _check_output_paths({"--json": args.json, "--log-jsonl": args.log_jsonl})
    try:  # before the demo dataset is made: that takes a while
        resolved = _resolve_device(device)
    except (ValueError, RuntimeError) as exc:
        raise CliError(_in_demo_flags(str(exc))) from None
    if args.decode_on == "gpu" and resolved.type != "cuda":
        raise CliError(
            f"--decode-on gpu needs a CUDA device; --device {args.device} is {resolved} "
            "here (leave --decode-on at auto or cpu)"
        )
    _check_backend()
    data = args.data if args.data is not None else demo_dataset(args.num_images)
    index = _open_data(data)
    try:
        report = run_demo(
            index,
            epochs=args.epochs,
            batch_size=args.batch_size,
            size=args.size,
            device=device,
            batching=args.batching,
            decode_on=args.decode_on,
            step_s=args.step_ms / 1000,
            threads=args.threads,
            progress=not args.no_progress,
            log_jsonl=args.log_jsonl,
            max_failures=args.max_failures,
        )
    except PipelineFailure as exc:
        if not exc.limit_reached:  # a stage failed outright: no tolerance would help
            raise CliError(exc.message, code=EXIT_FAILED) from None
        first = f" First: {exc.exceptions[0]}." if exc.exceptions else ""
        limit = exc.message.split(";")[0]  # "stage 'decode': failure rate above 0.01 (...)"
        raise CliError(
            f"too many bad files, {limit}.{first} Rerun with --max-failures none to skip "
            "every bad file and list them all in the report",
            code=EXIT_FAILED,
        ) from None
    except (ValueError, RuntimeError) as exc:
        raise CliError(_in_demo_flags(str(exc))) from None
    print(report.text)
    if args.json is not None:
        _write_whole(args.json, report.json)
        print(f"stats written to {args.json}")
    return 0


def cmd_make_dataset(args: argparse.Namespace) -> int:
    from gpu_loader.datasets import make_image_folder

    _positive("num", args.num)
    _positive("classes", args.classes)
    if args.out.exists() and not args.out.is_dir():
        raise CliError(f"{args.out}: exists and is not a folder")
    start = time.perf_counter()
    try:
        root = make_image_folder(
            args.out,
            num_images=args.num,
            num_classes=args.classes,
            seed=args.seed,
            min_side=args.min_side,
            max_side=args.max_side,
            heavy_fraction=args.heavy_fraction,
            progress=True,
        )
    except ValueError as exc:
        raise CliError(in_flags(str(exc), _MAKE_FLAGS)) from None
    except OSError as exc:  # a folder that cannot be made or written there
        raise CliError(f"{args.out}: cannot write the dataset there: {exc}") from None
    classes = min(args.num, args.classes)  # image i goes to class i % classes
    fewer = f" (--classes {args.classes} > --num: one image each)" if classes < args.classes else ""
    print(
        f"{root}: {counted(args.num, 'image')} in {classes} "
        f"class{'' if classes == 1 else 'es'}{fewer} "
        f"({time.perf_counter() - start:.1f} s)"
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    # benchmarks/ is installed as gpu_loader.benchmarks (a mapped folder mypy cannot see).
    suite = importlib.import_module("gpu_loader.benchmarks.suite")
    if args.out.exists() and not args.out.is_dir():
        raise CliError(f"--out {args.out}: exists and is not a folder")
    try:
        return int(suite.run_suite(args.out, only=args.only, quick=args.quick))
    except ValueError as exc:
        raise CliError(str(exc)) from None


def cmd_inspect(args: argparse.Namespace) -> int:
    from gpu_loader.inspect import inspect_folder

    _positive("samples", args.samples)
    _output_side(args.size)
    _check_backend()
    index = _open_data(args.data)
    try:
        print(inspect_folder(index, samples=args.samples, size=args.size))
    except ValueError as exc:  # every image sampled failed
        raise CliError(str(exc), code=EXIT_FAILED) from None
    return 0


def _absolute(key: str) -> str:
    from gpu_loader.sources._io import absolute, is_url

    return key if is_url(key) else absolute(key)


def cmd_verify(args: argparse.Namespace) -> int:
    import csv
    import dataclasses
    import json

    from gpu_loader.inspect import verify
    from gpu_loader.monitor._progress import LINE_INTERVAL_S, is_terminal

    if args.threads is not None:
        _positive("threads", args.threads)
    # Before the run, not after it.
    _check_output_paths({"--good-list": args.good_list, "--json": args.json})
    _check_backend()
    index = _open_data(args.data)
    if args.good_list is not None and isinstance(index, gpu_loader.sources.TarShards):
        raise CliError(
            "--good-list needs a folder or a CSV list: a tar shard's samples have no path "
            "of their own (rebuild the shards from the good keys instead)"
        )
    total, began = len(index), time.perf_counter()
    terminal = is_terminal(sys.stderr)
    last_line, line_open = [began], [False]

    def report(done: int, bad: int) -> None:
        text = f"{done + bad:,} of {total:,} checked, {bad:,} bad"
        if terminal:  # one line, redrawn
            print(f"\r{text}", end="", file=sys.stderr)
            line_open[0] = True
        elif time.perf_counter() - last_line[0] >= LINE_INTERVAL_S:  # a log: a line now and then
            last_line[0] = time.perf_counter()
            print(text, file=sys.stderr, flush=True)

    try:
        good, bad = verify(index, threads=args.threads, report=report)
    except ImportError as exc:  # before any --good-list is written: it would be empty
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        if line_open[0]:  # end the progress line: "interrupted" goes on a line of its own
            print(file=sys.stderr)
        raise
    if terminal:
        print(f"\r{' ' * 60}\r", end="", file=sys.stderr)
    took = time.perf_counter() - began
    # The files first, the report after: a reader that stops reading stdout (`| head`)
    # must not cost the lists asked for (QA58: a broken pipe, and neither was written).
    unlisted, unwritten = [], []

    def write(path: Path, text: str) -> bool:
        # A list that cannot be written must not cost the report of a long run: said
        # after it, exit status 1 (QA58: the error alone, the report never printed).
        try:
            _write_whole(path, text)
        except CliError as exc:
            unwritten.append(str(exc))
            return False
        return True

    wrote_good = wrote_json = False
    if args.good_list is not None:
        rows = io.StringIO(newline="")
        writer = csv.writer(rows)
        writer.writerow(["path", "label"])
        for i in good:
            # Absolute: the CSV's own folder is where relative paths are taken from.
            path = _absolute(index.key(i))
            if is_utf8(path):
                writer.writerow((path, index.label(i)))
            else:  # a CSV list is UTF-8 (QA: a traceback, and a list cut at this row)
                unlisted.append(path)
        wrote_good = write(args.good_list, rows.getvalue())
    if args.json is not None:
        listed = json.dumps([dataclasses.asdict(b) for b in bad], indent=1) + "\n"
        wrote_json = write(args.json, listed)
    print(f"checked {counted(total, 'file')} in {took:.1f} s: {len(good):,} good, {len(bad):,} bad")
    folder = index if isinstance(index, gpu_loader.sources.ImageFolder) else None
    if folder is not None and (other := folder.passed_over):
        count = sum(other.values())
        kinds = ", ".join(f"{ext or '(no extension)'} {n:,}" for ext, n in other.items())
        print(
            f"passed over {counted(count, 'file')} in the class folders, "
            f"which the loader does not read either: {kinds} (it reads "
            f"{' '.join(folder.extensions)}; to check others, list them in a CSV: path,label)"
        )
    for b in bad:
        print(f"  {shown_key(b.key)}: {b.stage}: {b.error}")
    if wrote_good:
        usable = "(gpu-loader demo --data takes it)" if good else "(no good sample: header only)"
        print(f"good samples written to {args.good_list} {usable}")
    if unlisted:
        print(
            f"{len(unlisted):,} good {'file is' if len(unlisted) == 1 else 'files are'} not in "
            f"{args.good_list}: a CSV list holds UTF-8 names only (rename "
            f"{'it' if len(unlisted) == 1 else 'them'})"
        )
        for path in unlisted:
            print(f"  {path!r}")
    if wrote_json:
        print(f"bad files written to {args.json}")
    if unwritten:
        raise CliError("; ".join(unwritten), EXIT_UNWRITTEN)
    return 1 if bad or unlisted else 0


def _is_stdout(path: Path) -> bool:
    """Whether ``path`` opens the file this process's stdout writes to (``/dev/stdout``,
    ``/proc/self/fd/1``, or the file stdout is redirected to)."""
    try:
        st, out = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such file; stdout closed or replaced
        return False
    return (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino)


def _write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all where that is safe: a temporary file
    beside a plain file of ours (or none yet), renamed over it, so a run that stops midway
    never leaves a list that looks complete. Anything else is written in place, as
    ``open()`` writes it: a link (``/dev/stdout``, ``/proc/self/fd/1`` to a redirected
    file), a FIFO or device, a file of another owner or with other names (hard links),
    a folder we cannot add a file to (QA: renamed over, ``/dev/stdout`` became a file for
    every process; a redirected stdout lost the run's report; an owner lost their file)."""
    import stat
    import tempfile

    if _is_stdout(path):
        # Opened again, a redirected stdout's file is truncated (the report printed so
        # far is lost) and written at a position of its own, over what stdout writes
        # next (QA58: invalid JSON, a CSV row cut by the report): through stdout instead.
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    try:
        st = os.lstat(path)  # the path itself, not what a link names
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}", EXIT_FAILED) from None
    ours = st is None or (
        stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1
    )
    fd, temporary = -1, ""
    if ours:  # else, or in a folder we may not add to: in place, as open() would
        with contextlib.suppress(OSError):
            fd, temporary = tempfile.mkstemp(prefix=".gpu-loader-", dir=path.parent)
    try:
        if fd < 0:
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            return
        try:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o777 if st else 0o666 & ~_umask())
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}", EXIT_FAILED) from None


def _umask() -> int:
    """The process's umask, read without setting it (``os.umask`` sets it process-wide for
    a moment, under any thread making a file then); set and restored where Linux's
    /proc/self/status does not say it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------------- entry point
def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stderr is None:
        # Started with stderr closed (`2>&-`): print(file=None) writes to stdout, so every
        # progress line and error would land in the report or a `--json /dev/stdout`
        # (QA58). Said nowhere instead, as a closed stderr asks.
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (open for the process's life)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the parser whose options they were meant for
        given = list(sys.argv[1:] if argv is None else argv)
        at = given.index(args.command) if args.command in given else len(given)
        before = any(a in given[:at] for a in extra)
        command = parser if before else _subparsers(parser).get(args.command or "", parser)
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:  # no command: argparse's usage error, as for a wrong one
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return func(args)
    except CliError as exc:
        print(f"gpu-loader {args.command}: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f"gpu-loader {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Whoever read stdout stopped (`| head`): nothing left to say to it. stdout goes
        # to /dev/null so that the interpreter's own flush at exit does not fail again.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
