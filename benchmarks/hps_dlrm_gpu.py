#!/usr/bin/env python
"""DLRM inference served by HPS on a GPU, against the same model reading a GPU-resident table.

The like-for-like run of NVIDIA's published HPS figure (reference §5): a DLRM with 13 dense
features and 26 int32 keys per sample into one table of 128-wide float32 rows, served with
``gpucacheper`` 0.2 and ``hit_rate_threshold`` 1.0, the same batch sent again and again (so the
cache answers every key), latency per batch of the whole inference. NVIDIA measured TF + HPS on an
A100 (32.7 M rows, Triton's server-side "compute infer"): 1,459 us at 4,096 samples. Those figures
come from another machine and another day: they are printed as a labelled constant, not a baseline.

The baseline of this run: the same model with ``tf.gather`` on a ``tf.Variable`` of the same rows
on the same GPU (no HPS), its calls taking turns with the HPS model's on the same batches. Both
use the same dense weights, and their outputs are checked equal before the timing.

The model: MLPerf DLRM's MLPs (bottom 512-256-128, top 1024-1024-512-256-1, ReLU, a sigmoid out),
dot interaction of the 27 vectors (the bottom MLP's output and the 26 embeddings: the 351 pairs
below the diagonal, then the bottom output: 479 inputs to the top MLP). The ps_config: one model,
``supportlonglong`` false, a ``hash_map`` volatile DB behind an evicting cache of 0.2 x the rows.

``--xla`` compiles the dense part (MLPs and interaction) with XLA in both models. ``--gpucacheper``
and ``--key-dtype`` (int64: ``supportlonglong`` true) change NVIDIA's settings (the run is then no
longer like for like).

Printed per B: p50 and p99 (ms) of the HPS model and of the gather model, ``vs gather`` (the gather
model's p50 over HPS's: 1.0 = HPS costs nothing), ``floor`` (the p50 of a ``tf.function`` that
returns a slice of its input, timed the same way: the call from Python and the synchronisation,
which a server-side figure such as NVIDIA's does not count), and NVIDIA's A100 TF + HPS figure where
it has one.

``--cpp`` then serves both models from C++, with no Python in the process (issue 39): after the
Python timing, while the server still runs, the HPS model (its ``hps.LookupLayer`` traced on the
running server, as the Python timing calls it, and the same dense weights) and the gather model
(``tf.gather`` on the ``tf.Variable``, the same weights) are exported as SavedModels whose serving
signature is ``(dense float32 [B, 13], keys [B, 26]) -> [B, 1]``; HPS is shut down in this process,
and ``hps_serve_cpp.cc`` (hps_cpp.py's driver, compiled against this TensorFlow's C API) loads
sok-core's op libraries and sok-hps's ``libsok_hps_serving.so`` (``graph_calls.serving_libraries``)
and serves both, taking turns call by call on the same batches (the ``--pool`` batches of each B,
written to files by this script), in a subprocess with no ``PYTHON*`` variable: its HPS lookups are
answered by the C++ server, started from the same ps_config. A C++ call is ``TF_SessionRun`` with
its feeds made beforehand in host memory, so it includes copying the feeds to the device and
fetching the ``[B, 1]`` output back, plus freeing that output; NVIDIA's figure is Triton's
server-side compute time. Checked (an error where not): the sum of each model's C++ outputs for the
first batch of each B, before the warmup and again after the timed calls, is the sum of the Python
HPS model's outputs for that batch within ``rtol`` 1e-5 and ``atol`` 1e-6 x B (the elementwise
tolerance that the Python models are checked equal with, summed over the batch). Printed per B:
the C++ HPS model's p50 and p99, the C++ gather model's p50, ``vs gather`` (the C++ gather p50 over
the C++ HPS p50), NVIDIA's A100 figure, and from the HPS model's traced calls (medians of five) the
step's span, its ``Sok*`` ops (the lookup) and its slowest op type; then whether libpython was
mapped into the C++ process.

Where the C++ server keeps the rows a lookup reads: a cache of every row (``--gpucacheper 1.0``)
on the GPU where the library was built with CUDA, read in place by the graph's ``SokFindOrDefault``
when the keys are int64 (``--key-dtype int64``); the evicting cache of ``gpucacheper`` below 1.0
(NVIDIA's 0.2) in host memory, and int32 keys on the GPU found through host copies
(docs/design/hps-serving.md, ``served_storage``). ``--device cpu`` runs everything on the CPU (the
script's test: a tiny ``--rows``); the default ``gpu`` needs one (exit status 2 without).

``--check``: exit status 1 when the HPS model's p50 from Python is above NVIDIA's figure at a B >=
4,096 that has one; with ``--cpp``, when the C++ HPS model's p50 is above it at a B >= 1,024 that
has one, or libpython was mapped into the C++ process.

Usage::

    python3 benchmarks/hps_dlrm_gpu.py                       # 4 Mi rows, B 256 .. 16,384
    python3 benchmarks/hps_dlrm_gpu.py --rows 32709138       # NVIDIA's table size (16 GB, slow to load)
    python3 benchmarks/hps_dlrm_gpu.py --cpp --batches 1024 2048 4096 8192 16384 --check   # served from C++ too
    python3 benchmarks/hps_dlrm_gpu.py --cpp --gpucacheper 1.0 --key-dtype int64   # the rows read in place from C++
    python3 benchmarks/hps_dlrm_gpu.py --device cpu --cpp --rows 4096 --batches 8 64 --iters 3   # the test's run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")

import hps_cpp  # noqa: E402
import numpy as np  # noqa: E402
from hps_cpu import machine_context, summary, timed  # noqa: E402

KEYS_PER_SAMPLE = 26
DENSE_FEATURES = 13
DIM = 128
BOTTOM = (512, 256, 128)
TOP = (1024, 1024, 512, 256, 1)
#: NVIDIA's TF + HPS latency (us) per batch on an A100-SXM4-80GB, merlin-tensorflow 23.02, Triton
#: 22.11 (reference §5): another machine and day, printed as a labelled constant.
PUBLISHED_A100_US = {32: 612, 64: 667, 256: 639, 1024: 849, 2048: 1059, 4096: 1459, 8192: 2490, 16384: 4131,
                     32768: 7795, 65536: 15036, 131072: 29374}  # fmt: skip
PYTHON_CHECK_MIN_BATCH = 4096  # --check without --cpp: the p50 from Python (its call's cost included)
CPP_CHECK_MIN_BATCH = 1024  # --check with --cpp: the C++ p50
#: The C++ outputs' sum for a batch against Python's: the elementwise tolerance the Python models are
#: checked equal with (rtol, atol), summed over the batch's B outputs.
SUM_RTOL, SUM_ATOL_PER_SAMPLE = 1e-5, 1e-6


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=1 << 22, help="table rows (default 4 Mi; NVIDIA's: 32,709,138)")
    p.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    p.add_argument("--iters", type=int, default=50, help="timed calls per model and batch (default 50)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--pool", type=int, default=1, help="distinct batches cycled through (default 1: NVIDIA's method)")
    p.add_argument("--xla", action="store_true", help="compile the MLPs and the interaction with XLA (jit_compile)")
    p.add_argument(
        "--gpucacheper",
        type=float,
        default=0.2,
        help="HPS's cache as a fraction of the rows (default 0.2: NVIDIA's; 1.0: a cache of every row)",
    )
    p.add_argument(
        "--key-dtype",
        choices=("int32", "int64"),
        default="int32",
        help="the keys' dtype (default int32: NVIDIA's, supportlonglong false; int64: supportlonglong true)",
    )
    p.add_argument(
        "--cpp",
        action="store_true",
        help="then serve both models from C++ (hps_serve_cpp.cc on TensorFlow's C API, no Python in the process)",
    )
    p.add_argument(
        "--device",
        choices=("gpu", "cpu"),
        default="gpu",
        help="where the models run (default gpu, which needs one; cpu: the script's test, with a tiny --rows)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write configuration, machine and figures here")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit status 1 when the HPS model's p50 from Python (its call's cost included) is above NVIDIA's "
        f"A100 figure at a B >= {PYTHON_CHECK_MIN_BATCH:,} that has one; with --cpp, when the C++ HPS model's "
        f"p50 is above it at a B >= {CPP_CHECK_MIN_BATCH:,} that has one, or libpython was mapped into the C++ "
        "process",
    )
    args = p.parse_args(argv)
    if not 0.0 < args.gpucacheper <= 1.0:
        p.error(f"--gpucacheper takes a fraction in (0, 1], not {args.gpucacheper!r}")
    if min(args.batches) <= 0:
        p.error(f"--batches takes positive sample counts, not {args.batches!r}")
    return args


def dense_model(tf):
    """The MLPs and the interaction: ``(forward, layers)``, ``forward`` being
    ``(dense [B, 13], emb [B, 26, 128]) -> [B, 1]`` and ``layers`` its Dense layers (their weights
    are a SavedModel's variables)."""
    init = tf.keras.initializers.GlorotUniform
    bottom = [tf.keras.layers.Dense(n, "relu", kernel_initializer=init(seed=i)) for i, n in enumerate(BOTTOM)]
    top = [
        tf.keras.layers.Dense(n, "relu" if i < len(TOP) - 1 else "sigmoid", kernel_initializer=init(seed=10 + i))
        for i, n in enumerate(TOP)
    ]
    rows, cols = np.tril_indices(KEYS_PER_SAMPLE + 1, -1)
    lower = tf.constant(rows * (KEYS_PER_SAMPLE + 1) + cols, tf.int32)

    def forward(dense, emb):
        x = dense
        for layer in bottom:
            x = layer(x)
        vectors = tf.concat([x[:, None, :], emb], axis=1)  # [B, 27, 128]
        products = tf.matmul(vectors, vectors, transpose_b=True)  # [B, 27, 27]
        pairs = tf.gather(tf.reshape(products, [-1, (KEYS_PER_SAMPLE + 1) ** 2]), lower, axis=1)
        z = tf.concat([x, pairs], axis=1)  # [B, 479]
        for layer in top:
            z = layer(z)
        return z

    return forward, bottom + top


def ps_config(folder: str, args: argparse.Namespace) -> dict:
    return {
        "supportlonglong": args.key_dtype == "int64",
        "models": [
            {
                "model": "dlrm",
                "sparse_files": [folder],
                "embedding_vecsize_per_table": [DIM],
                "maxnum_catfeature_query_per_table_per_sample": [KEYS_PER_SAMPLE],
                "default_value_for_each_table": [0.0],
                "deployed_device_list": [0],
                "max_batch_size": max(args.batches),
                "hit_rate_threshold": 1.0,
                "gpucache": True,
                "gpucacheper": args.gpucacheper,
            }
        ],
        "volatile_db": {"type": "hash_map"},
        "persistent_db": {"type": "disabled"},
    }


def run(args: argparse.Namespace, driver: tuple[str, list[str]] | None = None) -> dict:
    """The Python timing, then (``driver``: the C++ program and the op libraries it loads) the C++
    one; the figures per B."""
    import hierarchical_parameter_server as hps
    import tensorflow as tf
    from hierarchical_parameter_server import init

    rng = np.random.default_rng(args.seed)
    workdir = tempfile.mkdtemp(prefix="hps_dlrm_")
    results: dict = {"hps": {}, "gather": {}, "floor": {}, "python_checksum": {}}
    try:
        folder = os.path.join(workdir, "sparse_embedding0")
        os.makedirs(folder)
        start = time.perf_counter()
        weights = rng.random((args.rows, DIM), dtype=np.float32) - np.float32(0.5)
        np.arange(args.rows, dtype=np.int64).tofile(os.path.join(folder, "key"))
        weights.tofile(os.path.join(folder, "emb_vector"))
        path = os.path.join(workdir, "ps.json")
        with open(path, "w") as f:
            json.dump(ps_config(folder, args), f)
        hps.Init(ps_config_file=path, global_batch_size=max(args.batches))
        print(f"table {args.rows:,} x {DIM} written and loaded in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        key_dtype = tf.as_dtype(args.key_dtype)
        host_pools = {
            b: [
                (
                    rng.random((b, DENSE_FEATURES), dtype=np.float32),
                    rng.integers(0, args.rows, size=(b, KEYS_PER_SAMPLE)).astype(args.key_dtype),
                )
                for _ in range(args.pool)
            ]
            for b in args.batches
        }
        with tf.device(args.device):
            table = tf.Variable(weights)
            pools = {b: [(tf.constant(d), tf.constant(k)) for d, k in host_pools[b]] for b in args.batches}
        del weights
        forward, dense_layers = dense_model(tf)
        if args.xla:  # the lookups have no XLA kernels: only the dense part is compiled
            forward = tf.function(forward, jit_compile=True)
        layer = hps.LookupLayer(model_name="dlrm", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)

        def hps_model(dense, keys):  # placed as TensorFlow places it (on the CPU: no GPU is visible)
            return forward(dense, layer(keys))

        def gather_model(dense, keys):
            return forward(dense, tf.gather(table, keys))

        hps_infer = tf.function(lambda batch: hps_model(*batch))
        gather_infer = tf.function(lambda batch: gather_model(*batch))
        noop = tf.function(lambda batch: batch[0][:1])  # the call and synchronisation alone
        for b in args.batches:
            for i, batch in enumerate(pools[b]):  # equal outputs (and a warm cache) before the timing
                out = hps_infer(batch).numpy()
                np.testing.assert_allclose(out, gather_infer(batch).numpy(), rtol=1e-5, atol=1e-6)
                if i == 0:  # what the C++ outputs of this batch are checked against
                    results["python_checksum"][b] = float(out.sum(dtype=np.float64))
            samples, baseline, floor = timed([hps_infer, gather_infer, noop], pools[b], args.warmup, args.iters)
            results["hps"][b] = summary(samples, b * KEYS_PER_SAMPLE)
            results["gather"][b] = summary(baseline, b * KEYS_PER_SAMPLE)
            results["floor"][b] = summary(floor, b * KEYS_PER_SAMPLE)
            print(f"B={b}: done", file=sys.stderr)
        if driver is not None:
            start = time.perf_counter()
            saved = [os.path.join(workdir, "hps_model"), os.path.join(workdir, "gather_model")]
            export_model(saved[0], hps_model, dense_layers, key_dtype)  # traced on the running server
            export_model(saved[1], gather_model, dense_layers, key_dtype, table=table)
            files = write_batches(workdir, host_pools, args.batches)
            init.shutdown()  # the C++ server starts from the same ps_config in the C++ process
            print(f"SavedModels exported in {time.perf_counter() - start:.1f} s", file=sys.stderr)
            results["cpp"] = serve_cpp(driver, saved, files, args)
            check_cpp(results, args.batches)
    finally:
        init.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


# -- served from C++ ------------------------------------------------------------------------------
def export_model(path: str, infer, dense_layers: list, key_dtype, table=None) -> None:
    """``infer`` (``(dense, keys) -> [B, 1]``) as a SavedModel whose serving signature takes
    ``dense`` (float32 [B, 13]) and ``keys`` ([B, 26] of ``key_dtype``); its variables: the dense
    layers' weights, and ``table`` where given."""
    import tensorflow as tf

    module = tf.Module()
    # The tf.Variables under the layers' Keras variables: a SavedModel of the Keras variables
    # restores copies of them, which a session (TensorFlow's C API) leaves apart from the variables
    # the graph reads (uninitialized there).
    module.dense_variables = [v.value for layer in dense_layers for v in layer.variables]
    if table is not None:
        module.table = table
    module.serve = tf.function(
        infer,
        input_signature=[
            tf.TensorSpec([None, DENSE_FEATURES], tf.float32, name="dense"),
            tf.TensorSpec([None, KEYS_PER_SAMPLE], key_dtype, name="keys"),
        ],
    )
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})


def write_batches(workdir: str, host_pools: dict, batches: list[int]) -> tuple[str, str]:
    """The pools' keys and dense features in the driver's layout: ``(ids file, floats file)``, each
    holding, for each B in ``batches``' order, its pool's batches one after the other."""
    ids_file, floats_file = os.path.join(workdir, "ids.bin"), os.path.join(workdir, "dense.bin")
    with open(ids_file, "wb") as ids, open(floats_file, "wb") as floats:
        for b in batches:
            for dense, keys in host_pools[b]:
                keys.tofile(ids)
                dense.tofile(floats)
    return ids_file, floats_file


def serve_cpp(driver: tuple[str, list[str]], saved: list[str], files: tuple[str, str], args) -> dict:
    """Both SavedModels served by the C++ driver, taking turns on the batches in ``files``: per
    model (``hps``, ``gather``) and B the driver's figures and checksums, ``libpython``, the loads,
    and under ``ops`` the HPS model's op times per B (medians of traced calls, hps_cpp.op_times)."""
    program, libraries = driver
    ids_file, floats_file = files
    traces = tempfile.mkdtemp(prefix="traces_", dir=os.path.dirname(ids_file))
    command = [program, "--ids", ids_file, "--ids-dtype", args.key_dtype, "--cols", str(KEYS_PER_SAMPLE)]
    command += ["--floats", floats_file, "--float-cols", str(DENSE_FEATURES)]
    command += ["--batches", ",".join(map(str, args.batches)), "--pool", str(args.pool)]
    command += ["--warmup", str(args.warmup), "--iters", str(args.iters)]
    command += ["--trace", traces, "--traces", str(hps_cpp.TRACED_CALLS)]
    for path in saved:
        inputs, outputs = hps_cpp.signature_tensors(path)
        (output,) = outputs.values()
        command += ["--model", path, inputs["keys"], output, "--dense", inputs["dense"]]
    for library in libraries:
        command += ["--library", library]
    env = {"CUDA_VISIBLE_DEVICES": ""} if args.device == "/CPU:0" else {}  # the C++ server's cache on the CPU too
    served = hps_cpp.run_driver(command, env)
    hps_model, gather_model = served["models"]
    cpp = {
        "libpython": served["libpython"],
        "hps": {int(b): r for b, r in hps_model["batches"].items()},
        "gather": {int(b): r for b, r in gather_model["batches"].items()},
        "load_s": [hps_model["load_s"], gather_model["load_s"]],
        "first_call_ms": [hps_model["first_call_ms"], gather_model["first_call_ms"]],
        "feed_ms": {int(b): ms for b, ms in served["feed_ms"].items()},
        "ops": {b: hps_cpp.op_times(traces, 0, b) for b in args.batches},
    }
    shutil.rmtree(traces, ignore_errors=True)
    return cpp


def check_cpp(results: dict, batches: list[int]) -> None:
    """Each C++ model's outputs for the first batch of each B (before the warmup and after the timed
    calls) must sum as the Python HPS model's within ``SUM_RTOL`` and ``SUM_ATOL_PER_SAMPLE`` x B."""
    for b in batches:
        want = results["python_checksum"][b]
        for label in ("hps", "gather"):
            r = results["cpp"][label][b]
            for key, when in (("checksum", "before"), ("checksum_after", "after")):
                if not np.isclose(r[key], want, rtol=SUM_RTOL, atol=SUM_ATOL_PER_SAMPLE * b):
                    raise AssertionError(
                        f"the C++ {label} model's outputs for the first batch of B={b} ({when} the timed calls) "
                        f"sum to {r[key]!r}, the Python HPS model's to {want!r} (rtol {SUM_RTOL}, atol "
                        f"{SUM_ATOL_PER_SAMPLE} x B): the C++ process served another inference than Python's"
                    )


# -- report ---------------------------------------------------------------------------------------
def slower_than_published(p50_ms: dict[int, float], min_batch: int) -> list[str]:
    """The B >= ``min_batch`` with a NVIDIA A100 figure whose p50 (ms) is above it, as lines."""
    return [
        f"B={b}: {p50:.3f} ms > {PUBLISHED_A100_US[b] / 1000:.3f} ms"
        for b, p50 in p50_ms.items()
        if b >= min_batch and b in PUBLISHED_A100_US and p50 > PUBLISHED_A100_US[b] / 1000
    ]


def published_cell(b: int) -> str:
    published = PUBLISHED_A100_US.get(b)
    return f"{published / 1000:.3f} ms" if published else "-"


def report(args: argparse.Namespace, results: dict) -> list[str]:
    """Prints the tables; returns what ``--check`` fails on: the batches slower than NVIDIA's A100
    figure (from Python at B >= 4,096; with ``--cpp`` from C++ at B >= 1,024), and libpython mapped
    into the C++ process."""
    keys = f"{KEYS_PER_SAMPLE} {args.key_dtype} keys"
    print(
        f"DLRM inference, table {args.rows:,} x {DIM} float32 (cache {args.gpucacheper}, hash_map behind), {keys} "
        f"+ {DENSE_FEATURES} dense features per sample, {args.iters} timed calls (after {args.warmup}) over "
        f"{args.pool} batch(es) on {args.device}{', MLPs compiled by XLA' if args.xla else ''}"
    )
    header = f"{'B':>6} {'hps p50 ms':>11} {'p99':>7} {'gather p50':>11} {'p99':>7} {'vs gather':>10} {'floor':>7}"
    print(f"{header} {'A100 TF+HPS*':>13}")
    for b, r in results["hps"].items():
        g = results["gather"][b]
        r["vs_gather"] = g["p50_ms"] / r["p50_ms"]
        print(
            f"{b:>6} {r['p50_ms']:>11.3f} {r['p99_ms']:>7.3f} {g['p50_ms']:>11.3f} {g['p99_ms']:>7.3f} "
            f"{r['vs_gather']:>10.2f} {results['floor'][b]['p50_ms']:>7.3f} {published_cell(b):>13}"
        )
    if "cpp" in results:
        report_cpp(results["cpp"])
    print("* NVIDIA's published figure (A100, 32.7 M rows, Triton server-side compute; reference §5): another machine")
    if "cpp" not in results:
        return slower_than_published({b: r["p50_ms"] for b, r in results["hps"].items()}, PYTHON_CHECK_MIN_BATCH)
    failed = slower_than_published({b: r["p50_ms"] for b, r in results["cpp"]["hps"].items()}, CPP_CHECK_MIN_BATCH)
    if results["cpp"]["libpython"] != "absent":
        failed.append("libpython was mapped into the C++ process")
    return failed


def report_cpp(cpp: dict) -> None:
    """The C++ table: per B the HPS and gather models' p50 (ms), their ratio, NVIDIA's figure, and from
    the HPS model's traced calls the step's span, its ``Sok*`` ops (the lookup's) and its slowest op
    type."""
    print(
        "served from C++ (hps_serve_cpp.cc, TensorFlow's C API, no Python in the process): a call is TF_SessionRun "
        "from feeds in host memory to the fetched [B, 1] output; step, Sok* ops and the slowest op type (summed "
        f"over its nodes): medians of {hps_cpp.TRACED_CALLS} traced calls of the HPS model"
    )
    print(
        f"{'B':>6} {'C++ hps p50':>12} {'p99':>7} {'C++ gather p50':>15} {'vs gather':>10} {'A100 TF+HPS*':>13} "
        f"{'step':>7} {'Sok* ops':>9}  slowest op type (ms)"
    )
    for b, r in cpp["hps"].items():
        g = cpp["gather"][b]
        r["vs_gather"] = g["p50_ms"] / r["p50_ms"]
        ops = dict(cpp["ops"][b])
        step = ops.pop("step")
        lookup = sum(ms for op, ms in ops.items() if op.startswith("Sok"))
        op = max(ops, key=ops.get)
        print(
            f"{b:>6} {r['p50_ms']:>12.3f} {r['p99_ms']:>7.3f} {g['p50_ms']:>15.3f} {r['vs_gather']:>10.2f} "
            f"{published_cell(b):>13} {step:>7.3f} {lookup:>9.3f}  {op} {ops[op]:.3f}"
        )
    print(
        f"C++: SavedModels loaded in {cpp['load_s'][0]:.2f} s (HPS) and {cpp['load_s'][1]:.2f} s (gather), first HPS "
        f"call (the C++ server's start) {cpp['first_call_ms'][0]:.1f} ms; outputs' sums equal Python's at every B "
        f"(rtol {SUM_RTOL}, atol {SUM_ATOL_PER_SAMPLE} x B); libpython {cpp['libpython']}"
    )


def main(argv: list[str] | None = None) -> int:
    import tensorflow as tf

    args = parse_args(argv)
    if args.device == "cpu":
        tf.config.set_visible_devices([], "GPU")  # the HPS caches on the CPU too (cache.cache_device)
    elif not tf.config.list_logical_devices("GPU"):
        print(
            f"hps_dlrm_gpu.py needs a GPU: TensorFlow {tf.__version__} sees none (--device cpu runs on the CPU)",
            file=sys.stderr,
        )
        return 2
    args.device = "/GPU:0" if args.device == "gpu" else "/CPU:0"
    builddir = tempfile.mkdtemp(prefix="hps_dlrm_driver_")
    try:
        driver = None
        if args.cpp:  # built first: a C++ side that cannot run fails before the Python timing
            program, why_not = hps_cpp.build_driver(builddir)
            libraries: list[str] = []
            if program is not None:
                libraries, why_not = hps_cpp.serving_libraries()
            if why_not:
                print(f"--cpp cannot run here: {why_not}", file=sys.stderr)
                return 2
            driver = (program, libraries)
        machine = machine_context(args)
        print(" | ".join(f"{k} {v}" for k, v in machine.items()))
        sys.stdout.flush()
        results = run(args, driver)
    finally:
        shutil.rmtree(builddir, ignore_errors=True)
    failed = report(args, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": machine, "results": results}, f, indent=1)
    for line in failed:
        print(f"slower than NVIDIA's A100 figure: {line}" if line.startswith("B=") else f"failed: {line}")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
