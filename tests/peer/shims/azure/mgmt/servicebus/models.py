"""AccessRights (test_sb_client.py's excluded rule tests)."""

import enum


class AccessRights(enum.StrEnum):
    manage = "Manage"
    send = "Send"
    listen = "Listen"
