"""atgrpo: train teams of LLM agents together with AT-GRPO (arXiv 2510.11062)."""

__version__ = "0.1.0"
