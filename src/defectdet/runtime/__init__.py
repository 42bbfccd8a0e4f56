"""The torch-free side of deployment: reading the one-file ONNX bundle (`runtime.bundle`), the `Predictor`
(`runtime.predictor`), the drift monitor (`runtime.monitor`) and the predict command (`runtime.predict`). The
service around them (server, review, models store, metrics, the static pages) is `defectdet.serve`, one layer up.

Nothing here imports torch (a test blocks torch and imports it): it imports only the leaf modules
(`errors`, `_limits`, `_lazy`, `postprocess`) and `data`. Writing bundles (torch) is `defectdet.export`;
see docs/reference/bundle-format.md for the bundle and docs/design/architecture.md for the package layers.
"""
