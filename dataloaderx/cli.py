"""The ``dataloaderx`` command line."""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Sequence
from typing import Any

from dataloaderx.errors import BackendUnavailableError
from dataloaderx.registry import get_backend, registered_backends

__all__ = ["build_parser", "main"]


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def _options_text(backend_class: type[Any]) -> str:
    shown = []
    for parameter in inspect.signature(backend_class).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        type_name = parameter.annotation
        if not isinstance(type_name, str):
            type_name = getattr(type_name, "__name__", repr(type_name))
        default = "" if parameter.default is parameter.empty else f" = {parameter.default!r}"
        shown.append(f"{parameter.name}: {type_name}{default}")
    return ", ".join(shown) or "(none)"


def list_backends() -> int:
    """Print every registered backend with its aliases, options and status."""
    for name, entry in registered_backends().items():
        aliases = f" (aliases: {', '.join(entry.aliases)})" if entry.aliases else ""
        try:
            backend_class = get_backend(name)
        except BackendUnavailableError as exc:
            print(f"{name}{aliases}  [unavailable: {exc}]")
            continue
        reason = backend_class.unavailable_reason()
        status = "" if reason is None else f"  [unavailable: {reason}]"
        print(f"{name}{aliases}{status}")
        print(f"    {_first_line(backend_class.__doc__)}")
        print(f"    options: {_options_text(backend_class)}")
    print("every backend also accepts: stats: bool | 'trace' = True (see loader.stats)")
    print(
        "adaptive=True (thread, and auto without an accelerator): prefetch only while it "
        "pays, else make batches inline; on unless adaptive=False, whatever the other options"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``dataloaderx`` command."""
    parser = argparse.ArgumentParser(
        prog="dataloaderx",
        description="Tools for dataloaderx, the drop-in prefetching torch DataLoader.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("backends", help="list the registered prefetch backends and options")
    from dataloaderx.bench.cli import add_arguments

    help_text = "measure whether training waits for data, with DataLoader and each backend"
    add_arguments(commands.add_parser("bench", help=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "backends":
        return list_backends()
    if args.command == "bench":
        from dataloaderx.bench.cli import run

        return run(args)
    parser.print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
