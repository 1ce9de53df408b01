"""sok-hps's additions to the ``sok`` command (entry-point group ``sok.commands``, see
:mod:`sparse_operation_kit.plugins.commands`): ``sok ckpt convert`` and the serving of the demo.

Example::

    $ sok ckpt convert ckpt hps_out        # the tables of a sok.dump in HPS's sparse-model layout
    $ sok demo --part serve --output build/demo
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from sparse_operation_kit.plugins import hookimpl

__all__ = ["sok_ckpt_commands", "sok_demo_server"]


def _convert(args: argparse.Namespace) -> int:
    # No TensorFlow: the checkpoint is read through checkpoint.format.
    from sparse_operation_kit.progress import TqdmCallback

    from hierarchical_parameter_server.convert import convert_to_hps

    with TqdmCallback(desc="convert", unit="table") as bar:
        written = convert_to_hps(args.path, args.output, callback=bar)
    print(f"wrote {len(written)} HPS table directories under {args.output}")
    return 0


@hookimpl
def sok_ckpt_commands(commands: argparse._SubParsersAction) -> None:
    """``sok ckpt convert PATH OUTPUT``: :func:`~hierarchical_parameter_server.convert.convert_to_hps`."""
    convert = commands.add_parser("convert", help="write the tables in HPS's sparse-model layout")
    convert.add_argument("path")
    convert.add_argument("output")
    convert.set_defaults(run=_convert)


@hookimpl
def sok_demo_server() -> Callable[[str], Any]:
    """:func:`~hierarchical_parameter_server.demo_serve.serve`, imported when it serves."""

    def serve(output: str) -> Any:
        from hierarchical_parameter_server.demo_serve import serve as serve_run

        return serve_run(output)

    return serve
