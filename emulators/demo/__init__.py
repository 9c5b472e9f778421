"""`sebridge demo`: the whole bridge on 127.0.0.1, one scenario end to end, with a timeline.

What runs (all loopback, nothing from Azure):
- the IMDS simulator (a child process) replaying a packaged scenario, re-homed onto a small
  demo world: VMs web-1, web-2... in resource group rg-web, behind load balancer lb-web;
- the Service Bus emulator (a child process) with the project's entities;
- the local functions host running the real function_app.py (in this process), with Teams
  played by a loopback sink that renders each card as text, ARM by a loopback fake that holds
  the VMs, their NICs and the pool, and managed identity by a loopback token endpoint;
- `sebridge forwarder` (a child process) publishing to the emulator and taking approvals.

The loop it proves: Scheduled -> Teams card -> pool removal -> Prepared -> gate approval ->
IMDS POST -> Started -> Completed -> pool restored. It exits 0 when every event of the
scenario ended (Completed or Cancelled), every event first seen Scheduled was approved through
IMDS, and every pool change was undone (except after Terminate and Preempt, whose VM is gone);
otherwise non-zero with the reasons. Every process it started is stopped either way.

``--source eventgrid`` runs the same scenario with no forwarder: the events reach the topic
through Event Grid and the ingestion function, and the gate approves through ARM;
``--source both`` runs the two side by side and requires one message per transition on the
topic (``sources``).

The VMs share one availability set (the scope check lets web-1 report events of the others),
and pool-a keeps one spare member (web-spare) so that the capacity guard (LB_MIN_HEALTHY=1)
never holds a packaged scenario's drain. The demo's own scenario ``capacity-hold`` has no
spare: two overlapping events on the pool of two show a ``Held`` (the second drain would
empty the pool), and the held event is drained and approved once the first completes.
``long-notice``: a Reboot with ten minutes' notice and a maintenance window that opens about a
minute in (the next whole minute at least 40 s away): the VM stays in its pool until the window's
start minus the lead (20 s), is drained, approved when the window opens, rebooted and restored,
long before NotBefore (lb-pools drains at the moment: DrainMomentsQueueName).

Storage is Azurite (Microsoft's storage emulator, emulators/azurite): the pools' leases and held
events, agentless ingestion's records and the history's table, over HTTPS with the identity
fake's tokens. The run also shows the history (``history``): each event in the calendar feed
before it starts, and its timeline from the history endpoint once it ended.

The modules, each importing only those above it:

- ``world``: the demo world (VMs, resource group, the demo's own scenarios, the app settings);
- ``timeline``: what happened, when;
- ``verdict``: what a scenario exists to show and whether it did (pure);
- ``stack``: the stand-ins every demo runs (:class:`~emulators.demo.stack.DemoStack`);
- ``sources``: where events come from (the forwarder, Event Grid or both);
- ``history``: what the run shows of the event history (calendar feed, timelines);
- ``scenario``: a packaged scenario run end to end;
- ``vm_side``: ``--scenario vm-side``, the VM preparing itself;
- ``cli``: ``sebridge demo``'s command line.
"""
