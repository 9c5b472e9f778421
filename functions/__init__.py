"""The workflows: Azure Functions (Python v2 model) subscribed to the scheduled-events topic."""
