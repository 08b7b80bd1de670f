"""The test bed of multi-host runs on one machine: N real `ssmlm` processes joined by a local coordinator
(127.0.0.1, a free port; gloo collectives on CPU), each optionally with a disk of its own: under ``unshare -m``
(a private mount namespace) a per-host folder is bind-mounted over one shared path, so every host sees the same
path and a different folder behind it, as hosts of a pod that share no disk do. Outputs go to files (readable
while the hosts run); every process is in its own process group and all are killed on leaving the block, so no
test leaves a stray process."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port free now for the coordinator, drawn below the kernel's ephemeral range: a port the kernel handed
    out (bind to 0) can be taken again by any outgoing connection (gloo's, another test's hosts) before the
    coordinator binds it, and its hosts then wait for a coordinator that never starts."""
    import random

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for port in random.sample(range(20000, low), min(200, max(0, low - 20000))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no range known (not Linux): the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_process(args: list, cwd: Path, devices: int = 2) -> None:
    """`ssmlm ARGS` as one process with ``devices`` CPU devices: the mesh a run of ``devices`` hosts of one device
    each has, so the same program (an all-reduce of two operands sums them in either order to the same bits)."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": flags}
    done = subprocess.run(
        [sys.executable, "-m", "ssmlm", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def require_unshare() -> None:
    """Skip unless this user may make mount namespaces (root, or a kernel that lets users: CI runs as root)."""
    try:
        ok = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip("private disks need `unshare -m` (mount namespaces): not permitted for this user here")


class Hosts:
    """``with Hosts(tmp_path, n) as h: h.start(args, ...); rcs = h.wait(timeout)``."""

    def __init__(self, where: Path, n: int = 2, env: dict | None = None):
        self.where, self.n = Path(where), n
        port = free_port()
        self.env = [
            {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "SSMLM_COORDINATOR": f"127.0.0.1:{port}",
                "SSMLM_NUM_PROCESSES": str(n),
                "SSMLM_PROCESS_ID": str(i),
                "PYTHONFAULTHANDLER": "1",  # a host stopped by SIGABRT (a hang, below) prints where each thread was
                **(env or {}),
            }
            for i in range(n)
        ]
        self.procs: list[subprocess.Popen] = []
        self.logs = [self.where / f"host{i}.log" for i in range(n)]

    def start(self, args: list, private: Path | None = None, cwd: Path | None = None) -> None:
        """``ssmlm ARGS`` on every host; with ``private``, each host sees its own folder (PRIVATE.host<i>) there."""
        for i in range(self.n):
            cmd = [sys.executable, "-m", "ssmlm", *map(str, args)]
            if private is not None:
                own = Path(f"{private}.host{i}")
                own.mkdir(parents=True, exist_ok=True)
                Path(private).mkdir(parents=True, exist_ok=True)
                mount = f"mount --bind {shlex.quote(str(own))} {shlex.quote(str(private))} && exec {shlex.join(cmd)}"
                cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", mount]
            with open(self.logs[i], "w") as log:
                self.procs.append(
                    subprocess.Popen(
                        cmd,
                        cwd=cwd or self.where,
                        env=self.env[i],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def output(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def signal(self, i: int, sig: int) -> None:
        os.killpg(self.procs[i].pid, sig)

    def until(self, done, timeout: float, what: str) -> None:
        """Poll ``done()`` (e.g. a file a host wrote) while the hosts run; fail, showing their outputs, if it
        never comes or every host has exited first."""
        end = time.monotonic() + timeout
        while not done():
            if time.monotonic() > end or all(p.poll() is not None for p in self.procs):
                pytest.fail(f"never saw {what}:\n{self.report()}")
            time.sleep(0.2)

    def wait(self, timeout: float) -> list[int]:
        """Every host's exit status; a host still running after ``timeout`` fails the test (all are killed)."""
        end = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in self.procs:  # where each hung host waits: faulthandler prints every thread's stack
                    if q.poll() is None:
                        os.kill(q.pid, signal.SIGABRT)
                time.sleep(3)
                pytest.fail(f"a host still ran after {timeout} s:\n{self.report()}")
        return [p.returncode for p in self.procs]

    def report(self) -> str:
        return "\n".join(
            f"--- host {i} (exit {p.poll()}) ---\n{self.output(i)[-8000:]}" for i, p in enumerate(self.procs)
        )

    def errors(self, i: int) -> list[str]:
        """The host's own lines that tell the user why it stopped (not jax's logs)."""
        return [ln for ln in self.output(i).splitlines() if ln.startswith(("error:", "interrupted:"))]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()
