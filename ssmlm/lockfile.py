"""One writer per directory: a lock file that a second writer is refused by (or waits on), naming its holder.

The lock is an advisory ``flock`` on ``<dir>/LOCK`` (the kernel releases it when its holder's process ends,
however it ends), and the file says who holds it — host, pid, start time, command — for the person reading the
refusal. A file left behind by a holder that died on this host is taken over, saying so in one line; one written
on another host (a shared disk, where flock may not reach across machines) is never taken over: only a person
knows whether that holder is gone, and the refusal says which file to delete then. Readers take no lock.

A directory in a bucket (gs://…) has no flock: its lock is the object ``<dir>/LOCK``, created only if absent (GCS's
precondition ifGenerationMatch=0, which the server checks, so of two writers exactly one creates it), naming its
holder the same way. The holder deletes it when it ends; one left by a holder killed outright is taken over only
from the same host with that pid gone. (Two takers of one stale lock at the same moment could both delete it
before one creates it again: that needs a kill and two restarts on one host within a request's time.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ssmlm import paths
from ssmlm.errors import UserError

NAME = "LOCK"
WAIT_POLL_S = 0.5


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _who(info: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"])) if "since" in info else "?"
    command = f" ({info['command']})" if info.get("command") else ""
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')} since {since}{command}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _refusal(what: str, path: Path | str, info: dict) -> UserError:
    parent = str(path).rsplit("/", 1)[0]
    return UserError(f"{what} {parent} is in use by {_who(info)}; if that process is gone, delete {path} and run again")


def _me() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.time(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
    }


@contextlib.contextmanager
def locked(
    directory: Path | str, what: str, *, wait: bool = False, say: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold ``directory``'s lock for the block. Held by another live writer: a UserError naming it, or with
    ``wait``, wait until it is released (``say`` gets one line first). ``say`` also gets the line when a dead
    holder's lock is taken over. A gs:// ``directory``: the bucket's lock object."""
    if paths.is_remote(directory):
        with _bucket_locked(str(directory), what, wait=wait, say=say):
            yield
        return
    path = directory / NAME
    me = _me()
    said = False
    while True:
        directory.mkdir(parents=True, exist_ok=True)  # again each time: a failed holder may have removed it
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            if not wait:
                raise _refusal(what, path, _holder(path)) from None
            if not said and say:
                say(f"waiting for {what} {directory}: in use by {_who(_holder(path))}")
            said = True
            time.sleep(WAIT_POLL_S)
            continue
        # the file may have been removed (its holder released it) between our open and our flock: then this lock
        # is on a file nobody else will see, and the next writer would take the new one too; start again
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        break
    try:
        old = _holder(path)
        if old:  # the kernel gave us the lock, yet the file names a holder: it ended without releasing
            if old.get("host") != me["host"]:
                raise _refusal(what, path, old)
            if _alive(old.get("pid", -1)) and say:
                say(f"lock: {path} named {_who(old)}, which holds no lock (its pid is another process now)")
            elif say:
                say(f"lock: took over {path} from {_who(old)}, which is no longer running")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # before unlocking: a writer that opened it meanwhile sees the inode change and retries
        os.close(fd)


def _bucket_holder(url: str) -> dict | None:
    """The lock object's holder; None when there is no object (released meanwhile)."""
    try:
        return json.loads(paths.read_bytes(url) or b"{}")
    except FileNotFoundError:
        return None
    except ValueError:
        return {}


@contextlib.contextmanager
def _bucket_locked(directory: str, what: str, *, wait: bool, say: Callable[[str], None] | None) -> Iterator[None]:
    url = paths.join(directory, NAME)
    me = _me()
    said = False
    while not paths.create(url, json.dumps(me).encode()):
        old = _bucket_holder(url)
        if old is None:
            continue
        if old.get("host") == me["host"] and not _alive(old.get("pid", -1)):
            if say:
                say(f"lock: took over {url} from {_who(old)}, which is no longer running")
            paths.remove(url)
            continue
        if not wait:
            raise _refusal(what, url, old)
        if not said and say:
            say(f"waiting for {what} {directory}: in use by {_who(old)}")
        said = True
        time.sleep(WAIT_POLL_S)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # a lock deleted by hand (or taken over) is not ours to remove
            if _bucket_holder(url) == me:
                paths.remove(url)
