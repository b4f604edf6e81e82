"""Run commands in an empty network namespace and record every name they look up.

``run_isolated`` starts ``python -m tests.netns SPEC`` under ``unshare --net --mount``: inside,
only loopback is up, a small DNS server on 127.0.0.1:53 answers every query with NXDOMAIN and
writes down the name asked, and ``/etc/resolv.conf`` (bind-mounted, for this namespace only)
points there. The commands then run one after another; what each printed, its exit code and
the names looked up come back. Nothing leaves the machine: there is no route out.

Needs root (or the rights to make namespaces), ``unshare`` and ``ip``; `available` says.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str
    lookups: list[str]
    """The names looked up while this command ran."""
    askers: list[str]
    """For each lookup, the command line of the process that made it."""


def available() -> bool:
    """Whether an empty network namespace can be made here."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        return False
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "--fork", "true"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


def run_isolated(
    commands: list[list[str]], *, env: dict[str, str], cwd: Path, timeout_s: float = 900
) -> tuple[list[Ran], list[str]]:
    """Run ``commands`` in turn in an empty network namespace; each one's outcome, and every
    name any of them looked up (in order, repeats kept)."""
    with tempfile.TemporaryDirectory(prefix="kbflow-netns-") as folder:
        spec = Path(folder) / "spec.json"
        out = Path(folder) / "out.json"
        spec.write_text(
            json.dumps({"commands": commands, "cwd": str(cwd), "env": env, "out": str(out)})
        )
        done = subprocess.run(
            ["unshare", "--net", "--mount", "--fork", sys.executable, "-m", "tests.netns",
             str(spec)],
            cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"the namespace did not run: {done.stderr[-3000:]}")
        result = json.loads(out.read_text())
    return [Ran(**r) for r in result["ran"]], result["lookups"]


def _qname(packet: bytes) -> str:
    labels, at = [], 12
    while at < len(packet) and packet[at]:
        size = packet[at]
        labels.append(packet[at + 1 : at + 1 + size].decode("ascii", "replace"))
        at += 1 + size
    return ".".join(labels)


def _nxdomain(packet: bytes) -> bytes:
    """The query back as an answer: no such name (flags QR, RD, RA; RCODE 3)."""
    return packet[:2] + b"\x81\x83" + packet[4:6] + b"\x00\x00\x00\x00\x00\x00" + packet[12:]


def _asker(port: int) -> str:
    """The command line of the process whose UDP socket has ``port`` (who asked)."""
    import psutil

    for conn in psutil.net_connections(kind="udp"):
        if conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                return " ".join(psutil.Process(conn.pid).cmdline())[:300]
            except psutil.Error:
                break
    return "?"


def _serve_dns(names: list[str], askers: list[str], ready: threading.Event) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 53))
        ready.set()
        while True:
            packet, peer = sock.recvfrom(4096)
            if len(packet) > 12:
                names.append(_qname(packet))
                askers.append(_asker(peer[1]))
                sock.sendto(_nxdomain(packet), peer)


def _inside(spec_path: str) -> int:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    resolv = Path(spec_path).with_name("resolv.conf")
    resolv.write_text("nameserver 127.0.0.1\noptions attempts:1 timeout:1\n")
    subprocess.run(["mount", "--bind", str(resolv), "/etc/resolv.conf"], check=True)
    names: list[str] = []
    askers: list[str] = []
    ready = threading.Event()
    threading.Thread(target=_serve_dns, args=(names, askers, ready), daemon=True).start()
    ready.wait(10)
    ran = []
    for command in spec["commands"]:
        before = len(names)
        done = subprocess.run(
            command, cwd=spec["cwd"], env=spec["env"], capture_output=True, text=True,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        ran.append({"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                    "lookups": names[before:], "askers": askers[before:]})  # fmt: skip
    Path(spec["out"]).write_text(json.dumps({"ran": ran, "lookups": list(names)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(_inside(sys.argv[1]))
