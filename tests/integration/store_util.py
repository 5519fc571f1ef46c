"""Shared helpers for the tests of the TCP store's defences (docs/security.md): a stranger on the
network that knocks on a store's port with proofs of random bytes, a process's store secret read
from its environment, and a search of a folder's files for it."""
import os
import re
import socket
import threading
import time

from cli_util import check

GREETING = 4 + 32  # "TCS2" and the server's nonce


def recv_exact(sock, size):
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


class Stranger:
    """Knocks on the store's port until stopped; counts what it was answered."""

    def __init__(self, port):
        self.port, self.stop = port, threading.Event()
        self.refused, self.odd, self.silent = 0, [], None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            except OSError:
                time.sleep(0.02)  # the server is not up (yet, or any more)
                continue
            with sock:
                try:
                    greeting = recv_exact(sock, GREETING)
                    if len(greeting) < GREETING:
                        continue  # the job ended while we knocked
                    if greeting[:4] != b"TCS2":
                        self.odd.append(f"greeting {greeting!r}")
                        continue
                    if self.silent is None:  # half a handshake, then nothing, for the whole job
                        self.silent = socket.create_connection(("127.0.0.1", self.port), 2)
                        self.silent.sendall(b"half")
                    sock.sendall(os.urandom(64))
                    answer, rest = recv_exact(sock, 1), recv_exact(sock, 1)
                    if answer == b"\0" and rest == b"":
                        self.refused += 1
                    else:
                        self.odd.append(f"answered {answer!r} then {rest!r}")
                except OSError as error:
                    if not self.store_gone():
                        self.odd.append(f"{type(error).__name__}: {error}")
            time.sleep(0.05)

    def store_gone(self):
        """After a connection lost mid-handshake: whether the store has since shut down (the job
        ended and closed every connection, ours with our bytes unread: a reset), rather than a
        live store answering a stranger otherwise. A live store greets a new connection; one
        shutting down refuses it or closes it before the greeting."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as probe:
                    if len(recv_exact(probe, GREETING)) == GREETING:
                        return False
            except ConnectionRefusedError:
                return True
            except OSError:
                pass  # closed before its greeting: going down
            time.sleep(0.05)
        return False

    def finish(self):
        self.stop.set()
        self.thread.join(10)
        if self.silent is not None:
            self.silent.close()


def check_refusals(stranger, log, shown, who):
    """The stranger was refused at least once and never answered otherwise, and `log` (the text of
    `who`'s output) names the first refusal and counts them all."""
    check(not stranger.odd, f"the stranger was answered otherwise: {stranger.odd[:5]}")
    check(stranger.refused >= 1, f"the stranger never reached the store\n{shown}")
    check(re.search(r"^tcp store: closed the connection from 127\.0\.0\.1:\d+ \(wrong secret\); "
                    r"1 refused so far; the job goes on$", log, re.M),
          f"{who} does not log the first refused stranger\n{shown}")
    total = re.search(r"^tcp store: refused (\d+) connection\(s\) in all", log, re.M)
    check(total and int(total.group(1)) >= stranger.refused,
          f"{who} does not count the {stranger.refused} refusals\n{shown}")


def secret_of(pid):
    """TRAINCTL_STORE_SECRET from the environment of process `pid` (as its user or root may), or
    None."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"TRAINCTL_STORE_SECRET="):
            return item.split(b"=", 1)[1].decode()
    return None


def command_lines():
    """Every process's command line, as `ps` shows them to any user."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return "\n".join(found)


def files_holding(folder, needle):
    found = []
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            try:
                with open(path, "rb") as f:
                    if needle in f.read():
                        found.append(path)
            except OSError:
                pass
    return found
