"""The inspection service around the torch-free runtime: the FastAPI app and its guards (`serve.server`), the
multipart and JSON body limits (`serve.upload`, `serve.json_body`), Prometheus metrics (`serve.metrics`),
several worker processes (`serve.workers`), capture and review of kept images (`serve.capture`, `serve.review`,
`serve.review_app`, `serve.review_download`), shadow, promotion and roll-back (`serve.deployment`,
`serve.model_routes`) on a models store that replicas share (`serve.store`), and the static pages.

Sits above `defectdet.runtime` (bundle, Predictor, drift monitor), which it uses and which never imports it;
only the CLI imports this package. No torch import; see docs/design/architecture.md for the package layers.

`from defectdet import serve` gives this package, and the package is callable: `serve(bundle, ...)` is
`defectdet.serve.server.serve`, so the name works whether or not a submodule was imported first:

    from defectdet import serve
    serve("model.onnx", port=8000)
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any


def serve(bundle: str | Path, *args: Any, **options: Any) -> None:
    """Serve a bundle over HTTP until interrupted; what `defectdet serve` runs. The arguments (`host`, `port`,
    `settings`, `workers`) are those of `defectdet.serve.server.serve`.

    Example:
        ```python
        from defectdet import serve

        serve("model.onnx", host="127.0.0.1", port=8000)
        ```
    """
    from defectdet.serve.server import serve as run_service

    run_service(bundle, *args, **options)


class _CallableModule(types.ModuleType):
    def __call__(self, bundle: str | Path, *args: Any, **options: Any) -> None:
        serve(bundle, *args, **options)


sys.modules[__name__].__class__ = _CallableModule
