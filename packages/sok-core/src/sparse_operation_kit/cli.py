"""The ``sok`` command: environment facts, demos, and checkpoint tools.

Example::

    $ sok info
    $ sok demo                                 # train, dump, serve (build/demo), storage tour
    $ sok demo --model dcnv2 --steps 50 --batch-size 512   # MLPerf's DLRM-DCNv2 (multi-hot): train, serve, tour
    $ horovodrun -np 2 -H localhost:2 --gloo sok demo --part train && sok demo --part serve
    $ sok ckpt inspect ckpt          # read-only; imports no TensorFlow
    $ sok ckpt convert ckpt hps_out  # HPS's sparse-model layout (sok-hps adds it)

Other distributions add to the command through the entry-point group ``sok.commands``
(:mod:`sparse_operation_kit.plugins.commands`): sok-hps adds ``sok ckpt convert`` and serves the
demo's model; sok-core depends on neither.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparse_operation_kit.demo.train import DemoConfig


def _info(args: argparse.Namespace) -> int:
    from sparse_operation_kit.env_info import print_environment_info

    print_environment_info(with_tensorflow=not args.no_tensorflow)
    return 0


#: ``sok demo`` options whose value is taken from ``--mlperf``'s sizes when not given.
_SIZE_OPTIONS = ("batch_size", "dim", "max_rows", "bottom", "top", "hotness", "cross_layers", "low_rank")
#: ``sok demo`` options of the DCNv2 only.
_DCNV2_OPTIONS = ("hotness", "cross_layers", "low_rank", "mlperf")


def _demo_part(args: argparse.Namespace) -> str:
    """The part of the demo to run (``--part``, ``all`` by default for either model); ValueError for
    an option of the DCNv2 given with ``--model dlrm``. ``--part serve`` serves the model that
    ``--output`` was trained with (its ``demo.json`` names it), whatever ``--model`` says."""
    if args.model == "dlrm":
        given = [f"--{name.replace('_', '-')}" for name in _DCNV2_OPTIONS if getattr(args, name) not in (None, False)]
        if given:
            raise ValueError(f"{', '.join(given)} are options of --model dcnv2, not valid with --model dlrm")
    return args.part


def _demo_config(args: argparse.Namespace) -> DemoConfig:
    """The ``DemoConfig`` of ``sok demo``'s options: given sizes, else ``--mlperf``'s, else the defaults."""
    from sparse_operation_kit.demo.train import MLPERF_DCNV2, DemoConfig

    sizes = dict(MLPERF_DCNV2) if args.mlperf else {}
    sizes.update({name: getattr(args, name) for name in _SIZE_OPTIONS if getattr(args, name) is not None})
    return DemoConfig(
        model=args.model,
        steps=args.steps,
        epochs=args.epochs,
        eval_batches=args.eval_batches,
        tables=args.tables,
        var_types=args.var_types,
        seed=args.seed,
        train_tsv=args.train_tsv,
        eval_tsv=args.eval_tsv,
        **sizes,
    )


def _demo(args: argparse.Namespace) -> int:
    status = 0
    part = _demo_part(args)
    if part in ("storage", "all"):
        from sparse_operation_kit.demo.storage import check_arguments

        check_arguments(args.keys, args.storage_dim, args.batch)
    if part in ("train", "all"):
        from sparse_operation_kit.demo.train import train

        config = _demo_config(args)
        config.check(1)  # before TensorFlow starts (train checks again with the number of ranks)
        train(config, args.output)
    if part in ("serve", "all"):
        from sparse_operation_kit.plugins.commands import MISSING, plugin_manager

        server = plugin_manager().hook.sok_demo_server()
        if server is None:
            needs = MISSING["sok demo --part serve"]
            print(f"\n== serving through HPS skipped: it needs {needs}, which is not installed")
        elif part == "serve":
            server(args.output)
        else:  # in a new process: nothing of training's state carries over
            command = [
                sys.executable,
                "-m",
                "sparse_operation_kit.cli",
                "demo",
                "--part",
                "serve",
                "--output",
                args.output,
            ]
            status = subprocess.run(command).returncode
    if part in ("storage", "all"):
        from sparse_operation_kit.demo.storage import run_storage_demo

        run_storage_demo(num_keys=args.keys, dim=args.storage_dim, batch=args.batch, var_types=args.var_types)
    return status


def _ckpt_inspect(args: argparse.Namespace) -> int:
    # No TensorFlow: the checkpoint is read through checkpoint.format.
    import json

    from sparse_operation_kit.checkpoint.inspect import inspect

    info = inspect(args.path, verify=not args.no_verify)
    manifest = info["manifest"] or {}
    print(
        f"checkpoint {args.path}: written by {manifest.get('world_size', '?')} rank(s), optimizer "
        f"{manifest.get('optimizer')}, step {manifest.get('step')}"
        f"{'' if info['manifest'] else ' (no manifest: NVIDIA SOK layout)'}"
    )
    for table, entry in info["tables"].items():
        print(
            f"  {table}: {entry['rows']:,} rows x {entry['dim']} ({entry['key_dtype']} keys"
            f"{'' if entry['dtype'] == 'float32' else ', ' + entry['dtype'] + ' rows'})"
            f"{'; state ' + ', '.join(entry['state_files']) if entry['state_files'] else ''}"
        )
    print(f"checksums: {info['checksums']}" + (" (no manifest)" if info["manifest"] is None else ""))
    if info["leftovers"]:
        left = ", ".join(f"{d['path']} ({'complete' if d['complete'] else 'incomplete'})" for d in info["leftovers"])
        print(f"left beside it by an interrupted (or running) sok.dump: {left}; the next sok.dump of it deletes them")
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    return 0


def _needs_plugin(command: str) -> Callable[[argparse.Namespace], int]:
    """The ``run`` of a subcommand that a plugin adds where none is installed: it says what to install."""

    def run(args: argparse.Namespace) -> int:
        from sparse_operation_kit.plugins.commands import MISSING

        raise ImportError(f"{command} needs {MISSING[command]}, which is not installed")

    return run


def build_parser() -> argparse.ArgumentParser:
    from sparse_operation_kit.demo.criteo import NUM_CATEGORICAL  # NumPy only, as train: TensorFlow comes later
    from sparse_operation_kit.demo.train import MLPERF_DCNV2, MODELS, DemoConfig

    defaults = DemoConfig()
    parser = argparse.ArgumentParser(prog="sok", description="SparseOperationKit command line")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    commands = parser.add_subparsers(dest="command", required=True)

    info = commands.add_parser("info", help="versions, backends and devices (for bug reports)")
    info.add_argument("--no-tensorflow", action="store_true", help="do not import TensorFlow")
    info.set_defaults(run=_info)

    demo = commands.add_parser(
        "demo", help="train a DLRM on Criteo-shaped data, dump it, serve it through HPS; tour the storages"
    )
    demo.add_argument(
        "--model",
        choices=MODELS,
        default=defaults.model,
        help="dlrm: the DLRM, one id per feature (default); dcnv2: MLPerf's DLRM-DCNv2 on multi-hot data",
    )
    demo.add_argument(
        "--part",
        choices=("storage", "train", "serve", "all"),
        default="all",
        help="storage tour, training (+ dump and plot), HPS serving of a trained --output (of either model), or "
        "all (default)",
    )
    demo.add_argument("--output", default="build/demo", help="where training writes (default build/demo)")
    for option, what in (
        ("steps", "training steps"),
        ("epochs", "evaluations during training"),
        ("eval_batches", "global batches of the eval set"),
    ):
        value = getattr(defaults, option)
        demo.add_argument(f"--{option.replace('_', '-')}", type=int, default=value, help=f"{what} (default {value})")

    def shown(value: object) -> str:
        return " ".join(map(str, value)) if isinstance(value, list) else str(value)

    for option, what, many in (
        ("batch_size", "global batch", False),
        ("dim", "embedding width", False),
        ("max_rows", "rows of the largest table (dcnv2: the cap on every table's rows)", False),
        ("bottom", "hidden widths of the bottom MLP", True),
        ("top", "hidden widths of the top MLP", True),
        ("hotness", f"dcnv2: ids per sample of each of the {NUM_CATEGORICAL} features", True),
        ("cross_layers", "dcnv2: cross layers", False),
        ("low_rank", "dcnv2: rank of the cross layers", False),
    ):
        value = "MLPerf's" if option == "hotness" else shown(getattr(defaults, option))
        mlperf = f"; --mlperf: {shown(MLPERF_DCNV2[option])}" if option in MLPERF_DCNV2 and option != "hotness" else ""
        demo.add_argument(
            f"--{option.replace('_', '-')}",
            type=int,
            nargs="+" if many else None,
            default=None,  # the default, or --mlperf's size (_demo_config)
            help=f"{what} (default {value}{mlperf})",
        )
    demo.add_argument(
        "--mlperf",
        action="store_true",
        help="dcnv2: MLPerf's sizes (dim 128, MLPs 512-256-128 and 1024-1024-512-256-1, 3 cross layers of rank "
        "512, tables capped at 4 Mi rows) for the size options not given",
    )
    demo.add_argument(
        "--tables",
        choices=("static", "dynamic", "mixed"),
        default=defaults.tables,
        help="sok.Variable tables, sok.DynamicVariable tables, or dynamic for the large features (default)",
    )
    demo.add_argument("--seed", type=int, default=defaults.seed, help="data, hidden model, initial weights")
    demo.add_argument(
        "--var-types", nargs="+", default=defaults.var_types, help="var_types (dynamic tables, storage tour)"
    )
    demo.add_argument("--train-tsv", nargs="+", default=[], help="Criteo TSV day files to train on (real data)")
    demo.add_argument(
        "--eval-tsv", nargs="+", default=[], help="Criteo TSV day files to evaluate on (with --train-tsv)"
    )
    demo.add_argument("--keys", type=int, default=1 << 20, help="storage tour: keys to insert (default 1Mi)")
    demo.add_argument("--storage-dim", type=int, default=64, help="storage tour: floats per row (default 64)")
    demo.add_argument("--batch", type=int, default=1 << 18, help="storage tour: keys per insert (default 256Ki)")
    demo.set_defaults(run=_demo)
    ckpt = commands.add_parser("ckpt", help="inspect or convert sok.dump checkpoints")
    ckpt_commands = ckpt.add_subparsers(dest="ckpt_command", required=True)
    inspect_cmd = ckpt_commands.add_parser("inspect", help="tables, rows, dims, optimizer, checksums (read-only)")
    inspect_cmd.add_argument("path")
    inspect_cmd.add_argument("--no-verify", action="store_true", help="skip the checksum check")
    inspect_cmd.add_argument("--json", action="store_true", help="also print everything as JSON")
    inspect_cmd.set_defaults(run=_ckpt_inspect)
    from sparse_operation_kit.plugins.commands import plugin_manager

    plugin_manager().hook.sok_ckpt_commands(commands=ckpt_commands)
    if "convert" not in ckpt_commands.choices:
        missing = ckpt_commands.add_parser("convert", help="(sok-hps) write the tables in HPS's sparse-model layout")
        missing.add_argument("arguments", nargs="*")
        missing.set_defaults(run=_needs_plugin("sok ckpt convert"))
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up banner is not ours to print
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return args.run(args)
    except (ValueError, TypeError, ImportError, OSError) as error:
        print(f"sok {args.command}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
