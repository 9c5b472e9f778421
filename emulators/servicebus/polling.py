"""``select.select``'s contract on poll(2), which has no limit on descriptor numbers; and
Proton's reactor selector without its per-event walk over every connection.

select() refuses file descriptors from 1024 up (FD_SETSIZE). The emulator holds three per
connection (the client's socket and a socket pair to the reactor) and a functions host opens
64 receivers per session trigger, so two hosts passed 1024: the connection pumps ended at
random and Proton's own reactor loop (``proton._io.IO.select``) raised ValueError, which ended
the whole emulator. :func:`select_by_poll` is used by the pumps, and :func:`install_into_proton`
makes the reactor use it too.

Proton's Python selector (``proton._io.IO.Selector``) recomputes its earliest deadline over
every selectable on each ``update`` of one of them, and the reactor updates a selectable on
nearly every transport event: with a few hundred connections (two functions hosts' session
receivers) that walk was a third of the reactor thread's time in a burst.
:func:`incremental_update` folds in the updated selectable's deadline alone, which gives the
same deadline: the selector only ever lowers it between two ``select`` calls, which recompute
it from scratch, and every change of a deadline is followed by an ``update``.
"""

from __future__ import annotations

import select
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")

_READ = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR
_WRITE = select.POLLOUT | select.POLLHUP | select.POLLERR
_EXCEPTIONAL = select.POLLPRI


def _fd(item: Any) -> int:
    fd = item if isinstance(item, int) else item.fileno()
    if not isinstance(fd, int) or fd < 0:
        raise OSError(f"{item!r} has no open descriptor")
    return fd


def select_by_poll(
    readers: Iterable[T],
    writers: Iterable[T],
    exceptional: Iterable[T] = (),
    timeout: float | None = None,
) -> tuple[list[T], list[T], list[T]]:
    """(ready to read, ready to write, exceptional), as ``select.select(r, w, x, timeout)``
    answers them: the items themselves (sockets, descriptors, or anything with ``fileno()``);
    a hang-up or an error counts as ready; a closed descriptor raises OSError; ``timeout``
    None waits for ever."""
    wanted: list[tuple[Iterable[T], int]] = [
        (readers, _READ),
        (writers, _WRITE),
        (exceptional, _EXCEPTIONAL),
    ]
    masks: dict[int, int] = {}
    items: dict[int, list[tuple[T, int]]] = {}
    for group, mask in wanted:
        for item in group:
            fd = _fd(item)
            masks[fd] = masks.get(fd, 0) | mask
            items.setdefault(fd, []).append((item, mask))
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ready_to_read: list[T] = []
    ready_to_write: list[T] = []
    exceptions: list[T] = []
    for fd, happened in poller.poll(None if timeout is None else max(0.0, timeout) * 1000):
        if happened & select.POLLNVAL:
            raise OSError(f"descriptor {fd} is not open")
        for item, mask in items[fd]:
            if not happened & mask:
                continue
            if mask == _READ:
                ready_to_read.append(item)
            elif mask == _WRITE:
                ready_to_write.append(item)
            else:
                exceptions.append(item)
    return ready_to_read, ready_to_write, exceptions


proton_update: Any = None  # Proton's Selector.update, once install_into_proton replaced it


def incremental_update(selector: Any, selectable: Any) -> None:
    """``proton._io.IO.Selector.update`` without the walk over every selectable (see the
    module): the reading and writing sets, and the deadline lowered to this one's if earlier."""
    selector._reading.discard(selectable)
    selector._writing.discard(selectable)
    if selectable.reading:
        selector._reading.add(selectable)
    if selectable.writing:
        selector._writing.add(selectable)
    deadline = selectable.deadline
    if deadline and (selector._deadline is None or deadline < selector._deadline):
        selector._deadline = deadline


def install_into_proton() -> None:
    """Make Proton's Python reactor wait with poll(2) instead of select(2), and update its
    selector without walking every selectable."""
    global proton_update
    from proton import _io

    _io.IO.select = staticmethod(select_by_poll)  # type: ignore[method-assign]
    if _io.IO.Selector.update is not incremental_update:
        proton_update = _io.IO.Selector.update  # Proton's own, kept for the tests to compare
        _io.IO.Selector.update = incremental_update  # type: ignore[method-assign,assignment]
