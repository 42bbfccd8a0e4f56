"""A prelude for child-process scripts: after it, `import torch` fails, as on a line PC without PyTorch."""

BLOCK_TORCH = """
import sys
class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, BlockTorch())
"""
