"""Delivery: the durable outbox and the publishers that drain it."""
