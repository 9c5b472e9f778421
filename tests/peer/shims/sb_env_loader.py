"""Replaces the SDK's sb_env_loader.py: see peer_harness.py."""

from peer_harness import NamespacePreparer as ServiceBusPreparer  # noqa: F401
