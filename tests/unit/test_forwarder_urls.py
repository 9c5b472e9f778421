"""URLs from the forwarder's settings are checked when read, by the HTTP client's own check
(``check_url``: the formatting every request goes through): one it could not send a request
to once started fine and failed at every request (the drain probe then answered 503 for a
healthy application)."""

from __future__ import annotations

import pytest

from sebridge.forwarder.config import ConfigError, parse_config

UNSENDABLE = ["http://127.0.0.1/sant\u00e9", "http://127.0.0.1/a b", "http://127.0.0.1/a\nb"]


@pytest.mark.parametrize(
    "url", [*UNSENDABLE, "imds.local/metadata", "ftp://127.0.0.1/", "http://127.0.0.1/?x=1"]
)
def test_an_imds_endpoint_no_request_could_be_sent_to_is_refused_at_start(url: str) -> None:
    with pytest.raises(ConfigError, match="--imds-endpoint cannot be asked"):
        parse_config(["--dry-run", "--imds-endpoint", url], env={})


@pytest.mark.parametrize("url", UNSENDABLE)
def test_a_drain_probe_upstream_no_check_could_be_sent_to_is_refused_at_start(url: str) -> None:
    argv = ["--dry-run", "--drain-probe-port", "8081", "--drain-probe-upstream", url]
    with pytest.raises(ConfigError, match="--drain-probe-upstream cannot be asked"):
        parse_config(argv, env={})


def test_urls_requests_can_be_sent_to_are_taken() -> None:
    argv = ["--dry-run", "--imds-endpoint", "http://127.0.0.1:8080"]
    argv += ["--drain-probe-port", "8081", "--drain-probe-upstream", "http://[::1]:80/h?q=%C3%A9"]
    config = parse_config(argv, env={})
    assert config.imds_endpoint == "http://127.0.0.1:8080"
