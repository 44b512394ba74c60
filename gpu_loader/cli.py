"""The `gpu-loader` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import gpu_loader


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-loader",
        description="A thread-based PyTorch image data loader with GPU decode and live monitoring.",
    )
    parser.add_argument(
        "--version", action="version", version=f"gpu-loader {gpu_loader.__version__}"
    )
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
