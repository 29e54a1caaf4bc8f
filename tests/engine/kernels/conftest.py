"""Kernel tests run Triton's interpreter on CPU: the flag must be set before any kernel module is imported."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
