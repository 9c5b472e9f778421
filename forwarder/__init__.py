"""The forwarder that runs on every VM: poll IMDS, diff, persist, publish, apply approvals."""
