"""What the Service Bus tests import of devtools_testutils."""

from peer_harness import FakeResource, Preparer, ResourceGroupPreparer, get_credential  # noqa


class AzureMgmtRecordedTestCase:
    """Recording is off: every test talks to the emulator."""


AzureRecordedTestCase = AzureMgmtRecordedTestCase
AzureMgmtPreparer = Preparer
RandomNameResourceGroupPreparer = ResourceGroupPreparer
PowerShellPreparer = Preparer


class AzureTestError(Exception):
    pass


class ReservedResourceNameError(Exception):
    pass


def get_region_override(default="westus"):
    return default


def add_general_regex_sanitizer(*args, **kwargs):
    pass


def set_custom_default_matcher(*args, **kwargs):
    pass


def recorded_by_proxy(test):
    return test
