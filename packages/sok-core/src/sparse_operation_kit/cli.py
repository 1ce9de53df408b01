"""The ``sok`` command: environment facts, demos, and checkpoint tools.

Example::

    $ sok info
    $ sok demo --keys 4194304
    $ sok ckpt inspect ckpt          # read-only; imports no TensorFlow
    $ sok ckpt convert ckpt hps_out  # HPS's sparse-model layout (needs sok-hps)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def _info(args: argparse.Namespace) -> int:
    from sparse_operation_kit.env_info import print_environment_info

    print_environment_info(with_tensorflow=not args.no_tensorflow)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from sparse_operation_kit.demo import run_storage_demo, run_training_demo

    if args.part in ("storage", "all"):
        run_storage_demo(num_keys=args.keys, dim=args.dim, batch=args.batch, var_types=args.var_types)
    if args.part in ("train", "all"):
        run_training_demo(steps=args.steps, var_types=args.var_types)
    return 0


def _ckpt(args: argparse.Namespace) -> int:
    # Neither command imports TensorFlow: both read checkpoints through checkpoint_format.
    if args.ckpt_command == "inspect":
        return _ckpt_inspect(args)
    return _ckpt_convert(args)


def _ckpt_inspect(args: argparse.Namespace) -> int:
    import json

    from sparse_operation_kit.checkpoint_inspect import inspect

    info = inspect(args.path, verify=not args.no_verify)
    manifest = info["manifest"] or {}
    print(
        f"checkpoint {args.path}: written by {manifest.get('world_size', '?')} rank(s), optimizer "
        f"{manifest.get('optimizer')}, step {manifest.get('step')}"
        f"{'' if info['manifest'] else ' (no manifest: NVIDIA SOK layout)'}"
    )
    for table, entry in info["tables"].items():
        print(
            f"  {table}: {entry['rows']:,} rows x {entry['dim']} ({entry['key_dtype']} keys)"
            f"{'; state ' + ', '.join(entry['state_files']) if entry['state_files'] else ''}"
        )
    print(f"checksums: {info['checksums']}" + (" (no manifest)" if info["manifest"] is None else ""))
    if info["leftovers"]:
        left = ", ".join(f"{d['path']} ({'complete' if d['complete'] else 'incomplete'})" for d in info["leftovers"])
        print(f"left beside it by an interrupted (or running) sok.dump: {left}; the next sok.dump of it deletes them")
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    return 0


def _ckpt_convert(args: argparse.Namespace) -> int:
    from sparse_operation_kit.progress import TqdmCallback

    try:
        from hierarchical_parameter_server.convert import convert_to_hps
    except ModuleNotFoundError as error:
        if error.name not in ("hierarchical_parameter_server", "hierarchical_parameter_server.convert"):
            raise
        raise ImportError(
            f"sok ckpt convert needs sok-hps, which is not installed ({error}); install it with "
            f"pip install sok-core[hps]"
        ) from error
    with TqdmCallback(desc="convert", unit="table") as bar:
        written = convert_to_hps(args.path, args.output, callback=bar)
    print(f"wrote {len(written)} HPS table directories under {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sok", description="SparseOperationKit command line")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    commands = parser.add_subparsers(dest="command", required=True)

    info = commands.add_parser("info", help="versions, backends and devices (for bug reports)")
    info.add_argument("--no-tensorflow", action="store_true", help="do not import TensorFlow")
    info.set_defaults(run=_info)

    demo = commands.add_parser("demo", help="fill, query, evict and export tables; train a DynamicVariable")
    demo.add_argument("--part", choices=("storage", "train", "all"), default="all", help="which demo (default all)")
    demo.add_argument("--steps", type=int, default=200, help="training steps per var_type (default 200)")
    demo.add_argument("--keys", type=int, default=4 << 20, help="keys to insert (default 4Mi)")
    demo.add_argument("--dim", type=int, default=64, help="floats per row (default 64)")
    demo.add_argument("--batch", type=int, default=1 << 18, help="keys per call (default 256Ki)")
    demo.add_argument("--var-types", nargs="+", default=["hbm", "hybrid"], help="var_types to run")
    demo.set_defaults(run=_demo)
    ckpt = commands.add_parser("ckpt", help="inspect or convert sok.dump checkpoints")
    ckpt_commands = ckpt.add_subparsers(dest="ckpt_command", required=True)
    inspect_cmd = ckpt_commands.add_parser("inspect", help="tables, rows, dims, optimizer, checksums (read-only)")
    inspect_cmd.add_argument("path")
    inspect_cmd.add_argument("--no-verify", action="store_true", help="skip the checksum check")
    inspect_cmd.add_argument("--json", action="store_true", help="also print everything as JSON")
    convert_cmd = ckpt_commands.add_parser("convert", help="write the tables in HPS's sparse-model layout")
    convert_cmd.add_argument("path")
    convert_cmd.add_argument("output")
    ckpt.set_defaults(run=_ckpt)
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
