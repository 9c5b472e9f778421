"""Adapters: the only place SDK and HTTP clients are built (requests, azure-*)."""
