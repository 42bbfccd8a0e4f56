"""defectdet: industrial visual defect detection on PyTorch.

Heavy submodules are imported lazily so that `import defectdet` stays cheap and the
deployment runtime never pulls in training code.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
