"""The ``sok`` command: environment facts and demos.

Example::

    $ sok info
    $ sok demo --keys 4194304
"""

from __future__ import annotations

import argparse
import logging
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return args.run(args)
    except (ValueError, TypeError, ImportError) as error:
        print(f"sok {args.command}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
