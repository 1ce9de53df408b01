"""The DynamicVariable example of SOK's documentation (seed sok-dynamic-variable-api), verbatim."""

import sparse_operation_kit as sok
import tensorflow as tf

v = sok.DynamicVariable(dimension=3, initializer="13")
print("v.shape:", v.shape)
print("v.size:", v.size)

indices = tf.convert_to_tensor([0, 1, 2**40], dtype=tf.int64)

embedding = tf.nn.embedding_lookup(v, indices)
print("embedding:", embedding)
print("v.shape:", v.shape)
print("v.size:", v.size)
