"""Operator tools on saved requests: audit, plan (a dry run) and replay (a cost report)."""
