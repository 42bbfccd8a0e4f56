"""The inspection service around the torch-free runtime: the FastAPI app (`serve.server.create_app`) put
together from its settings, service, routes, guards and protocol (`serve.settings`, `serve.service`,
`serve.routes`, `serve.guards`, `serve.protocol`), run by `serve.launch.serve_bundle` in one process or
several (`serve.workers`); the multipart and JSON body limits (`serve.upload`, `serve.json_body`),
Prometheus metrics (`serve.metrics`), capture and review of kept images (`serve.capture`, `serve.review`,
`serve.review_app`, `serve.review_download`), shadow, promotion and roll-back (`serve.deployment`,
`serve.model_routes`) on a models store that replicas share (`serve.store`), and the static pages.

Sits above `defectdet.runtime` (bundle, Predictor, drift monitor), which it uses and which never imports it;
only the CLI imports this package. No torch import; see docs/design/architecture.md for the package layers.

    from defectdet import serve_bundle
    serve_bundle("model.onnx", port=8000)
"""
