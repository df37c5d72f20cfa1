"""Connected components of the duplicate graph, vectorized (union-find by arrays).

Each component is labelled by its smallest record index, which is also the record the
keep rule keeps (the first in record order). The algorithm alternates hooking (every
edge pulls the larger of its two roots onto the smaller, ``np.minimum.at``) and pointer
jumping (``parent = parent[parent]`` until stable); both are whole-array steps, and the
number of rounds grows with the logarithm of the component size.
"""

from __future__ import annotations

import numpy as np

__all__ = ["connected_components"]


def connected_components(n: int, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """For ``n`` nodes and edges ``(i[k], j[k])``: each node's root, the smallest node
    index of its component (``int64``)."""
    parent = np.arange(n, dtype=np.int64)
    i = np.asarray(i, dtype=np.int64)
    j = np.asarray(j, dtype=np.int64)
    while len(i):
        ri, rj = parent[i], parent[j]
        differ = ri != rj
        if not differ.any():
            break
        i, j, ri, rj = i[differ], j[differ], ri[differ], rj[differ]
        np.minimum.at(parent, np.maximum(ri, rj), np.minimum(ri, rj))
        while True:
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent = grand
    return parent
