"""The torch side of deployment: a training checkpoint -> a bundle (`export.exporter.export_bundle`), int8
quantization (`export.quantize`) and `export.resolve.resolve_bundle` (what `defectdet predict` runs on).

Sits above the engine (it validates the bundle it writes with `engine.validate`) and the torch-free
`defectdet.runtime` (which reads and runs bundles); see docs/design/architecture.md.

    from defectdet import export_bundle
    bundle = export_bundle("runs/synth/best.pt", "runs/synth/model.onnx").bundle
"""
