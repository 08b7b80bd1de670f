"""Every path a user names — ``data.source``, ``SSMLM_HOME``, ``train.out_dir``, ``--ckpt``, ``--out`` — is a local
path or a bucket URL, ``gs://BUCKET/KEY``; this module tells them apart and opens the bucket ones.

A URL is never resolved as a local path: ``pathlib.Path("gs://b/runs")`` is the local folder ``gs:/b/runs``, so
every entry point asks ``is_remote`` first, and ``check_url`` refuses, in one line and before any work, a scheme
ssmlm cannot open, a missing ``gcsfs`` (the ``ssmlm[gcs]`` extra) and a bucket it cannot reach.

Buckets are reached through fsspec's ``gcsfs``; checkpoints through Orbax, which writes ``gs://`` itself (through
TensorStore). Both honour a local GCS server (an emulator, as the tests use: fake-gcs-server) named by
``STORAGE_EMULATOR_HOST``; ``use_emulator`` points TensorStore at the same server and makes neither client look for
Google credentials, which an emulator does not check.
"""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
from pathlib import Path, PurePosixPath

from ssmlm.errors import UserError

SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
OPENED = ("gs",)  # the schemes ssmlm opens


def scheme(path: str | os.PathLike) -> str | None:
    """'gs' of 'gs://b/k'; None for a local path (a Windows drive letter is not a scheme: it has no '//')."""
    m = SCHEME.match(str(path))
    return m.group(1).lower() if m else None


def is_remote(path: str | os.PathLike | None) -> bool:
    return path is not None and scheme(path) is not None


def bucket_of(url: str) -> str:
    return str(url).split("://", 1)[1].split("/", 1)[0]


def join(base: str, *parts: str) -> str:
    """A URL's child: 'gs://b/runs' + 'x' -> 'gs://b/runs/x' (no local path semantics, no '..')."""
    head, _, key = str(base).partition("://")
    return f"{head}://{PurePosixPath(key, *parts)}"


def check_url(url: str, where: str) -> None:
    """One line, before any work, for a URL ssmlm cannot use: its scheme, a missing extra, an unreachable or
    missing bucket. ``where`` names the option or field it came from."""
    kind = scheme(url)
    if kind not in OPENED:
        raise UserError(
            f"{where} '{url}': ssmlm opens local paths and gs://BUCKET/… URLs, not {kind}://; expected a local path "
            "or a gs:// URL"
        )
    bucket = bucket_of(url)
    if not bucket:
        raise UserError(f"{where} '{url}': no bucket named; expected gs://BUCKET/PATH")
    fs = filesystem(url, where)
    endpoint = _emulator_url() or "https://storage.googleapis.com"
    try:  # one connection, at once: gcsfs would retry a refused one with backoff for over a minute
        parts = urllib.parse.urlsplit(endpoint)
        socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)), 10).close()
    except OSError as e:
        raise UserError(
            f"{where} '{url}': bucket gs://{bucket} cannot be reached ({endpoint}: {e.strerror or e})"
        ) from None
    try:
        found = fs.exists(bucket)
    except Exception as e:  # credentials, DNS, a refused connection: gcsfs raises many kinds
        raise UserError(f"{where} '{url}': bucket gs://{bucket} cannot be reached ({_first_line(e)})") from None
    if not found:
        raise UserError(f"{where} '{url}': bucket gs://{bucket} does not exist (or is not visible to this account)")


def filesystem(url: str = "gs://", where: str = "a gs:// path"):
    """The fsspec file system of ``url``'s scheme (one instance per process: fsspec caches it)."""
    use_emulator()  # before gcsfs is imported: it reads its settings then
    try:
        import fsspec
        import gcsfs  # noqa: F401  (fsspec finds it by the protocol; imported here to name the extra if missing)
    except ImportError:
        raise UserError(f"{where}: gs:// paths need gcsfs: pip install 'ssmlm[gcs]'") from None
    emulator = _emulator_url()
    options = {"token": "anon", "endpoint_url": emulator} if emulator else {}
    return fsspec.filesystem(scheme(url) or "gs", **options)


def use_emulator() -> None:
    """With ``STORAGE_EMULATOR_HOST`` set (a local GCS server), TensorStore (Orbax's writer) goes there too, and no
    client looks for Google credentials: an emulator checks none, and the lookup would try the cloud's metadata
    server. Without it, nothing changes."""
    url = _emulator_url()
    if not url:
        return
    os.environ["TENSORSTORE_GCS_HTTP_URL"] = url
    os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")  # TensorStore: this token, no lookup
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # gcsfs's bucket probe stalls on emulators


def _emulator_url() -> str | None:
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if not host:
        return None
    return host if host.startswith(("http://", "https://")) else f"http://{host}"


def local(path: str | os.PathLike, where: str) -> Path:
    """A path the caller can only use locally, as a Path; a URL is refused in one line rather than turned into a
    local folder named 'gs:'."""
    if is_remote(path):
        raise UserError(f"{where} '{path}': a local path is expected here (bucket URLs are not read here yet)")
    return Path(path).expanduser()


def _first_line(e: BaseException) -> str:
    line = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {line}"[:200] if line else type(e).__name__


# ----------------------------------------------------------------------------- objects in a bucket
# The few operations the rest of ssmlm needs of a bucket, each on a gs:// URL. An object is written whole (GCS
# replaces it atomically on upload), so a reader never sees half of one.


def _key(url: str) -> str:
    return str(url).split("://", 1)[1]


def exists(url: str) -> bool:
    return filesystem(url).exists(_key(url))


def read_bytes(url: str) -> bytes:
    return filesystem(url).cat_file(_key(url))


def write_bytes(url: str, data: bytes) -> None:
    filesystem(url).pipe_file(_key(url), data)


def listing(url: str) -> list[str]:
    """Every object under ``url`` (a prefix, as a folder), as gs:// URLs, sorted; [] when there is none."""
    fs = filesystem(url)
    fs.invalidate_cache()  # another process (host) may have written since this one last listed
    return sorted(f"gs://{k}" for k in fs.find(_key(url).rstrip("/") + "/"))


def glob(pattern: str) -> list[str]:
    fs = filesystem(pattern)
    fs.invalidate_cache()
    return sorted(f"gs://{k}" for k in fs.glob(_key(pattern)))


def info(url: str) -> dict:
    """The object's metadata: ``size`` and ``generation`` (GCS's version of the object: any rewrite changes it)."""
    fs = filesystem(url)
    fs.invalidate_cache()
    return fs.info(_key(url))


def download(url: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    filesystem(url).get_file(_key(url), str(dest))


def upload(src: Path, url: str) -> None:
    filesystem(url).put_file(str(src), _key(url))


def remove(url: str, recursive: bool = False) -> None:
    fs = filesystem(url)
    if fs.exists(_key(url)):
        fs.rm(_key(url), recursive=recursive)


def objects(url: str) -> dict[str, dict]:
    """url -> info (``size``, ``generation``) of every object a glob pattern matches, or of the one object named, or
    of every object under a folder URL, from one listing; {} when there is none."""
    fs = filesystem(url)
    fs.invalidate_cache()
    key = _key(url)
    found = fs.glob(key, detail=True) if any(c in key for c in "*?[") else fs.find(key.rstrip("/"), detail=True)
    return {f"gs://{k}": i for k, i in found.items() if i.get("type") != "directory"}


def open_url(url: str, mode: str = "rb", **kwargs):
    """An object opened as a file (fsspec: read in blocks as it is consumed, so memory stays bounded)."""
    return filesystem(url).open(_key(url), mode, **kwargs)


def create(url: str, data: bytes) -> bool:
    """Write ``data`` to ``url`` only if no object is there (GCS's ifGenerationMatch=0 precondition: of writers
    racing, exactly one wins); False when one already was."""
    try:
        filesystem(url).pipe_file(_key(url), data, mode="create")
    except FileExistsError:
        return False
    return True
