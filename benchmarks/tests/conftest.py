"""The benchmark scripts' tests: make benchmarks/ importable (the scripts import each other by name)."""

from __future__ import annotations

import sys
from pathlib import Path

# --import-mode=importlib leaves sys.path alone; storage_gpu imports machine from its own folder.
sys.path.insert(0, str(Path(__file__).parents[1]))
