"""webhooks: each transition to any number of endpoints (Slack, PagerDuty, generic JSON)."""
