"""Whether the Hugging Face hub can be reached, decided once and at once.

Without this, `datasets`/`huggingface_hub` on a machine with no network retry each request for close to a
minute (with a warning per retry) before failing. When the hub is out of reach this process switches both
libraries to their offline mode, so they look only in the local cache: a cached dataset still loads, anything
else fails immediately.
"""

from __future__ import annotations

import os
import socket
import sys
from urllib.parse import urlparse

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_TRUE = {"1", "true", "yes", "on"}
_unreachable: str | None = None  # why the probe failed, once it has


def _go_offline() -> None:
    for var in OFFLINE_VARS:
        os.environ[var] = "1"
    # Both libraries read the variables once, at import; patch them if they are already loaded.
    if (constants := sys.modules.get("huggingface_hub.constants")) is not None:
        constants.HF_HUB_OFFLINE = True
    if (cfg := sys.modules.get("datasets.config")) is not None:
        cfg.HF_HUB_OFFLINE = cfg.HF_DATASETS_OFFLINE = True


def offline_reason(timeout: float = 3.0) -> str | None:
    """Why the hub cannot be reached (None: it can be). Offline variables are honoured without a probe."""
    global _unreachable
    if _unreachable is not None:
        return _unreachable
    if any(os.environ.get(v, "").lower() in _TRUE for v in OFFLINE_VARS):
        return "offline mode is on (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE)"
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        _unreachable = f"{host} is not reachable: {e.strerror or type(e).__name__}"
        _go_offline()
    return _unreachable
