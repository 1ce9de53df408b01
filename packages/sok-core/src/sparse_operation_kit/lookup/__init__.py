"""``sok.lookup_sparse`` and ``sok.all2all_dense_embedding``: the model-parallel lookup, as rooms.

``arguments`` checks a call's arguments; ``checks`` makes the ranks agree on the call and its ids;
``plan`` says which rank holds what; ``input_dist`` sends each id to its owner; ``local_lookup``
reads and pools the held rows; ``output_dist`` returns each rank its samples' sums; ``sparse`` ties
them together (see its docstring for the whole exchange).
"""

from sparse_operation_kit.lookup.arguments import COMBINERS, ID_DTYPES
from sparse_operation_kit.lookup.sparse import all2all_dense_embedding, lookup_sparse

__all__ = ["COMBINERS", "ID_DTYPES", "all2all_dense_embedding", "lookup_sparse"]
