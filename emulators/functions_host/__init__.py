"""A local stand-in for the Azure Functions host that drives function_app.py (Python v2 model).

Azure Functions Core Tools cannot be installed here, so this package indexes the app with the
azure-functions package's own metadata, receives from the (emulated) Service Bus with the real
azure-servicebus SDK, serves HTTP triggers on loopback and settles messages the way the
Functions Service Bus extension does. See host.py for the command line and FunctionsHost.
"""
