#!/usr/bin/env python
"""HPS SavedModels served from C++ (no Python in the process) against Python and ``tf.gather``.

One table of ``--rows`` x ``--dim`` float32 rows (keys 0 .. rows-1) is written in HPS's
sparse-model layout. For each setup (``--setups``: a ps_config the C++ server takes,
docs/design/hps-serving.md), every lookup exact (``hit_rate_threshold`` 1.0, so every setup's rows
are checked against ``tf.gather``'s):

* ``cache``: the embedding cache at ``gpucacheper`` 1.0 over no database (a det table of every row);
* ``hash_map``: ``gpucache: false``, the volatile ``hash_map`` only (no ``overflow_margin``);
* ``evicting_cache``: the evicting cache at ``gpucacheper`` 0.25 (rounded up to a power of two: a
  third of the default table) over the volatile ``hash_map``; with uniform keys about capacity /
  rows of a batch's keys hit it once it is full, the rest are fetched from the ``hash_map`` and
  inserted, evicting others;
* ``rocks_db``: ``gpucache: false``, no volatile database, the persistent ``rocks_db`` in the run's
  work directory (the Python server's tier is rocksdict's, the C++ server's librocksdb's, on the
  same files, one process at a time);
* ``redis_cluster``: ``gpucache: false``, the volatile ``redis_cluster`` (``num_partitions`` 5, as
  many as ``num_node_connections``) on a cluster of 3 ``redis-server`` nodes on loopback ports that
  this script starts (``LocalRedisCluster``, its files in the work directory) and stops at the end;

and each graph form (``--forms``):

* ``before Init``: a Keras model of one ``hps.LookupLayer`` exported while HPS is not running (the
  graph holds the whole lookup, by name: one ``SokPyCall``);
* ``running``: the same model exported on a running server (``SokResolveTable`` and
  ``SokFindOrDefault`` on its tables; the misses' fetch a ``SokPyCall``);

the SavedModel's serving signature is timed three ways on the same batches, in the same run:

* ``python``: in this process, ``tf.saved_model.load(path).serve`` (how users serve from Python:
  the lookups' calls go to the Python server), taking turns call by call with
* ``gather``: ``tf.gather`` on a resident ``tf.Variable`` of the same rows, in a ``tf.function``,
  in this process: the baseline of every ratio;
* ``C++``: ``hps_serve_cpp.cc`` (beside this script, compiled by it against this TensorFlow's C
  API) in a subprocess with no ``PYTHON*`` variable: sok-core's op libraries and sok-hps's
  ``libsok_hps_serving.so`` loaded, the lookups answered by the C++ server. It takes turns call by
  call with ``gather C++``, a SavedModel of the ``tf.gather`` above served by the same program.

A batch is ``B`` samples x 26 keys (int64, uniform over the rows); ``--pool`` batches per B are
cycled through: ``--warmup`` unrecorded calls, then ``--iters`` timed ones. Printed per setup,
form, path and B: M lookups/s (keys over the mean call time), p50 and p99 latency (ms); ``vs
gather`` = this process's ``tf.gather`` p50 over the path's p50 (1.0 = as fast as ``tf.gather``);
for ``C++``, ``vs C++ gather`` (the ``gather C++`` p50 over its p50: the same process's baseline)
and ``C++ / Python`` (the ``python`` p50 over its p50: above 1, C++ is faster). Then where the C++
calls spend their time: the Session run, freeing its output, and making a feed from the ids (not
part of a call), whether libpython was mapped into the C++ process, the evicting cache's capacity,
each setup and form's seconds, and each skipped setup with its reason. Checked (an error where
not): the Python rows equal ``tf.gather``'s for the first batch of each B, and the C++ rows (their
sum: ``check_cpp``) the C++ ``tf.gather``'s for that batch before the warmup and again after the
timed calls. Goals (issue 39, ``--check``), libpython absent, and at B >= 4,096:

* on the CPU (``--device cpu``): the C++ path's ``hash_map`` >= 0.8x ``tf.gather``;
* on a GPU (``--device gpu``, the default where TensorFlow sees one: the ``tf.gather`` table on the
  GPU, the HPS caches there too): the C++ path's warm ``cache`` (the graph traced on a running
  server: its lookup reads the cache on the GPU) >= 0.9x the C++ ``tf.gather`` (both C++ paths
  fetch their output to the host).

On a GPU the setup whose C++ rows are in host memory (``hash_map``; the caches, ``cache`` and
``evicting_cache``, are on the GPU in both servers) is shown against the PCIe floor, what the link does:
``copy_bandwidth.cu`` (beside this script, compiled with nvcc: on PATH, else under
``$CUDA_HOME/bin`` or ``/usr/local/cuda/bin``) times ``cudaMemcpyAsync`` between page-locked host
memory (``cudaMallocHost``) and GPU memory with CUDA events, the median of ``--iters`` copies after
``--warmup``, both ways, for 256 MiB (printed as the link's GB/s) and for each B's rows (B x 26 x
dim float32), before TensorFlow takes the GPU. The floor of B is the rows' bytes over the
host-to-GPU bandwidth measured for a copy of that many bytes; the ratio printed per setup, form
and B is ``(C++ gather p50 + floor) / C++ p50``: both C++ calls fetch their output to the host,
so the C++ gather plus one copy of the rows at link speed is the best a tier with its rows in
host memory could do in this benchmark (1.0: as fast as that; issue 39's goal is 0.9). Where nvcc
is missing or the program fails, the output says why and the floor falls back to TensorFlow's copy
of the rows' bytes from a pageable host tensor to the GPU (p50 of ``--iters``), labelled as such:
it runs well below the link, so that floor flatters.

The default ``--setups`` are ``cache`` and ``hash_map`` (the full sweep: about 3 minutes on the
2-core CPU VM of benchmarks/README.md). What the others cost there, per graph form at the default
table and B 1, 256, 4,096, 16,384 and 65,536 (the run prints its own ``seconds per setup and
form``): ``evicting_cache`` about 45 s (``hash_map`` 20-40 s), ``redis_cluster`` 65-90 s,
``rocks_db`` 115-205 s (before f07b952, whose faster reads about halved it at B 256 to 65,536).
Every key of ``redis_cluster`` and ``rocks_db`` is a database read in both servers (on that VM about
1-2 us a distinct key in Redis; in RocksDB 0.6-1.4 from the C++ server and 1.8-2.9 from the Python
one: B 65,536 takes 0.2-1.5 s a call), and each server's start (three per setup and form) writes the
table into the database; cut ``--batches`` or ``--iters`` there. A setup whose service is missing is
skipped with the reason printed, never silently: no ``redis-server`` / ``redis-cli`` on PATH or no
``redis`` Python package (``redis_cluster``), no ``rocksdict`` (``rocks_db``), or, where the C++
paths run, a build of sok-hps without that C++ tier
(``hierarchical_parameter_server._tiers.WITH_REDIS`` / ``WITH_ROCKSDB``: libhiredis-dev,
librocksdb-dev, ``ci/setup.sh``).

Usage::

    .venv/bin/python benchmarks/hps_cpp.py                 # the full sweep, B 1 .. 65,536
    .venv/bin/python benchmarks/hps_cpp.py --quick         # CI-sized: small table, B 1 .. 4,096
    .venv/bin/python benchmarks/hps_cpp.py --setups hash_map --forms before_init --batches 4096 65536
    .venv/bin/python benchmarks/hps_cpp.py --setups evicting_cache rocks_db redis_cluster --batches 1 256 4096
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up banner out of the table

import numpy as np  # noqa: E402
from hps_cpu import KEYS_PER_SAMPLE, machine_context, summary, timed  # noqa: E402

DRIVER = Path(__file__).with_name("hps_serve_cpp.cc")
COPY_BANDWIDTH = Path(__file__).with_name("copy_bandwidth.cu")
LINK_BYTES = 1 << 28  # the copies whose bandwidth is printed as the link's (256 MiB)
HOST_ROW_SETUPS = ("hash_map",)  # setups whose C++ rows are in host memory (the caches are on the GPU)
SETUPS = ("cache", "hash_map", "evicting_cache", "rocks_db", "redis_cluster")
DEFAULT_SETUPS = ("cache", "hash_map")
EVICTING_CACHE_PER = 0.25  # the evicting_cache setup's gpucacheper
REDIS_NODES = 3
REDIS_PARTITIONS = 5  # the redis_cluster setup's num_partitions: at least num_node_connections (5)
FORMS = {"before_init": "before Init", "running": "running"}
DEFAULT_BATCHES = (1, 16, 256, 1024, 4096, 16384, 65536)
QUICK_BATCHES = (1, 64, 1024, 4096)
GOAL = 0.8  # on the CPU: the C++ hash_map's p50 against tf.gather's, at B >= GOAL_MIN_BATCH
GPU_GOAL = 0.9  # on a GPU: the C++ warm cache's p50 against the C++ tf.gather's, at B >= GOAL_MIN_BATCH
GOAL_MIN_BATCH = 4096
TRACED_CALLS = 5  # per C++ model and B, after the timed ones: the ops' times (FULL_TRACE)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=196608, help="table rows (default 196,608)")
    p.add_argument("--dim", type=int, default=32, help="embedding width (default 32)")
    p.add_argument("--batches", type=int, nargs="+", default=None, help="samples per batch (x 26 keys)")
    p.add_argument(
        "--setups",
        nargs="+",
        choices=SETUPS,
        default=list(DEFAULT_SETUPS),
        help=f"ps_configs to serve (default: {' '.join(DEFAULT_SETUPS)})",
    )
    p.add_argument("--forms", nargs="+", choices=sorted(FORMS), default=list(FORMS))
    p.add_argument("--iters", type=int, default=30, help="timed calls per path and batch (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="unrecorded calls per path and batch (default 3)")
    p.add_argument("--pool", type=int, default=4, help="distinct batches cycled through (default 4)")
    p.add_argument("--quick", action="store_true", help="CI-sized: 12,288 rows, dim 16, B 1 .. 4,096, 10 calls")
    p.add_argument("--no-cpp", action="store_true", help="leave out the C++ paths (no compiler needed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write configuration, machine and every result here")
    p.add_argument("--check", action="store_true", help="exit status 1 when a goal is missed")
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="where tf.gather's table is (auto: a GPU if any)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.dim, args.iters, args.warmup = 12288, 16, 10, 2
        args.batches = args.batches or list(QUICK_BATCHES)
    args.batches = args.batches or list(DEFAULT_BATCHES)
    return args


# -- the C++ driver -------------------------------------------------------------------------------
def driver_missing() -> str:
    """Why ``hps_serve_cpp.cc`` cannot be compiled here (no compiler, no C API headers or library in
    this TensorFlow), or ``""``; compiles nothing."""
    import tensorflow as tf

    include, lib = Path(tf.sysconfig.get_include()), Path(tf.sysconfig.get_lib())
    if (shutil.which("g++") or shutil.which("c++")) is None:
        return "no C++ compiler (g++ or c++) on PATH; install one (apt-get install g++)"
    if not (include / "tensorflow" / "c" / "c_api.h").exists():
        return f"this TensorFlow has no C API headers under {include}"
    if not (lib / "libtensorflow_cc.so.2").exists():
        return f"this TensorFlow has no libtensorflow_cc.so.2 in {lib}"
    return ""


def build_driver(directory: str) -> tuple[str | None, str]:
    """``(program, "")``: ``hps_serve_cpp.cc`` compiled into ``directory`` against this TensorFlow's
    C API, or ``(None, why not)``."""
    import tensorflow as tf

    missing = driver_missing()
    if missing:
        return None, missing
    compiler = shutil.which("g++") or shutil.which("c++")
    include, lib = Path(tf.sysconfig.get_include()), Path(tf.sysconfig.get_lib())
    program = os.path.join(directory, "hps_serve_cpp")
    command = [compiler, "-std=c++17", "-O2", str(DRIVER), f"-I{include}", f"-L{lib}", "-l:libtensorflow_cc.so.2"]
    command += ["-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{lib}", "-o", program]
    built = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if built.returncode != 0:
        return None, f"compiling {DRIVER.name} failed: {built.stderr[-2000:]}"
    return program, ""


def serving_libraries() -> tuple[list[str], str]:
    """``(the op libraries a C++ server loads, "")``, or ``([], why not)``."""
    from hierarchical_parameter_server import graph_calls

    try:
        return graph_calls.serving_libraries(), ""
    except FileNotFoundError as error:
        return [], str(error)


def signature_names(path: str) -> tuple[str, str]:
    """The tensor names of the SavedModel's ``serving_default`` input and output."""
    inputs, outputs = signature_tensors(path)
    return next(iter(inputs.values())), next(iter(outputs.values()))


def signature_tensors(path: str) -> tuple[dict[str, str], dict[str, str]]:
    """The SavedModel's ``serving_default`` inputs and outputs: argument or output name -> tensor name."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString(Path(path, "saved_model.pb").read_bytes())
    signature = saved.meta_graphs[0].signature_def["serving_default"]
    return {k: v.name for k, v in signature.inputs.items()}, {k: v.name for k, v in signature.outputs.items()}


def run_driver(command: list[str], extra_env: dict[str, str] | None = None) -> dict:
    """The JSON line the C++ driver prints, run as ``command`` with no ``PYTHON*`` variable (and the
    variables of ``extra_env`` set).

    Raises:
        RuntimeError: the driver failed (its exit status and the end of its stderr).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    env |= extra_env or {}
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the C++ driver failed (exit status {done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def serve_cpp(program: str, models: list[str], ids_file: str, args: argparse.Namespace, libraries: list[str]) -> dict:
    """The driver's JSON line: ``models`` served taking turns, on the batches of ``ids_file``; under
    ``"ops"``, per model and B, the median time of each op type over its traced calls."""
    traces = tempfile.mkdtemp(prefix="traces_", dir=os.path.dirname(ids_file))
    command = [program, "--trace", traces, "--traces", str(TRACED_CALLS), "--ids", ids_file]
    command += ["--cols", str(KEYS_PER_SAMPLE), "--batches", ",".join(map(str, args.batches))]
    command += ["--pool", str(args.pool), "--warmup", str(args.warmup), "--iters", str(args.iters)]
    for path in models:
        command += ["--model", path, *signature_names(path)]
    for library in libraries:
        command += ["--library", library]
    served = run_driver(command)
    for i, model in enumerate(served["models"]):
        model["ops"] = {b: op_times(traces, i, b) for b in args.batches}
    shutil.rmtree(traces, ignore_errors=True)
    return served


def op_times(traces: str, model: int, batch: int) -> dict[str, float]:
    """Milliseconds per op type (medians over the traced calls of ``model`` at ``batch``), and
    ``"step"``: the traced call's span from its first op's start to its last op's end."""
    from tensorflow.core.protobuf import config_pb2

    calls: list[dict[str, float]] = []
    for k in range(TRACED_CALLS):
        metadata = config_pb2.RunMetadata()
        metadata.ParseFromString(Path(traces, f"m{model}_b{batch}_{k}.pb").read_bytes())
        times: dict[str, float] = {}
        start, end = float("inf"), 0.0
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                label = node.timeline_label.split(" = ", 1)[-1].split("(", 1)[0] or node.node_name
                times[label] = times.get(label, 0.0) + node.all_end_rel_micros / 1e3
                start = min(start, node.all_start_micros)
                end = max(end, node.all_start_micros + node.all_end_rel_micros)
        times["step"] = (end - start) / 1e3
        calls.append(times)
    return {op: float(np.median([c.get(op, 0.0) for c in calls])) for op in calls[0]}


# -- the setups ----------------------------------------------------------------------------------
def setup_missing(setup: str, cpp: bool) -> str:
    """Why ``setup`` cannot be served here (its service, its Python library, or, where the C++
    paths run (``cpp``), this build's C++ tier for it is missing), or ``""``."""
    if setup == "rocks_db":
        if importlib.util.find_spec("rocksdict") is None:
            return "the Python server's rocks_db tier needs rocksdict: pip install 'sok-hps[rocksdb]'"
        from hierarchical_parameter_server import _tiers

        if cpp and not _tiers.WITH_ROCKSDB:
            return (
                "this build of sok-hps has no C++ rocks_db tier (_tiers.WITH_ROCKSDB is False): install "
                "librocksdb-dev (ci/setup.sh) and rebuild sok-hps, or pass --no-cpp"
            )
    if setup == "redis_cluster":
        for tool in ("redis-server", "redis-cli"):
            if shutil.which(tool) is None:
                return f"no {tool} on PATH to start a local cluster: apt-get install redis-server"
        if importlib.util.find_spec("redis") is None:
            return "the Python server's redis_cluster tier needs the redis package: pip install 'sok-hps[redis]'"
        from hierarchical_parameter_server import _tiers

        if cpp and not _tiers.WITH_REDIS:
            return (
                "this build of sok-hps has no C++ redis_cluster tier (_tiers.WITH_REDIS is False): install "
                "libhiredis-dev (ci/setup.sh) and rebuild sok-hps, or pass --no-cpp"
            )
    return ""


# -- the SavedModels ------------------------------------------------------------------------------
def ps_config(setup: str, folder: str, args: argparse.Namespace, workdir: str, redis: str | None) -> dict[str, Any]:
    """The ps_config of ``setup`` for the table in ``folder``; ``rocks_db`` keeps its database in
    ``workdir``, ``redis_cluster`` takes the cluster at ``redis`` (``host:port,...``)."""
    model = {
        "model": "bench",
        "sparse_files": [folder],
        "embedding_vecsize_per_table": [args.dim],
        "maxnum_catfeature_query_per_table_per_sample": [KEYS_PER_SAMPLE],
        "default_value_for_each_table": [0.0],
        "deployed_device_list": [0],
        "max_batch_size": max(args.batches),
        "hit_rate_threshold": 1.0,  # every lookup exact: misses are fetched before the call returns
        "gpucache": setup in ("cache", "evicting_cache"),
        "gpucacheper": EVICTING_CACHE_PER if setup == "evicting_cache" else 1.0,
    }
    volatile, persistent = {"type": "disabled"}, {"type": "disabled"}
    if setup in ("hash_map", "evicting_cache"):
        volatile = {"type": "hash_map"}
    elif setup == "redis_cluster":
        volatile = {"type": "redis_cluster", "address": redis, "num_partitions": REDIS_PARTITIONS}
    elif setup == "rocks_db":
        persistent = {"type": "rocks_db", "path": os.path.join(workdir, "rocks_db")}
    elif setup != "cache":
        raise ValueError(f"unknown setup {setup!r}; the setups are {', '.join(SETUPS)}")
    return {"supportlonglong": True, "models": [model], "volatile_db": volatile, "persistent_db": persistent}


def export_lookup(path: str, config_path: str, form: str, config: dict, args: argparse.Namespace) -> None:
    """A Keras model of one ``hps.LookupLayer``, exported on a server running from ``config``
    written to ``config_path``, or before ``hps.Init`` and before ``config_path`` is written
    (NVIDIA's flow: with the file there, tracing would start HPS and put its lookup in the graph)."""
    import hierarchical_parameter_server as hps
    import keras
    import tensorflow as tf
    from hierarchical_parameter_server import init

    def write() -> None:
        with open(config_path, "w") as f:
            json.dump(config, f)

    init.shutdown()
    if form == "running":
        write()
        init.Init(ps_config_file=config_path, global_batch_size=max(args.batches))
    ids = keras.Input(shape=(KEYS_PER_SAMPLE,), dtype="int64")
    layer = hps.LookupLayer(
        model_name="bench",
        table_id=0,
        emb_vec_size=args.dim,
        emb_vec_dtype=tf.float32,
        ps_config_file=config_path,
        global_batch_size=max(args.batches),
    )
    try:
        keras.Model(ids, layer(ids)).export(path, verbose=False)
    finally:
        init.shutdown()
    if form == "before_init":
        write()


def export_gather(path: str, table: Any) -> None:
    """``tf.gather`` on ``table`` (a ``tf.Variable``) as a SavedModel with a serving signature."""
    import tensorflow as tf

    module = tf.Module()
    module.table = table
    module.serve = tf.function(
        lambda ids: tf.gather(module.table, ids), input_signature=[tf.TensorSpec([None, KEYS_PER_SAMPLE], tf.int64)]
    )
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})


# -- the run --------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    import tensorflow as tf
    from hierarchical_parameter_server import init
    from hierarchical_parameter_server.testing_redis import LocalRedisCluster
    from tqdm import tqdm

    rng = np.random.default_rng(args.seed)
    workdir = tempfile.mkdtemp(prefix="hps_cpp_bench_")
    results: dict[str, Any] = {"paths": {}, "cpp": {}, "skipped_cpp": "", "skipped_setups": {}, "wall_s": {}}
    try:
        program, why_not = (None, "--no-cpp") if args.no_cpp else build_driver(workdir)
        libraries: list[str] = []
        if program is not None:
            libraries, why_not = serving_libraries()
        if why_not:
            results["skipped_cpp"] = why_not
            program = None
            print(f"C++: skipped ({why_not})")
        setups = []
        for setup in args.setups:
            missing = setup_missing(setup, cpp=program is not None)
            if missing:
                results["skipped_setups"][setup] = missing
                print(f"{setup}: skipped ({missing})")
            else:
                setups.append(setup)
        sys.stdout.flush()
        if args.device != "/CPU:0":  # before TensorFlow takes the GPU's memory
            results["pcie_floor"] = pcie_floor(args, workdir)
        folder = os.path.join(workdir, "table")
        os.makedirs(folder)
        weights = rng.random((args.rows, args.dim), dtype=np.float32)
        np.arange(args.rows, dtype=np.int64).tofile(os.path.join(folder, "key"))
        weights.tofile(os.path.join(folder, "emb_vector"))
        with tf.device(args.device):
            table = tf.Variable(weights)
        with tf.device("/CPU:0"):
            pools = {
                b: [
                    tf.constant(rng.integers(0, args.rows, size=(b, KEYS_PER_SAMPLE)), tf.int64)
                    for _ in range(args.pool)
                ]
                for b in args.batches
            }
        ids_file = os.path.join(workdir, "ids.bin")
        with open(ids_file, "wb") as f:
            for b in args.batches:
                for ids in pools[b]:
                    ids.numpy().tofile(f)
        gather = tf.function(lambda ids: tf.gather(table, ids))
        gather_saved = os.path.join(workdir, "gather")
        export_gather(gather_saved, table)
        runs = [(setup, form) for setup in setups for form in args.forms]
        with (
            tqdm(total=len(runs) * len(args.batches), desc="hps C++", unit="run", file=sys.stderr) as bar,
            contextlib.ExitStack() as services,
        ):
            redis = None
            if "redis_cluster" in setups:  # stopped when the runs end, however they end
                cluster = LocalRedisCluster(os.path.join(workdir, "redis"), nodes=REDIS_NODES)
                redis = services.enter_context(cluster).address
            for setup, form in runs:
                name, started = f"{setup}/{form}", time.perf_counter()
                config_path = os.path.join(workdir, f"{setup}_{form}.json")
                saved = os.path.join(workdir, f"{setup}_{form}")
                export_lookup(saved, config_path, form, ps_config(setup, folder, args, workdir, redis), args)

                python = tf.saved_model.load(saved).serve
                paths: dict[str, dict] = {"python": {}, "gather": {}}
                for b in args.batches:
                    np.testing.assert_array_equal(
                        python(pools[b][0]).numpy(),
                        gather(pools[b][0]).numpy(),
                        err_msg=f"{name} served from Python at B={b}: other rows than tf.gather's",
                    )
                    samples, baseline = timed([python, gather], pools[b], args.warmup, args.iters)
                    paths["python"][b] = summary(samples, b * KEYS_PER_SAMPLE)
                    paths["gather"][b] = summary(baseline, b * KEYS_PER_SAMPLE)
                    bar.update(1 if program is None else 0.5)
                del python
                init.shutdown()
                if program is not None:
                    served = serve_cpp(program, [saved, gather_saved], ids_file, args, libraries)
                    check_cpp(name, served)
                    results["cpp"][name] = served
                    for label, model in zip(("C++", "gather C++"), served["models"]):
                        paths[label] = {int(b): r for b, r in model["batches"].items()}
                    bar.update(0.5 * len(args.batches))
                results["paths"][name] = paths
                results["wall_s"][name] = time.perf_counter() - started
    finally:
        init.shutdown()  # the Python server's databases closed before their files go
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def rows_bytes(batch: int, dim: int) -> int:
    """The bytes of a lookup's rows: ``batch`` x 26 keys x ``dim`` float32."""
    return batch * KEYS_PER_SAMPLE * dim * 4


def find_nvcc() -> str | None:
    """nvcc: on PATH, else ``$CUDA_HOME/bin/nvcc``, else ``/usr/local/cuda/bin/nvcc``; None where none is."""
    found = shutil.which("nvcc")
    if found is not None:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


def build_copy_bandwidth(directory: str) -> tuple[str | None, str]:
    """``(program, "")``: ``copy_bandwidth.cu`` compiled with nvcc into ``directory``, or ``(None, why not)``."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None, (
            "nvcc not found (not on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin): install the CUDA toolkit or "
            "put its bin/ on PATH"
        )
    program = os.path.join(directory, "copy_bandwidth")
    command = [nvcc, "-O2", "-std=c++17", str(COPY_BANDWIDTH), "-o", program]
    built = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if built.returncode != 0:
        return None, f"{nvcc} failed on {COPY_BANDWIDTH.name} (exit status {built.returncode}): {built.stderr[-2000:]}"
    return program, ""


def parse_copy_bandwidth(stdout: str, sizes: list[int]) -> dict[str, Any]:
    """copy_bandwidth's JSON line (the last line of ``stdout``): its ``name``, ``iters``, ``warmup``
    and, under ``"sizes"``, each size's ``h2d_ms``, ``d2h_ms``, ``h2d_gbps``, ``d2h_gbps`` by its
    bytes (int), checked to hold every one of ``sizes`` with positive figures.

    Raises:
        ValueError: the line is not such a JSON object (what is wrong, and the line).
    """
    lines = stdout.strip().splitlines()
    line = lines[-1] if lines else ""
    try:
        measured = json.loads(line)
        by_bytes = {int(entry["bytes"]): entry for entry in measured["sizes"]}
        fields = ("h2d_ms", "d2h_ms", "h2d_gbps", "d2h_gbps")
        figures = {b: {k: float(by_bytes[b][k]) for k in fields} for b in sizes}
        out = {"name": str(measured["name"]), "iters": int(measured["iters"]), "warmup": int(measured["warmup"])}
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"copy_bandwidth's output is not its JSON line with the sizes {sizes} ({type(error).__name__}: "
            f"{error}): {line[:500]!r}"
        ) from error
    bad = {b: f for b, f in figures.items() if not all(v > 0 and np.isfinite(v) for v in f.values())}
    if bad:
        raise ValueError(
            f"copy_bandwidth measured times or bandwidths that are not positive: {bad}; line {line[:500]!r}"
        )
    return out | {"sizes": figures}


def link_floor(measured: dict[str, Any], batches: list[int], dim: int) -> dict[int, dict[str, float]]:
    """Per B, from copy_bandwidth's figures (parse_copy_bandwidth): the rows' ``bytes``, the
    bandwidths measured for a copy of that many bytes (``h2d_gbps``, ``d2h_gbps``: 10^9 bytes a
    second) and ``floor_ms``, the bytes over the host-to-GPU one."""
    floor = {}
    for b in batches:
        size = rows_bytes(b, dim)
        figures = measured["sizes"][size]
        floor[b] = {
            "bytes": size,
            "h2d_gbps": figures["h2d_gbps"],
            "d2h_gbps": figures["d2h_gbps"],
            "floor_ms": size / (figures["h2d_gbps"] * 1e6),
        }
    return floor


def host_tier_ratio(cpp_gather_p50_ms: float, floor_ms: float, cpp_p50_ms: float) -> float:
    """``(C++ gather p50 + floor) / C++ p50``: a C++ path whose rows are in host memory against the
    C++ ``tf.gather`` plus one copy of the rows to the GPU at the floor (1.0: as fast as that)."""
    return (cpp_gather_p50_ms + floor_ms) / cpp_p50_ms


def pcie_floor(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    """The PCIe floor of each B (see the module docstring): ``{"source": "copy_bandwidth", "name",
    "iters", "warmup", "link": {h2d_gbps, d2h_gbps, bytes}, "batches": link_floor(...)}``, or where
    nvcc or the program fails, ``{"source": "tensorflow_copy", "why", "batches": {B: {bytes,
    floor_ms, h2d_gbps}}}`` from TensorFlow's copy (tensorflow_copy_floor)."""
    program, why = build_copy_bandwidth(workdir)
    if program is not None:
        sizes = sorted({rows_bytes(b, args.dim) for b in args.batches} | {LINK_BYTES})
        command = [program, "--iters", str(args.iters), "--warmup", str(args.warmup), *map(str, sizes)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            why = f"copy_bandwidth failed (exit status {done.returncode}): {done.stderr.strip()[-2000:]}"
        else:
            measured = parse_copy_bandwidth(done.stdout, sizes)
            link = measured["sizes"][LINK_BYTES]
            return {
                "source": "copy_bandwidth",
                "name": measured["name"],
                "iters": measured["iters"],
                "warmup": measured["warmup"],
                "link": {"bytes": LINK_BYTES, "h2d_gbps": link["h2d_gbps"], "d2h_gbps": link["d2h_gbps"]},
                "batches": link_floor(measured, args.batches, args.dim),
            }
    print(
        f"PCIe floor: {why}; falling back to TensorFlow's copy from a pageable host tensor (not the link's bandwidth)"
    )
    return {"source": "tensorflow_copy", "why": why, "batches": tensorflow_copy_floor(args)}


def tensorflow_copy_floor(args: argparse.Namespace) -> dict[int, dict[str, float]]:
    """Per B: TensorFlow's copy of a lookup's rows (B x 26 x dim float32) from a (pageable) host
    tensor to the GPU, the p50 of ``--iters`` copies as ``floor_ms``; the fallback of pcie_floor."""
    import tensorflow as tf

    @tf.function
    def copy(x: tf.Tensor) -> tf.Tensor:
        with tf.device(args.device):  # the identity on the GPU takes x there; the sum reads all of it
            return tf.reduce_sum(tf.identity(x))

    floor = {}
    for b in args.batches:
        with tf.device("/CPU:0"):
            host = tf.constant(np.ones((b * KEYS_PER_SAMPLE, args.dim), np.float32))
        (samples,) = timed([copy], [host], args.warmup, args.iters)
        p50 = summary(samples, b * KEYS_PER_SAMPLE)["p50_ms"]
        size = rows_bytes(b, args.dim)
        floor[b] = {"bytes": size, "floor_ms": p50, "h2d_gbps": size / (p50 * 1e6)}
    return floor


def check_cpp(name: str, served: dict) -> None:
    """The C++ lookup's rows must sum as ``tf.gather``'s in the same process (the same rows), for
    the first batch of each B before the timed calls and again after them (``checksum_after``: an
    evicting cache has evicted rows by then)."""
    setup, form = name.split("/")
    hps_rows, gather_rows = (model["batches"] for model in served["models"])
    for b, r in hps_rows.items():
        for key, when in (("checksum", "before"), ("checksum_after", "after")):
            if not np.isclose(r[key], gather_rows[b][key], rtol=1e-12, atol=0):
                raise AssertionError(
                    f"{name}: the C++ server's rows at B={b} ({when} the timed calls) sum to {r[key]!r}, "
                    f"tf.gather's to {gather_rows[b][key]!r}: the C++ path served other rows than the table's "
                    f"(reproduce it alone: --setups {setup} --forms {form} --batches {b})"
                )


# -- report ---------------------------------------------------------------------------------------
def report(args: argparse.Namespace, results: dict[str, Any]) -> list[str]:
    """Prints the tables; returns the missed goals."""
    print(f"table {args.rows} x {args.dim} float32, {KEYS_PER_SAMPLE} keys per sample, {args.iters} timed calls "
          f"(after {args.warmup}) over {args.pool} batches, tf.gather on {args.device}")  # fmt: skip
    gpu = args.device != "/CPU:0"
    print(f"{'setup':<14} {'graph':<12} {'path':<11} {'B':>6} {'M lookups/s':>12} {'p50 ms':>9} {'p99 ms':>9} "
          f"{'vs gather':>10} {'vs C++ gather':>14} {'C++ / Python':>13}")  # fmt: skip
    missed = []
    for name, paths in results["paths"].items():
        setup, form = name.split("/")
        for b in args.batches:
            gather = paths["gather"][b]["p50_ms"]
            for label in ("python", "C++", "gather", "gather C++"):
                if label not in paths:
                    continue
                r = paths[label][b]
                r["vs_gather"] = gather / r["p50_ms"]
                cells = ["", ""]
                if label == "C++":
                    r["vs_cpp_gather"] = paths["gather C++"][b]["p50_ms"] / r["p50_ms"]
                    r["vs_python"] = paths["python"][b]["p50_ms"] / r["p50_ms"]
                    cells = [f"{r['vs_cpp_gather']:.2f}", f"{r['vs_python']:.2f}"]
                    if not gpu and setup == "hash_map" and b >= GOAL_MIN_BATCH and r["vs_gather"] < GOAL:
                        missed.append(f"C++ {name} at B={b}: {r['vs_gather']:.2f}x tf.gather < {GOAL}x")
                    if gpu and name == "cache/running" and b >= GOAL_MIN_BATCH and r["vs_cpp_gather"] < GPU_GOAL:
                        missed.append(f"C++ {name} at B={b}: {r['vs_cpp_gather']:.2f}x C++ tf.gather < {GPU_GOAL}x")
                ratio = "" if label == "gather" else f"{r['vs_gather']:.2f}"
                print(f"{setup:<14} {FORMS[form]:<12} {label:<11} {b:>6} {r['mlookups_s']:>12.2f} {r['p50_ms']:>9.3f} "
                      f"{r['p99_ms']:>9.3f} {ratio:>10} {cells[0]:>14} {cells[1]:>13}")  # fmt: skip
    if any(name.startswith("evicting_cache/") for name in results["paths"]):
        from hierarchical_parameter_server.cache import capacity_of

        capacity = capacity_of(args.rows, EVICTING_CACHE_PER)
        print(f"evicting_cache: a cache of {capacity} of the {args.rows} rows (gpucacheper {EVICTING_CACHE_PER}); "
              f"uniform keys hit it about {capacity / args.rows:.0%} of the time once it is full")  # fmt: skip
    for setup, why in results["skipped_setups"].items():
        print(f"{setup}: skipped ({why})")
    walls = ", ".join(f"{name} {s:.0f}" for name, s in results["wall_s"].items())
    print(f"seconds per setup and form (the exports, the servers' starts, every path and B): {walls}")
    if results["cpp"]:
        print_phases(args, results["cpp"])
        for name, served in results["cpp"].items():
            first = served["models"][0]
            print(f"C++ {name}: SavedModel loaded in {first['load_s']:.2f} s, first call (the server's start) "
                  f"{first['first_call_ms']:.1f} ms, libpython {served['libpython']}")  # fmt: skip
            if served["libpython"] != "absent":
                missed.append(f"C++ {name}: libpython was mapped into the C++ process")
        large = any(b >= GOAL_MIN_BATCH for b in args.batches)
        if not gpu and large and any(n.startswith("hash_map/") for n in results["cpp"]):
            ok = not any(m.startswith("C++ hash_map/") and "tf.gather" in m for m in missed)
            print(f"{'PASS' if ok else 'FAIL'}: C++ hash_map >= {GOAL}x tf.gather at B >= {GOAL_MIN_BATCH}")
        if gpu and large and "cache/running" in results["cpp"]:
            ok = not any(m.startswith("C++ cache/running") for m in missed)
            print(f"{'PASS' if ok else 'FAIL'}: C++ warm cache >= {GPU_GOAL}x C++ tf.gather at B >= {GOAL_MIN_BATCH}")
        ok = all(s["libpython"] == "absent" for s in results["cpp"].values())
        print(f"{'PASS' if ok else 'FAIL'}: no Python in the C++ process (libpython never mapped)")
    else:
        print(f"C++: skipped ({results['skipped_cpp']})")
    if gpu:
        print_floor(args, results)
    return missed


def print_floor(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """The PCIe floor (pcie_floor), then the C++ paths of HOST_ROW_SETUPS against it:
    host_tier_ratio per setup, form and B (stored in the C++ results as ``vs_host_floor``)."""
    floor = results["pcie_floor"]
    if floor["source"] == "copy_bandwidth":
        link = floor["link"]
        print(f"PCIe floor: copy_bandwidth.cu on {floor['name']}, cudaMemcpyAsync between page-locked host memory "
              f"and the GPU, median of {floor['iters']} copies (after {floor['warmup']}): the link (256 MiB copies) "
              f"host to GPU {link['h2d_gbps']:.1f} GB/s, GPU to host {link['d2h_gbps']:.1f} GB/s")  # fmt: skip
        for b, f in floor["batches"].items():
            print(f"  B={b}: rows {f['bytes'] / 1e6:.1f} MB, host to GPU {f['h2d_gbps']:.1f} GB/s (floor "
                  f"{f['floor_ms']:.3f} ms), GPU to host {f['d2h_gbps']:.1f} GB/s")  # fmt: skip
    else:
        print(f"PCIe floor: TensorFlow's copy of the rows' bytes from a pageable host tensor to the GPU, NOT the "
              f"link's bandwidth ({floor['why']})")  # fmt: skip
        for b, f in floor["batches"].items():
            print(f"  B={b}: rows {f['bytes'] / 1e6:.1f} MB, {f['h2d_gbps']:.1f} GB/s (floor {f['floor_ms']:.3f} ms)")
    host_rows = {n: p for n, p in results["paths"].items() if n.split("/")[0] in HOST_ROW_SETUPS and "C++" in p}
    if host_rows:
        print("C++ paths with their rows in host memory against the best such a tier could do here: "
              "(C++ gather p50 + the rows' copy to the GPU at the floor) / C++ p50")  # fmt: skip
    for name, paths in host_rows.items():
        cells = []
        for b in args.batches:
            r = paths["C++"][b]
            r["vs_host_floor"] = host_tier_ratio(
                paths["gather C++"][b]["p50_ms"], floor["batches"][b]["floor_ms"], r["p50_ms"]
            )
            cells.append(f"B={b}: {r['vs_host_floor']:.2f}")
        print(f"  {name}: " + ", ".join(cells))


def print_phases(args: argparse.Namespace, cpp: dict[str, Any]) -> None:
    """Where the C++ calls' time goes: the call's p50 split into the Session run and freeing its
    output; making a feed from the ids (outside the call); and from the traced calls, the step's
    span, the lookup's op (the slowest op), the other ops together, and ``gather C++``'s alike."""
    print(f"where a C++ call's time goes (ms): run and free are the timed calls' p50, feed (making the input "
          f"tensor, outside the call) its p50; step and the ops are medians of {TRACED_CALLS} calls traced "
          f"with FULL_TRACE")  # fmt: skip
    print(f"{'setup':<14} {'graph':<12} {'B':>6} {'run':>8} {'free':>7} {'feed':>7} {'step':>8} {'lookup op':<17} "
          f"{'ms':>8} {'other ops':>10} {'gather run':>11} {'gather op':>10}")  # fmt: skip
    for name, served in cpp.items():
        setup, form = name.split("/")
        hps_model, gather_model = served["models"]
        for b in args.batches:
            r, ops = hps_model["batches"][str(b)], dict(hps_model["ops"][b])
            step = ops.pop("step")
            op = max(ops, key=ops.get)
            others = sum(t for o, t in ops.items() if o != op)
            gather_op = gather_model["ops"][b].get("ResourceGather", float("nan"))
            print(f"{setup:<14} {FORMS[form]:<12} {b:>6} {r['run_p50_ms']:>8.3f} {r['free_p50_ms']:>7.3f} "
                  f"{served['feed_ms'][str(b)]:>7.3f} {step:>8.3f} {op:<17} {ops[op]:>8.3f} {others:>10.3f} "
                  f"{gather_model['batches'][str(b)]['run_p50_ms']:>11.3f} {gather_op:>10.3f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    gpu = args.device == "gpu" or (args.device == "auto" and bool(tf.config.list_logical_devices("GPU")))
    args.device = "/GPU:0" if gpu else "/CPU:0"
    machine = machine_context(args)
    print(" | ".join(f"{k} {v}" for k, v in machine.items()))
    sys.stdout.flush()
    results = run(args)
    missed = report(args, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": machine, "results": results}, f, indent=1, default=str)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
