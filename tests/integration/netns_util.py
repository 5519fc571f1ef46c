"""Network namespaces as hosts for the multi-host tests (netns_*.py): each namespace has its own
interface and address, wired to one switch, so ranks started in them reach each other only over
that network, as ranks on separate machines do (the file system stays shared).

    with netns_util.Network(3) as net:           # hosts 10.77.0.1 .. 10.77.0.3
        net.popen(1, [binary, ...], env=...)     # `ip netns exec <host 1> ...`
        net.cut(2)                               # host 2's cable out: its packets are dropped
        net.restore(2)

The switch is a bridge in a namespace of its own, so nothing is added to the machine's own
network. Names carry the test's pid and a random tag, so parallel runs cannot collide; every
namespace is deleted on the way out, also after a failure or an interrupt (SIGTERM from CTest's
timeout is turned into an exception so the cleanup runs). Needs root (CAP_NET_ADMIN and
CAP_SYS_ADMIN for `ip netns`): elsewhere `Network` raises Unavailable, which a test turns into a
skip (exit 77).
"""
import os
import secrets
import signal
import subprocess

SUBNET = "10.77.0"
IFACE = "eth0"  # each host's interface (inside its own namespace, so the name is free)


class Unavailable(Exception):
    """Network namespaces cannot be made here (not root, no `ip`)."""


def _ip(*args, check=True):
    completed = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and completed.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: exit {completed.returncode}: "
                           f"{completed.stderr.strip()}")
    return completed


def _terminate_on_sigterm():
    """CTest ends a test that runs past its timeout with SIGTERM: raise instead of dying, so the
    namespaces are deleted."""
    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, raise_interrupt)


class Network:
    """`count` hosts on one switch: host i is namespace `names[i]` with address `address(i)`."""

    def __init__(self, count):
        self.count = count
        tag = f"{os.getpid()}-{secrets.token_hex(2)}"
        self.switch = f"trainctl-sw-{tag}"
        self.names = [f"trainctl-h{i}-{tag}" for i in range(count)]
        self.processes = []
        self._made = []

    def address(self, host):
        return f"{SUBNET}.{host + 1}"

    def __enter__(self):
        _terminate_on_sigterm()
        try:
            probe = _ip("netns", "add", self.switch, check=False)
        except FileNotFoundError:
            raise Unavailable("no `ip` command (iproute2): scripts/setup installs it")
        if probe.returncode != 0:
            raise Unavailable(f"cannot create a network namespace ({probe.stderr.strip()}); "
                              "the test needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)")
        self._made.append(self.switch)
        try:
            self._wire()
        except BaseException:
            self.close()
            raise
        return self

    def _wire(self):
        _ip("-n", self.switch, "link", "add", "switch", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "switch", "up")
        for host, name in enumerate(self.names):
            _ip("netns", "add", name)
            self._made.append(name)
            port = f"port{host}"
            # The pair is made inside the switch's namespace, one end moved straight into the
            # host's: the machine's own namespace never holds either end.
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", IFACE,
                "netns", name)
            _ip("-n", self.switch, "link", "set", port, "master", "switch")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", name, "addr", "add", f"{self.address(host)}/24", "dev", IFACE)
            _ip("-n", name, "link", "set", IFACE, "up")
            _ip("-n", name, "link", "set", "lo", "up")

    def popen(self, host, argv, **kwargs):
        """Starts argv on `host` (`ip netns exec`), as subprocess.Popen(argv, **kwargs) would."""
        process = subprocess.Popen(["ip", "netns", "exec", self.names[host], *argv], **kwargs)
        self.processes.append(process)
        return process

    def run(self, host, argv):
        return subprocess.run(["ip", "netns", "exec", self.names[host], *argv],
                              capture_output=True, text=True, timeout=30)

    def cut(self, host):
        """Pulls host's cable at the switch: every packet to or from it is dropped from now on,
        and no peer is told (no reset, no FIN), as when a link or a switch port fails."""
        _ip("-n", self.switch, "link", "set", f"port{host}", "down")

    def restore(self, host):
        _ip("-n", self.switch, "link", "set", f"port{host}", "up")

    def close(self):
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for name in reversed(self._made):
            _ip("netns", "delete", name, check=False)  # its interfaces go with it
        self._made = []

    def __exit__(self, *exc):
        self.close()
        return False
