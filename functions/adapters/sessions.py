"""The one way the Function App makes a requests session.

requests looks for proxies in the environment on every request, walking every variable twice
(``urllib.request.getproxies``, once for the proxies, once for ``no_proxy``): about 1.5 ms of
CPU a request with the hundred-odd variables of a Functions worker, more than the request
itself costs over a kept-alive connection to a fake. The environment of a worker does not
change while it runs, so :class:`Session` reads the proxies once per scheme and host and keeps
everything else requests does with the environment (``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``,
``NO_PROXY``, proxies passed to a call, which win over the environment's).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.utils import get_environ_proxies

# Hosts are the app's own peers (ARM, storage, Teams, the webhooks' endpoints): a handful. The
# bound only keeps a misconfiguration from growing the map without end.
MAX_HOSTS = 64


class Session(requests.Session):
    """A requests session whose proxies from the environment are read once per scheme and
    host (thread-safe: the app's invocations share one)."""

    def __init__(self) -> None:
        super().__init__()
        self._environ_proxies: dict[tuple[str, str, str | None], dict[str, str]] = {}
        self._environ_lock = threading.Lock()

    def _proxies_for(self, url: str, no_proxy: str | None) -> dict[str, str]:
        parts = urlsplit(url)
        key = (parts.scheme.lower(), parts.netloc.lower(), no_proxy)
        with self._environ_lock:
            found = self._environ_proxies.get(key)
        if found is None:
            found = get_environ_proxies(url, no_proxy=no_proxy)
            with self._environ_lock:
                if len(self._environ_proxies) >= MAX_HOSTS:
                    self._environ_proxies.clear()
                self._environ_proxies[key] = found
        return dict(found)

    def merge_environment_settings(
        self,
        url: str | bytes | None,
        proxies: Any,
        stream: Any,
        verify: Any,
        cert: Any,
    ) -> Any:
        """requests' own (requests.Session.merge_environment_settings), with the proxies of
        the environment from :meth:`_proxies_for`."""
        if self.trust_env:
            no_proxy = proxies.get("no_proxy") if proxies is not None else None
            if proxies is not None:
                text = url.decode("latin-1") if isinstance(url, bytes) else url or ""
                for scheme, proxy in self._proxies_for(text, no_proxy).items():
                    proxies.setdefault(scheme, proxy)
            if verify is True or verify is None:
                bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
                verify = bundle or verify
        return {
            "proxies": _merge(proxies, self.proxies),
            "stream": _merge(stream, self.stream),
            "verify": _merge(verify, self.verify),
            "cert": _merge(cert, self.cert),
        }


def _merge(given: Any, session: Any) -> Any:
    """requests.sessions.merge_setting: the call's setting over the session's; in a mapping,
    a key the call sets to None is removed."""
    if session is None:
        return given
    if given is None:
        return session
    if not (isinstance(given, Mapping) and isinstance(session, Mapping)):
        return given
    merged = {**session, **given}
    return {key: value for key, value in merged.items() if value is not None}
