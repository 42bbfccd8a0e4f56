import torch

from defectdet.diagnostics import inspect
from defectdet.diagnostics.tensor_inspect import inspect_file


def topics(inspection):
    return {finding.topic for finding in inspection.findings}


def test_transposed_tensor_view_is_flagged_and_contiguous_is_not():
    base = torch.arange(12.0).reshape(3, 4)
    transposed = base.t()
    report = inspect(transposed, "transposed")
    assert report.shape == [4, 3] and report.strides == [1, 4] and not report.contiguous
    assert "view" in topics(report)
    view = next(f for f in report.findings if f.topic == "view")
    assert ".reshape(-1)" in view.message and "48 B" in view.message  # 12 float32 values copied
    assert "view" not in topics(inspect(base)) and inspect(base).contiguous
    assert "view" not in topics(inspect(transposed.contiguous()))


def test_storage_sharing_grad_fn_and_numpy_flags():
    leaf = torch.randn(4, 4, requires_grad=True)
    result = (leaf * 2).sum(0)
    report = inspect(result)
    assert report.grad_fn_chain[:3] == ["SumBackward1", "MulBackward0", "AccumulateGrad"]
    assert report.requires_grad and not report.is_leaf
    assert any(f.topic == "numpy" and "detach" in f.advice for f in report.findings)

    big = torch.zeros(1000)
    piece = big[10:20]
    shared = inspect(piece, "piece", {"big": big, "other": torch.zeros(3)})
    assert shared.shares_storage_with == ["big"]
    assert shared.storage_offset == 10 and shared.storage_bytes == 4000 and shared.tensor_bytes == 40
    assert "storage" in topics(shared)  # a 40 B view keeps 4000 B alive
    assert "storage" not in topics(inspect(piece.clone()))


def test_inspect_file_keeps_sharing_saved_by_torch_save(tmp_path):
    base = torch.randn(8, 8)
    path = tmp_path / "tensors.pt"
    torch.save({"base": base, "view": base[2:4], "independent": base.clone()}, path)
    reports = {report.name: report for report in inspect_file(path)}
    assert reports["view"].shares_storage_with == ["base"]
    assert reports["independent"].shares_storage_with == []
    (only,) = inspect_file(path, key="view")
    assert only.shape == [2, 8]
