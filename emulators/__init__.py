"""Loopback stand-ins for what these machines cannot run: IMDS, Service Bus, the Functions host."""
