"""A loopback Azure Service Bus emulator that the real azure-servicebus SDK talks to over AMQP 1.0.

Run it:  ``sebridge servicebus-emulator --port 0 [--config infra/servicebus-emulator/Config.json]``
(prints ``listening on amqp://127.0.0.1:<port>``; state is in memory only).

Connect with Microsoft's emulator connection string::

    Endpoint=sb://127.0.0.1:<port>;SharedAccessKeyName=RootManageSharedAccessKey;
    SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;

or ``ServiceBusClient("127.0.0.1:<port>", credential, use_tls=False)`` for a token credential
(JWTs are accepted unchecked). AMQP over WebSockets (``--websocket-port``): the same connection
string plus ``transport_type=TransportType.AmqpOverWebsocket,
custom_endpoint_address="sb://127.0.0.1:<websocket port>"``. From tests, use
``emulators.servicebus.testing.running_emulator``.

Modules: ``server`` (the program: flags, config loading, listening sockets, signals),
``bridge`` (one thread per connection: TLS, WebSocket upgrade, SASL, then the AMQP bytes to and
from the reactor), ``frames`` (renumbers delivery-ids a multi-threaded client sent out of
order), ``websocket`` (RFC 6455 server side), ``adapter`` (the Qpid Proton adapter: AMQP
attaches, transfers and dispositions to calls on the core and back; the reactor thread and its
timers), ``config`` (Config.json, tier and size limits), ``sqlfilter`` and ``durations`` (pure
parsers), ``codec`` (AMQP sections), ``amqpbytes`` (encoded values at the byte level),
``decimals`` (decimal properties as Service Bus re-encodes them), ``broker`` (entities, locks,
sessions; pure), ``management`` ($management operations), ``auth`` ($cbs tokens), ``sasl``
(ANONYMOUS/PLAIN), ``tls`` (self-signed certificate), ``wire`` (stored message to AMQP bytes),
``testing`` (run the emulator as a child process from tests).
"""
