"""What the tests import of azure-mgmt-servicebus."""
