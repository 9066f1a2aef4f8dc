"""Kept as an alias: the stress loop became the seeded fault run (``benchmarks/fault_run.py``).

python -m benchmarks.stress_faults --topology sentinel --minutes 5   # the same as benchmarks.fault_run
python benchmarks/stress_faults.py --topology cluster --runs 10 --seconds 60
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root is what imports resolve against
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fault_run import main

if __name__ == "__main__":
    sys.exit(main())
