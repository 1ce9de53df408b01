"""The lookup_sparse example of SOK's documentation (seed sok-experiment-api), as a script.

Run on one process (``python examples/lookup_sparse.py``) or several
(``horovodrun -np 2 -H localhost:2 --gloo python examples/lookup_sparse.py``): every rank prints the
same pooled embeddings for its (identical) local batch.
"""

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from sparse_operation_kit import experiment as sok

hvd.init()
sok.init()

gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

v1 = sok.Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32)
v2 = sok.Variable(np.arange(7 * 5).reshape(7, 5), dtype=tf.float32)

indices1 = tf.SparseTensor(indices=[[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]], values=[1, 1, 3, 4, 5], dense_shape=[2, 3])
indices2 = tf.SparseTensor(indices=[[0, 0], [1, 0], [1, 1]], values=[1, 2, 3], dense_shape=[2, 2])

embeddings = sok.lookup_sparse([v1, v2], [indices1, indices2], hotness=[3, 2], combiners=["sum", "sum"])
print(f"rank {hvd.rank()} of {hvd.size()}: emb1 = {embeddings[0].numpy().tolist()}")
print(f"rank {hvd.rank()} of {hvd.size()}: emb2 = {embeddings[1].numpy().tolist()}")
