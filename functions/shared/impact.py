"""The impact rules of lb-pools and the approval gate: they live in the kernel
(:mod:`sebridge.impact`) since the forwarder's drain probe applies the same rules on the VM."""

from sebridge.impact import (
    DEFAULT_FREEZE_THRESHOLD,
    DEFAULT_IMPACTFUL,
    DEFAULT_RULES,
    FREEZE,
    GONE_AFTERWARDS,
    ImpactRules,
    restores_afterwards,
)

__all__ = [
    "DEFAULT_FREEZE_THRESHOLD",
    "DEFAULT_IMPACTFUL",
    "DEFAULT_RULES",
    "FREEZE",
    "GONE_AFTERWARDS",
    "ImpactRules",
    "restores_afterwards",
]
