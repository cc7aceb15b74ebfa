"""COPUS: goodput-driven co-adaptive batch size and 3D parallelism for LLM training."""

__version__ = "0.1.0"
