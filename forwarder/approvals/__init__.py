"""The return path: the approvals queue receiver, the command handler and its decision, and
``sebridge approve``."""
