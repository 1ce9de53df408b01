"""The job ``make demo`` runs (``sok demo``): a DLRM on Criteo-shaped data, trained with SOK
tables, checkpointed with ``sok.dump`` and served through HPS in a fresh process; and a tour of
what the storages do at scale.

Modules: :mod:`~.criteo` (the data: generator and TSV reader), :mod:`~.dlrm` (the model),
:mod:`~.train` (training, evaluation, dump, plot), :mod:`~.storage` (the storage tour). Importing
this package imports none of them. Serving the checkpoint through HPS is sok-hps's
(``hierarchical_parameter_server.demo_serve``, which ``sok demo`` finds through its plugin).
"""


def next_pow2(value: int) -> int:
    """The smallest power of two >= ``value`` (1 for ``value`` <= 1): the capacities of the demo's
    hkv tables.

    Example::

        >>> next_pow2(5000)
        8192
    """
    return 1 << max(0, int(value) - 1).bit_length()
