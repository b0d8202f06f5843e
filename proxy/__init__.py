"""compaction-proxy: keeps AI agents' conversations inside the model's context window."""

__version__ = "0.1.0"
