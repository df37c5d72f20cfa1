"""The CUDA tests of the loader's device path, collected only where CUDA is available.

CI machines have no GPU, so there these files are not collected at all (no test is
reported as skipped: none exists there). On a machine with a GPU, ``pytest tests/gpu``
(or the whole suite) runs them; ``benchmarks/RESULTS.md`` says where they last ran.
"""

from __future__ import annotations

import torch

collect_ignore_glob = [] if torch.cuda.is_available() else ["test_*.py"]
