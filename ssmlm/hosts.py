"""What the processes of one multi-host run wait on from each other, each wait with a deadline that ends in one
line naming the hosts that never came, and the check that a local location is really the same on every host.

Hosts meet at barriers (jax's coordination service: ``wait_at_barrier`` with a timeout) and poll for files another
host writes (a dataset's tokenizer and shards); neither may wait forever, since a host that died or never started
would otherwise leave the others silent. The deadlines are settings of the environment, the same on every host:

  SSMLM_BARRIER_TIMEOUT     s, default 300: quick meetings (the run directory written, a location probed)
  SSMLM_DATA_TIMEOUT        s, default 600: data work another host does (its tokenizer, its shards, the dataset
                            finished); for shards, the time without a new one
  SSMLM_HEARTBEAT_TIMEOUT   s, default 100 (jax's): how long a host may send no heartbeat before the coordinator
                            counts it dead and every other host stops

A pod's hosts share no disk unless one is mounted on each: a local run directory or data cache that is not the
same on every host is found out by a probe (``check_shared``) before any work, instead of each host waiting for
files that only another host's disk has.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from ssmlm.errors import UserError, reason

ROLL_CALL_S = 10.0  # after a failed collective, how long the survivors wait for each other to name the lost
TIMEOUTS = {"SSMLM_BARRIER_TIMEOUT": 300.0, "SSMLM_DATA_TIMEOUT": 600.0, "SSMLM_HEARTBEAT_TIMEOUT": 100.0}
NO_SHARED_DISK = "a pod without a shared disk needs train.out_dir=gs://… (or a disk every host mounts at the same path)"
_calls: dict[str, int] = {}  # barrier name -> times met: every host meets the same barriers in the same order


def timeout(name: str) -> float:
    """A deadline's seconds from the environment (TIMEOUTS: the names and their defaults)."""
    raw = os.environ.get(name)
    if raw is None:
        return TIMEOUTS[name]
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UserError(f"{name} = '{raw}': expected a number of seconds > 0")
    return value


def count() -> tuple[int, int]:
    """(this host's index, the number of hosts); (0, 1) without jax's distributed runtime."""
    import jax

    return jax.process_index(), jax.process_count()


def _client():
    from jax._src import distributed

    return distributed.global_state.client


def barrier(name: str, what: str, setting: str = "SSMLM_BARRIER_TIMEOUT") -> None:
    """Every host waits here until all have come, at most ``setting``'s seconds; then one line naming ``what``
    was awaited and the hosts that did not come. A no-op with one host."""
    me, n = count()
    if n == 1:
        return
    seconds = timeout(setting)
    _calls[name] = k = _calls.get(name, 0) + 1
    key = f"ssmlm/arrived/{name}/{k}"
    client = _client()
    try:
        client.key_value_set(f"{key}/{me}", "1")
        client.wait_at_barrier(f"ssmlm/{name}/{k}", int(seconds * 1000), None)
    except Exception as e:  # jax's runtime errors: a timeout, a dead task, the coordinator gone
        who = _missing(client, key, n, me, e)
        raise UserError(f"{who} did not reach {what} within {seconds:g} s ({setting})") from None


def _missing(client, key: str, n: int, me: int, e: Exception) -> str:
    """'host 1' / 'hosts 1, 3' that did not arrive (from the arrival marks, else from jax's message)."""
    try:
        came = {int(k.rsplit("/", 1)[-1]) for k, _ in client.key_value_dir_get(f"{key}/")}
        missing = [i for i in range(n) if i not in came]
    except Exception:  # the coordinator (host 0) itself is gone
        if me != 0:
            return "host 0 (the coordinator) cannot be reached:"
        missing = []
    if not missing:  # jax's own word: "Some timed out task names:\n1\n3" / "Task 1 heartbeat timeout"
        text = str(e)
        listed = re.search(r"timed out task names:\s*((?:\d+\s*)+)", text)
        found = listed.group(1).split() if listed else re.findall(r"Task (\d+)", text)
        missing = [int(x) for x in found]
    if not missing:
        return "some host"
    return ("host " if len(missing) == 1 else "hosts ") + ", ".join(map(str, sorted(set(missing))))


def wait_for(
    done: Callable[[], bool], what: str, setting: str = "SSMLM_DATA_TIMEOUT", progress=None, poll_s: float = 1.0
) -> None:
    """Poll ``done()`` until it is true, at most ``setting``'s seconds (counted from the last change of
    ``progress()``, when given: a slow host that still moves is not a dead one); then one line naming ``what``."""
    seconds = timeout(setting)
    last, since = (progress() if progress else None), time.monotonic()
    while not done():
        if progress is not None and (now := progress()) != last:
            last, since = now, time.monotonic()
        if time.monotonic() - since > seconds:
            raise UserError(
                f"waited {seconds:g} s ({setting}) for {what}, written by another host; it never came: that host "
                "stopped, or it writes to a disk this host does not see (" + NO_SHARED_DISK + ")"
            )
        time.sleep(poll_s)


def check_shared(path: Path, what: str) -> None:
    """With several hosts and a local ``path``: host 0 writes a random token into it, every other host reads it
    back at the same path; unless every host sees it, every host stops here with one line, before any work."""
    me, n = count()
    if n == 1:
        return
    client = _client()
    name = f"shared/{what}"
    _calls[name] = k = _calls.get(name, 0) + 1
    probe = Path(path) / f".ssmlm-probe-{k}"
    if me == 0:
        token = secrets.token_hex(16)
        Path(path).mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
        client.key_value_set(f"ssmlm/probe/{what}/{k}", token)
    token = client.blocking_key_value_get(f"ssmlm/probe/{what}/{k}", int(timeout("SSMLM_BARRIER_TIMEOUT") * 1000))
    try:
        seen = probe.read_text() == token
    except OSError:
        seen = False
    client.key_value_set(f"ssmlm/probe/{what}/{k}/{me}", "1" if seen else "0")
    barrier(name, f"the probe of {what} {path}")
    if me == 0:
        probe.unlink(missing_ok=True)
    blind = sorted(
        int(key.rsplit("/", 1)[-1]) for key, v in client.key_value_dir_get(f"ssmlm/probe/{what}/{k}/") if v != "1"
    )
    if blind:
        hosts = f"host {blind[0]} sees" if len(blind) == 1 else f"hosts {', '.join(map(str, blind))} see"
        raise UserError(f"{what} {path} is on host 0's own disk: {hosts} another folder there; {NO_SHARED_DISK}")


def heartbeat_timeout() -> int:
    """jax's heartbeat timeout (whole seconds) for jax.distributed.initialize."""
    return max(1, round(timeout("SSMLM_HEARTBEAT_TIMEOUT")))


def agreed_stop(step: int) -> bool:
    """Whether every host stops after ``step``: a SIGTERM to any host (jax's preemption notice, which it catches)
    makes all hosts agree on one step (the furthest host's next), where each saves and stops. Every host calls
    this at every step, from the same first step."""
    me, n = count()
    if n == 1 or _client() is None:
        return False
    from jax.experimental import multihost_utils

    return multihost_utils.reached_preemption_sync_point(step)


def lost(e: Exception) -> UserError | None:
    """A collective that failed under several hosts (a peer's connection closed: it died or was killed), as one
    line naming the hosts that no longer answer a roll call (ROLL_CALL_S); None when every host answers (then
    the failure is not a lost host's)."""
    me, n = count()
    client = _client()
    _calls["lost"] = k = _calls.get("lost", 0) + 1
    key = f"ssmlm/arrived/lost/{k}"
    try:
        client.key_value_set(f"{key}/{me}", "1")
        client.wait_at_barrier(f"ssmlm/lost/{k}", int(ROLL_CALL_S * 1000), None)
        return None
    except Exception as roll:
        who = f"{_missing(client, key, n, me, roll)} stopped"
    return UserError(f"{who} during training: {reason(e)}; host {me} stops too (resume from the newest checkpoint)")


EXIT_MEETING_S = 5.0  # how long a failing host waits for the others to say why they stop too


def leave(code: int) -> None:
    """Exit now with ``code``, the one line printed. The hosts that fail together meet first (for at most
    EXIT_MEETING_S): host 0 runs the coordinator, and a host still printing its line when the coordinator goes
    would be ended by jax's runtime instead, with a stack trace. jax's own shutdown is skipped: with a host gone
    it waits out the heartbeat timeout and then aborts."""
    import sys

    try:
        _client().wait_at_barrier("ssmlm/exit", int(EXIT_MEETING_S * 1000), None)
    except Exception:  # a host that goes on (or is gone) does not come: its own deadline stops it
        pass
    if count()[0] == 0:
        time.sleep(1.0)  # the others leave first
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
