"""Deployment: the one-file ONNX bundle, the torch-free runtime, the drift monitor and the service.

Only `deploy.export` imports torch; see docs/deploy.md for the contract.
"""
