"""BERT in plain PyTorch, with module names that match Hugging Face checkpoint keys.

Import from the submodules (`model.config`, `model.heads`, ...): this package imports nothing, so
reading a config (`model.config`) does not import torch."""
