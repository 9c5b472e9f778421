"""The outbox keeps one event's messages in order (review round four, side observation).

After a full disk cleared, the review saw a Prepared reach the outbox, and the topic, before
its event's Scheduled (same session). Two ways: the poll's outbox write failed (the Scheduled
not recorded, derived again at the next poll) while the Prepared, retried on its own, got in
first; or the state file could not be saved (the Scheduled held in the outbox) while the
Prepared went in ready and was sent past it. Now the forwarder takes none of its own messages
for an event whose transitions are not recorded yet (``Forwarder.deliver``), and the outbox
hands out no row behind a held row of its session (``Outbox.peek``). The disk here is the real
outbox behind writes that fail, and a state store whose saves fail, then recover.
"""

from __future__ import annotations

import uuid

from sebridge.contract.events import Envelope, prepared_message
from sebridge.imds import Document
from tests.support.forwarder_fakes import OBSERVER, T0, World, scheduled


def prepared(event_id: str) -> Envelope:
    (event,) = Document.from_imds(
        {"DocumentIncarnation": 1, "Events": [scheduled(event_id)]}
    ).events
    return prepared_message(
        event,
        OBSERVER,
        1,
        T0,
        source=OBSERVER.source,
        prepared_vms=[OBSERVER.vm_name],
        cause=f"{event_id.lower()}:Scheduled:1|hooks|vm1",
        prepared_by="hooks",
    )


def subjects(world: World, event_id: str) -> list[str]:
    return [e.subject for e in world.broker.transitions() if e.session_id == event_id.lower()]


def test_a_prepared_never_goes_in_before_a_scheduled_whose_write_failed() -> None:
    world = World()
    event_id = str(uuid.uuid4())
    world.imds.set([scheduled(event_id)])
    world.outbox.fail_writes = 1  # the poll's write fails; the disk is free again right after
    assert world.forwarder.tick() is None
    assert world.outbox.depth() == 0
    message = prepared(event_id)
    assert world.forwarder.deliver(message) is False, "went in before its Scheduled"
    world.forwarder.send_pending()
    assert world.forwarder.tick() is None  # derived again, recorded now
    assert world.forwarder.deliver(message) is True
    world.forwarder.send_pending()
    assert subjects(world, event_id) == ["Scheduled", "Prepared"]


def test_a_prepared_is_not_sent_past_a_scheduled_held_while_the_state_cannot_be_saved() -> None:
    world = World()
    event_id, other = str(uuid.uuid4()), str(uuid.uuid4())
    world.imds.set([scheduled(other)])
    assert world.forwarder.tick() is None
    world.forwarder.send_pending()
    world.imds.set([scheduled(other), scheduled(event_id)])
    world.store.fail_next = 1  # the state file cannot be saved: the Scheduled is held
    world.clock.advance(1.0)
    assert world.forwarder.tick() is None
    assert world.outbox.held() == 1
    assert world.forwarder.deliver(prepared(event_id)) is True  # recorded: it may go in...
    assert world.forwarder.deliver(prepared(other)) is True
    world.forwarder.send_pending()
    assert subjects(world, event_id) == []  # ...but not out before its Scheduled
    assert subjects(world, other) == ["Scheduled", "Prepared"]  # other sessions go on
    world.clock.advance(1.0)
    assert world.forwarder.tick() is None  # the save succeeds: the Scheduled is released
    world.forwarder.send_pending()
    assert subjects(world, event_id) == ["Scheduled", "Prepared"]
