"""Scheduled Events Bridge: the shared kernel (contracts, IMDS document model) and the CLI."""

__version__ = "0.3.0"
