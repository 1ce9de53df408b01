"""The exchange's graph, on the CPU, holds no op that TensorFlow would run on the host under a GPU.

A CUDA TensorFlow places an op without a GPU kernel for its dtype on the CPU and copies its inputs
there and back: for an op on every id, megabytes per step and a wait for the GPU (issue 37's
profiles showed it for int64 ``FloorMod``, ``SplitV`` and ``Bincount``). The graph of
``sok.lookup_sparse`` at two ranks (rank 0 of a stand-in tool whose collectives are identities;
traced, not run) is read here op by op, so such an op fails the CPU suite, not only a GPU profile.
"""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import communication  # noqa: E402
from sparse_operation_kit.demo.dlrm import SokEmbeddings  # noqa: E402
from sparse_operation_kit.demo.train import MLPERF_DCNV2, DemoConfig, build_model  # noqa: E402
from sparse_operation_kit.lookup.input_dist import RECORD_TABLES  # noqa: E402

#: Op types whose GPU kernels take no int64 values (``T``; ``Bincount``'s ``T`` is its weights',
#: ``DenseBincount``'s ``Tidx`` its input's): under a GPU TensorFlow runs them on the host.
NO_INT64_GPU_KERNEL = {
    "FloorMod": "T",
    "SplitV": "T",
    "Split": "T",
    "Unpack": "T",
    "Bincount": "T",
    "DenseBincount": "Tidx",
}
#: Op types the exchange must not use in any dtype: argsort's TopKV2 and the bincounts take no int64
#: keys on the GPU, and an int32 key of a GPU op lives on the host (issue 37's np 2 profile of the
#: NCCL exchange: every id copied to the host for them). The exchange groups with SokGroupByKey.
NOT_IN_THE_EXCHANGE = {"TopKV2", "Bincount", "DenseBincount"}


class _TwoRanks(communication.SingleProcess):
    """Rank 0 of two ranks that make the same calls: an allgather gives this rank's tensor twice,
    every other collective is the identity (enough to create tables and trace the exchange)."""

    def num_ranks(self) -> int:
        return 2

    def allgather(self, tensor, name=None):
        return tf.concat([tensor, tensor], 0)


def _ops_of(graph: tf.Graph) -> list[tf.Operation]:
    """Every op of ``graph`` and of the functions it calls (tf.cond branches among them)."""
    ops = list(graph.get_operations())
    for function in graph._functions.values():  # noqa: SLF001 - the branches' graphs
        ops.extend(function.graph.get_operations() if hasattr(function, "graph") else [])
    return ops


#: The device of ``device_ops.on_host()`` scopes, and the producers whose outputs are host-sized
#: (a Shape's output is in host memory, whatever its input's size).
HOST_SCOPE = "/device:CPU:0"
HOST_OUTPUTS = {"Shape", "ShapeN", "Size", "Const"}
#: The one read of device values on the host a call makes: the gathered records of its checks, at
#: 2 ranks (fingerprint, count of checks, batch, sum of the checks, ids per owner and table).
SMALL = 2 * (4 + 2 * RECORD_TABLES)


def _read_on_the_host(ops: list[tf.Operation]) -> list[str]:
    """Ops of ``on_host`` scopes that take a tensor of unknown or large size from an op not on the
    host: under a GPU, TensorFlow copies the whole tensor to the host for them (``tf.shape`` of the
    ids inside such a scope copied every id, issue 37's profile: 26 MB per step)."""
    found = []
    for op in ops:
        if op.device != HOST_SCOPE or "pool_dynamic/" in op.name:  # a CPU table's own ops, in this test
            continue
        for x in op.inputs:
            producer = x.op
            if producer.device == HOST_SCOPE or producer.type in HOST_OUTPUTS:
                continue
            if x.shape.is_fully_defined() and x.shape.num_elements() <= SMALL:
                continue
            found.append(f"{op.name} ({op.type}) <- {producer.name} ({producer.type}, shape {x.shape})")
    return found


def _host_bound(ops: list[tf.Operation]) -> list[str]:
    found = []
    for op in ops:
        if op.type in NOT_IN_THE_EXCHANGE:
            found.append(f"{op.name} ({op.type})")
            continue
        attr = NO_INT64_GPU_KERNEL.get(op.type)
        if attr is not None and op.get_attr(attr) == tf.int64:
            found.append(f"{op.name} ({op.type}, {attr}=int64)")
    return found


@pytest.fixture
def two_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(communication, "_tool", _TwoRanks())
    # The collectives of the fake ranks: Horovod's exchange over the tool's identity collectives (on
    # a GPU host the default, SOK's NCCL collectives, would wait for a second process to set up).
    # The ids routed, as SOK's NCCL collectives send them by default: the path these lints are for
    # (the tests of the holders' way set their own).
    monkeypatch.setenv("SOK_EXCHANGE", "horovod")
    monkeypatch.setenv("SOK_ID_EXCHANGE", "routed")
    # The agreement as with GPU tables: its check gates the exchange (on the host's tables the sizes
    # come out of it instead, a tf.cond that takes the ids: free there, a copy on a GPU).
    monkeypatch.setattr("sparse_operation_kit.lookup.checks.on_gpu", lambda param: True)


def _signature(params: list, batch: int = 4) -> list:
    """Each table's ids as two flat tensors (values of any length, the batch's row splits)."""
    return [tf.TensorSpec([None], tf.int64), tf.TensorSpec([batch + 1], tf.int64)] * len(params)


def _ragged(flat: tuple) -> list:
    return [tf.RaggedTensor.from_row_splits(v, s, validate=False) for v, s in zip(flat[0::2], flat[1::2])]


def _traced_step(params: list, weighted: bool, optimizer=None) -> tf.Graph:
    """The graph of a step: the lookup, its gradients, and ``optimizer``'s update of them (None: the
    gradients summed into the result instead)."""

    @tf.function(input_signature=_signature(params))
    def step(*flat: tf.Tensor) -> tf.Tensor:
        ids = _ragged(flat)
        weights = [tf.ones_like(x, tf.float32) for x in ids] if weighted else None
        with tf.GradientTape() as tape:
            pooled = sok.lookup_sparse(params, ids, weights, combiners=["sum"] * len(params))
            loss = tf.add_n([tf.reduce_sum(p * p) for p in pooled])
        grads = tape.gradient(loss, params)
        if optimizer is not None:
            optimizer.apply_gradients(zip(grads, params))
            return loss
        rows = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]  # a dynamic table's: keys
        return loss + tf.add_n([tf.reduce_sum(r) for r in rows])

    return step.get_concrete_function().graph


def _traced_forward(params: list) -> tf.Graph:
    @tf.function(input_signature=_signature(params))
    def forward(*flat: tf.Tensor) -> list:
        return sok.lookup_sparse(params, _ragged(flat), combiners=["sum"] * len(params))

    return forward.get_concrete_function().graph


def _every_kind() -> list:
    """A distributed and a localized static table and a dynamic one."""
    return [
        sok.Variable(tf.zeros([64, 4])),
        sok.Variable(tf.zeros([32, 8]), mode="localized:1"),
        sok.DynamicVariable(dimension=4, var_type="hbm"),
    ]


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_exchange_of_static_and_dynamic_tables_keeps_int64_ids_off_host_bound_ops(two_ranks, weighted):
    ops = _ops_of(_traced_step(_every_kind(), weighted))
    assert any(op.type == "SokPooledLookup" for op in ops), "the traced graph is not the exchange's"
    assert _host_bound(ops) == []
    assert _read_on_the_host(ops) == []


def test_the_owners_pooling_reads_nothing_back_at_several_ranks(two_ranks):
    """At several ranks the call's agreement checked every static id against its table before the
    exchange and the exchange made the row splits, so the owner's SokPooledLookup is "checked" (its
    GPU kernel then does not wait for the GPU); at one rank the op is the check."""
    ops = [op for op in _ops_of(_traced_step(_every_kind(), weighted=True)) if op.type == "SokPooledLookup"]
    assert len(ops) == 2 and all(op.get_attr("checked") for op in ops), [op.name for op in ops]


def test_one_rank_pooling_checks_its_ids():
    params = [sok.Variable(tf.zeros([64, 4])), sok.DynamicVariable(dimension=4, var_type="hbm")]
    ops = [op for op in _ops_of(_traced_step(params, weighted=True)) if op.type == "SokPooledLookup"]
    assert len(ops) == 2 and not any(op.get_attr("checked") for op in ops), [op.name for op in ops]


def _static_kinds() -> list:
    """A distributed and a localized static table: a call whose ids travel sized by shapes."""
    return [sok.Variable(tf.zeros([64, 4])), sok.Variable(tf.zeros([32, 8]), mode="localized:1")]


def _device_values_read_on_the_host(graph: tf.Graph) -> list[str]:
    """Ops of the main graph on the host that take a tensor made off the host (a copy back, and a
    wait for the GPU under a CUDA TensorFlow): the predicate of a tf.cond too."""
    found = []
    for op in graph.get_operations():
        conditional = op.type in ("If", "StatelessIf")
        if op.device != HOST_SCOPE and not conditional:
            continue
        for x in op.inputs[:1] if conditional else op.inputs:
            producer = x.op
            if producer.device == HOST_SCOPE or producer.type in HOST_OUTPUTS or x.dtype == tf.resource:
                continue
            found.append(f"{op.name} ({op.type}) <- {producer.name} ({producer.type}, {x.dtype.name})")
    return found


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_static_tables_exchange_reads_one_flag_after_the_ids_moved(two_ranks, weighted, monkeypatch):
    """A call of static tables at several ranks (Horovod's collectives) sizes its collectives from
    shapes (``holder_dist``):
    the host reads one value of the devices' in the whole step, the flag of every rank's checks,
    and only after the all-to-all of the ids; the routed exchange reads the call's records first."""
    monkeypatch.setenv("SOK_ID_EXCHANGE", "holders")
    graph = _traced_step(_static_kinds(), weighted)
    ops = _ops_of(graph)
    assert not any(op.type == "SokGroupByKey" for op in ops), "the call's ids were routed"
    reads = _device_values_read_on_the_host(graph)
    assert len(reads) == 1 and ("(If)" in reads[0] or "(StatelessIf)" in reads[0]), reads
    flag = next(op for op in graph.get_operations() if reads[0].startswith(f"{op.name} ("))
    assert any(_splits_received_ids(op) for op in _ancestors(flag.inputs[0].op)), "read before the ids moved"
    assert _host_bound(ops) == [] and _read_on_the_host(ops) == []
    assert _host_inputs_made_on_the_device(graph) == []
    pooled = [op for op in ops if op.type == "SokPooledLookup"]
    assert len(pooled) == 1 and pooled[0].get_attr("checked")


def test_dynamic_tables_keys_go_to_their_holders_with_horovods_collectives(two_ranks, monkeypatch):
    """``auto`` with Horovod's collectives: a call with a dynamic table sends its keys to the
    holders too; each keeps the keys it owns before the table's lookup (which inserts them), so the
    graph masks the dynamic table's keys and routes nothing."""
    monkeypatch.setenv("SOK_ID_EXCHANGE", "auto")
    ops = _ops_of(_traced_step(_every_kind(), weighted=True))
    assert not any(op.type == "SokGroupByKey" for op in ops), "the call's ids were routed"
    assert any(op.type == "SokUniqueIndexList" for op in ops) and any("boolean_mask" in op.name for op in ops)
    assert _host_bound(ops) == []


@pytest.mark.parametrize("way", ["holders", "routed"])
def test_host_tables_sizes_come_out_of_the_agreement(two_ranks, monkeypatch, way):
    """On the host's tables every size of the exchange is read from the agreement's tf.cond output
    (data): the all-to-all's counts are downstream of the cond, so no collective can start before
    the ranks agreed, also where TensorFlow passes a control dependency on a lowered cond early."""
    monkeypatch.setenv("SOK_ID_EXCHANGE", way)
    monkeypatch.setattr("sparse_operation_kit.lookup.checks.on_gpu", lambda param: False)
    graph = _traced_forward(_static_kinds())
    conds = {op for op in graph.get_operations() if op.type in ("If", "StatelessIf")}
    sizes = [op for op in graph.get_operations() if op.type == "Cast" and op.get_attr("DstT") == tf.int32]
    assert sizes and all(conds & _ancestors(op) for op in sizes), "a count of the exchange does not wait for the check"


def test_routed_ids_read_the_records_first(two_ranks, monkeypatch):
    """``SOK_ID_EXCHANGE=routed`` sends a static call's ids to their owners, sized by the records the
    host reads back before the exchange (what the lint above tells apart)."""
    monkeypatch.setenv("SOK_ID_EXCHANGE", "routed")
    graph = _traced_step(_static_kinds(), weighted=False)
    assert any(op.type == "SokGroupByKey" for op in _ops_of(graph))
    reads = _device_values_read_on_the_host(graph)
    assert len(reads) == 1 and "(Identity)" in reads[0], reads
    record = next(op for op in graph.get_operations() if reads[0].startswith(f"{op.name} ("))
    assert not any(_splits_received_ids(op) for op in _ancestors(record))


def _splits_received_ids(op: tf.Operation) -> bool:
    """Whether ``op`` splits the ids an all-to-all brought (as float64 bits: SplitV of int64 has no
    GPU kernel); the stand-in tool's collectives are identities, so the split marks the exchange."""
    return op.type == "SplitV" and op.get_attr("T") == tf.float64


def _ancestors(op: tf.Operation) -> set[tf.Operation]:
    """``op`` and every op it depends on (data and control inputs) in its graph."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        todo.extend(x.op for x in current.inputs)
        todo.extend(current.control_inputs)
    return seen


def test_an_unknown_id_exchange_is_refused(two_ranks, monkeypatch):
    monkeypatch.setenv("SOK_ID_EXCHANGE", "broadcast")
    expected = r"SOK_ID_EXCHANGE='broadcast' is not a way to send ids; valid: auto, holders, routed"
    with pytest.raises(ValueError, match=expected):
        _traced_forward(_static_kinds())


@pytest.mark.parametrize(
    ("setting", "exchange", "pooled", "expected"),
    [
        ("auto", "horovod", True, True),
        ("auto", "nccl", True, False),
        ("holders", "nccl", True, True),
        ("routed", "horovod", True, False),
        ("holders", "horovod", False, False),
    ],
)
def test_which_calls_send_ids_to_holders(monkeypatch, setting, exchange, pooled, expected):
    """``SOK_ID_EXCHANGE``: ``auto`` sends a call's ids to their holders with Horovod's collectives
    and routes them with SOK's NCCL ones (the faster way of each); a call whose tables are not all
    pooled by ops (tables TensorFlow ops pool, the low-frequency filter) is routed whatever the
    setting."""
    from sparse_operation_kit.lookup import exchange as exchanges

    monkeypatch.setenv("SOK_ID_EXCHANGE", setting)
    assert exchanges.ids_to_holders(pooled, type("Chosen", (), {"name": exchange})()) is expected


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_ranges_take_their_start_and_step_from_the_host(two_ranks, weighted):
    """Every Range of the exchange has its start and step made on the host (``device_ops.arange``):
    ``tf.range(n, dtype=tf.int64)``'s own constants land on the GPU, and its GPU kernel reads them
    from host memory, a copy back (and a wait) for each."""
    params = [sok.Variable(tf.zeros([64, 4])), sok.DynamicVariable(dimension=4, var_type="hbm")]
    # int64 ones: an int32 constant under a GPU is in host memory already
    ranges = [
        op for op in _ops_of(_traced_step(params, weighted)) if op.type == "Range" and op.get_attr("Tidx") == tf.int64
    ]
    assert ranges, "the traced graph has no range"
    for op in ranges:
        for i in (0, 2):
            producer = op.inputs[i].op
            assert producer.device == HOST_SCOPE, f"{op.name}: input {i} from {producer.name} on {producer.device!r}"


#: Inputs that an op's GPU kernel takes in host memory (its sizes, shapes, axes), by op type.
HOST_MEMORY_INPUTS = {
    "Range": (0, 1, 2),
    "SplitV": (1, 2),
    "Split": (0,),
    "Reshape": (1,),
    "Fill": (0,),
    "Slice": (1, 2),
    "StridedSlice": (1, 2, 3),
    "Tile": (1,),
    "Pad": (1,),
    "PadV2": (1,),
    "ConcatV2": (-1,),
    "ExpandDims": (1,),
    "Transpose": (1,),
    "GatherV2": (2,),
    "Cumsum": (1,),
    "Sum": (1,),
    "Max": (1,),
    "Min": (1,),
    "Prod": (1,),
    "Mean": (1,),
    "All": (1,),
    "Any": (1,),
    "BroadcastTo": (1,),
    "UnsortedSegmentSum": (2,),
    "ScatterNd": (2,),
}


def _host_inputs_made_on_the_device(graph: tf.Graph) -> list[str]:
    """Ops off the host whose host-memory inputs (HOST_MEMORY_INPUTS) an op off the host makes in a
    dtype other than int32 (a GPU op's int32 outputs are in host memory; Shape-like ops' too): under
    a GPU, TensorFlow copies such an input back to the host, a wait for the GPU each (run j's np 2
    profile: a range's start and step, the batch sizes sliced from the call's records). The main
    graph only: the branches of the checks' tf.cond run when a check failed."""
    found = []
    for op in graph.get_operations():
        if op.device == HOST_SCOPE:
            continue
        for i in HOST_MEMORY_INPUTS.get(op.type, ()):
            x = op.inputs[i]
            producer = x.op
            if producer.device == HOST_SCOPE or producer.type in HOST_OUTPUTS - {"Const"} or x.dtype == tf.int32:
                continue
            found.append(f"{op.name} ({op.type}) input {i} <- {producer.name} ({producer.type}, {x.dtype.name})")
    return found


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_no_host_input_of_a_gpu_kernel_is_made_on_the_device(two_ranks, weighted):
    assert _host_inputs_made_on_the_device(_traced_step(_every_kind(), weighted)) == []


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_one_process_training_step_makes_no_host_input_on_the_device(weighted):
    """The same at one rank, with the optimizer's step: static tables (one fused op each way, the
    Adagrad step on the padded gradient) and dynamic ones of both var_types."""
    params = [
        sok.Variable(tf.zeros([64, 4])),
        sok.Variable(tf.zeros([32, 8])),
        sok.DynamicVariable(dimension=4, var_type="hbm"),
        sok.DynamicVariable(dimension=8, var_type="hybrid"),
    ]
    graph = _traced_step(params, weighted, sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1)))
    assert any(op.type == "SokSparseApplyAdagradTables" for op in graph.get_operations())
    assert _host_inputs_made_on_the_device(graph) == []


def test_the_demo_dcnv2_training_step_makes_no_host_input_on_the_device():
    """`sok demo --model dcnv2`'s step (and benchmarks/dlrm.py's): its bags' row splits too. Run p's
    DCNv2 trace on an H200 showed a tf.range of int64 constants copying its start and limit back to
    the host every step."""
    config = DemoConfig(model="dcnv2", tables="static", **dict(MLPERF_DCNV2, batch_size=64, max_rows=500))
    gen = config.generator()
    embeddings = SokEmbeddings(gen.rows, config.dim, config.tables, config.var_types, seed=0)
    tower, embed, _ = build_model(config, embeddings)
    sparse_opt = sok.OptimizerWrapper(sok.RowWiseAdagrad(learning_rate=0.01))
    dense_opt = tf.keras.optimizers.Adam()
    dense, ids, labels = next(iter(gen.dataset(1, config.batch_size)))
    specs = [tf.TensorSpec(dense.shape, dense.dtype), tf.TensorSpec(ids.shape, tf.int64), tf.TensorSpec(labels.shape)]

    @tf.function(autograph=False, input_signature=specs)
    def step(dense: tf.Tensor, ids: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = tf.cast(tower((dense, embed(ids))), tf.float32)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        tables, dense_vars = embeddings.tables, tower.trainable_variables
        grads = tape.gradient(loss, tables + dense_vars)
        sparse_opt.apply_gradients(zip(grads[: len(tables)], tables))
        dense_opt.apply_gradients(zip(grads[len(tables) :], dense_vars))
        return loss

    assert _host_inputs_made_on_the_device(step.get_concrete_function().graph) == []


def test_the_host_input_lint_finds_an_int64_range_and_slice() -> None:
    """The check itself: tf.range's own int64 start and step, and a slice at an int64 position, are
    reported; device_ops.arange and an int32 position are not."""
    from sparse_operation_kit import device_ops

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def both(x: tf.Tensor) -> tf.Tensor:
        n = device_ops.length(x)
        return tf.reduce_sum(tf.cast(tf.range(n, dtype=tf.int64) + device_ops.arange(n), tf.float32)) + x[n - 1] + x[0]

    found = _host_inputs_made_on_the_device(both.get_concrete_function().graph)
    assert len(found) == 5 and all(("(Range)" in f or "(StridedSlice)" in f) for f in found), found


def test_the_host_read_lint_finds_a_shape_taken_on_the_host() -> None:
    """The check itself: ``tf.shape`` of the ids inside an ``on_host`` scope is reported; outside it
    (``device_ops.length``), and small or host-made inputs, are not."""
    from sparse_operation_kit import device_ops

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def both(ids: tf.Tensor) -> tf.Tensor:
        doubled = ids * 2
        outside = device_ops.length(doubled)
        with device_ops.on_host():
            inside = tf.shape(doubled, out_type=tf.int64)[0]
            small = tf.reduce_sum(tf.constant([1, 2], tf.int64) * 3)
        return outside + inside + small

    found = _read_on_the_host(_ops_of(both.get_concrete_function().graph))
    assert len(found) == 1 and "(Shape) <- mul (Mul" in found[0], found


def test_the_lint_finds_such_an_op() -> None:
    """The check itself: a graph with int64 FloorMod and SplitV, and an argsort of any dtype, is
    reported, the int32 forms of the first two not."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def bad(ids: tf.Tensor) -> tf.Tensor:
        parts = tf.split(ids, tf.constant([1, 1], tf.int64) * 0 + tf.shape(ids, out_type=tf.int64) // 2, num=2)
        small = tf.math.floormod(tf.cast(ids, tf.int32), 3)
        order = tf.argsort(tf.cast(ids, tf.float32), stable=True)
        return tf.math.floormod(parts[0], 3) + tf.cast(tf.reduce_sum(small) + order[0], tf.int64)

    found = _host_bound(_ops_of(bad.get_concrete_function().graph))
    assert [entry.split(" ", 1)[1] for entry in found] == ["(SplitV, T=int64)", "(TopKV2)", "(FloorMod, T=int64)"]


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_one_rank_pools_dynamic_tables_in_one_op_each_way(weighted):
    params = [sok.DynamicVariable(dimension=4), sok.DynamicVariable(dimension=8), sok.DynamicVariable(dimension=4)]
    types = [op.type for op in _ops_of(_traced_step(params, weighted))]
    # One index of every table's keys, one read per table, one pooling and its gradient.
    assert types.count("SokUniqueIndexList") == 1
    assert types.count("SokLookup") == len(params)
    assert types.count("SokPooledLookup") == 1 and types.count("SokPooledLookupGrad") == 1
    per_table = {"Unique", "UniqueV2", "SokUniqueIndex", "UnsortedSegmentSum", "SparseSegmentSum"}
    assert sorted(t for t in types if t in per_table) == []


def test_the_exchange_takes_the_same_ops_however_many_tables(two_ranks):
    # The owners of the ids (int64 arithmetic), the lengths of the ids (shapes) and the sums of the
    # partial sums (AddN, counted in the forward: the step's own loss adds per table) are computed
    # for all the tables at once.
    def ops(num_tables: int) -> dict[str, int]:
        params = [sok.Variable(tf.zeros([64, 4])) for _ in range(num_tables)]
        params += [sok.Variable(tf.zeros([32, 8]), mode="localized:1"), sok.DynamicVariable(dimension=4)]
        types = [op.type for op in _ops_of(_traced_step(params, weighted=False))]
        forward = [op.type for op in _ops_of(_traced_forward(params))]
        counts = {t: types.count(t) for t in ("FloorDiv", "FloorMod", "Fill", "SelectV2", "Shape", "ShapeN")}
        return counts | {"AddN in the forward": forward.count("AddN")}

    assert ops(2) == ops(6)


def test_the_status_of_dynamic_tables_is_one_check_however_many_tables(two_ranks):
    # The holders' status codes are read in one check; the messages are made only when it fails
    # (in a tf.cond branch, not in the step's own graph).
    def ops(num_tables: int) -> dict[str, int]:
        params = [sok.DynamicVariable(dimension=4, var_type="hbm") for _ in range(num_tables)]
        types = [op.type for op in _traced_forward(params).get_operations()]
        return {t: types.count(t) for t in ("Assert", "StringJoin", "AsString", "Where", "If", "ScatterNd")}

    assert ops(2) == ops(6)
