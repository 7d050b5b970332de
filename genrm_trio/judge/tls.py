"""How a judge connection reaches the judge: the TLS context that verifies it, and the proxy
variables it does not follow (every judge connection, and the start-up probe, goes straight to
the judge's host)."""

from __future__ import annotations

import os
import ssl
from typing import Final

__all__ = ["PROXY_VARIABLES", "judge_ssl_context", "proxy_variables_set"]


def judge_ssl_context(ca_file: str | None = None) -> ssl.SSLContext:
    """The TLS context of every judge connection and of the start-up probe: `judge.ca_file`
    (a private CA bundle) when set; else `SSL_CERT_FILE` and/or `SSL_CERT_DIR` when set; else
    certifi's bundle (as httpx)."""
    if ca_file is not None:
        return ssl.create_default_context(cafile=ca_file)
    cafile = os.environ.get("SSL_CERT_FILE") or None
    capath = os.environ.get("SSL_CERT_DIR") or None
    if cafile is not None or capath is not None:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


PROXY_VARIABLES: Final = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def proxy_variables_set() -> list[str]:
    """The proxy environment variables set (any case): genrm-trio does not use them."""
    return sorted(
        name for name in os.environ if name.upper() in PROXY_VARIABLES and os.environ[name]
    )
