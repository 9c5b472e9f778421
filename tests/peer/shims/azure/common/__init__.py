"""test_sb_client.py imports these, unused; azure-common is only a
test-time dependency of the SDK, not one of this project."""


class AzureHttpError(Exception):
    pass


class AzureConflictHttpError(AzureHttpError):
    pass
