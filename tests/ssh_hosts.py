"""Two "hosts" on this machine, reached over ssh: an sshd of the test's own listening on
loopback addresses 127.0.0.2 and 127.0.0.3 (any 127.x.y.z reaches this machine, but
horovodrun counts only the addresses of its interfaces, 127.0.0.1 on lo, as local; so it
starts every rank on these two through ssh, as it would on two real nodes).

Why a private sshd: the test must not depend on (or change) the machine's own ssh setup. It
runs from a temporary folder with its own host key, one fresh client key as the only
authorized key, no passwords, no PAM, and a client config (that key, no host-key prompts,
batch mode) used through an `ssh` wrapper first on the PATH, where horovodrun looks for
`ssh`. `SshHosts.start()` raises `SshUnavailable` with the reason (for pytest.skip) when this
machine cannot do it; `stop()` ends the sshd it started by pid and removes the folder.
"""
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

HOSTS = ("127.0.0.2", "127.0.0.3")
SSHD = "/usr/sbin/sshd"


class SshUnavailable(Exception):
    """This machine cannot run the test's sshd; the message says why (a skip reason)."""


def _free_port(addresses):
    """A TCP port free on every one of `addresses` right now."""
    for _ in range(50):
        probe = socket.socket()
        probe.bind((addresses[0], 0))
        port = probe.getsockname()[1]
        others = []
        try:
            for address in addresses[1:]:
                sock = socket.socket()
                others.append(sock)
                sock.bind((address, port))
            return port
        except OSError:
            continue
        finally:
            probe.close()
            for sock in others:
                sock.close()
    raise SshUnavailable(f"no TCP port free on {', '.join(addresses)}")


def _install_sshd():
    """apt-get install openssh-server when root with apt-get (as install.sh
    --test-services does); returns the reason when it cannot."""
    if not shutil.which("apt-get"):
        return f"{SSHD} missing and no apt-get: install openssh-server"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    result = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                             "openssh-server"], env=env,
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0 or not os.path.exists(SSHD):
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
        return f"apt-get install openssh-server failed: {tail[0]}"
    return None


class SshHosts:
    """The sshd and the client side (key, config, `ssh` wrapper in `bin`)."""

    def __init__(self, hosts=HOSTS):
        self.hosts = tuple(hosts)
        self.folder = None
        self.process = None
        self.port = None

    def start(self, timeout=30):
        if os.geteuid() != 0:
            raise SshUnavailable("not root: the test's sshd logs in as root on the loopback")
        if not os.path.exists(SSHD):
            reason = _install_sshd()
            if reason:
                raise SshUnavailable(reason)
        for tool in ("ssh", "ssh-keygen"):
            if not shutil.which(tool, path="/usr/bin:/bin"):
                raise SshUnavailable(f"/usr/bin/{tool} missing: install openssh-client")
        try:
            self._write_files()
            os.makedirs("/run/sshd", exist_ok=True)   # sshd's privilege-separation folder
            self.process = subprocess.Popen([SSHD, "-D", "-f", self.conf, "-E", self.log])
            self._wait(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    @property
    def bin(self):
        """Folder with the `ssh` wrapper: put it first on the PATH."""
        return os.path.join(self.folder, "bin")

    def env(self, base=None):
        """`base` (os.environ) with the wrapper first on the PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = self.bin + os.pathsep + env.get("PATH", "")
        return env

    def ssh(self, host, command, timeout=30):
        return subprocess.run([os.path.join(self.bin, "ssh"), "-p", str(self.port), host,
                               command], capture_output=True, text=True, timeout=timeout)

    def _write_files(self):
        self.folder = tempfile.mkdtemp(prefix="ssh-hosts-")
        path = lambda *parts: os.path.join(self.folder, *parts)  # noqa: E731
        os.makedirs(path("bin"))
        self.conf, self.log = path("sshd_config"), path("sshd.log")
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path(key)],
                           check=True, capture_output=True)
        shutil.copy(path("client_key.pub"), path("authorized_keys"))
        self.port = _free_port(self.hosts)
        listen = "".join(f"ListenAddress {host}\n" for host in self.hosts)
        with open(self.conf, "w", encoding="ascii") as conf:
            conf.write(f"Port {self.port}\n{listen}HostKey {path('host_key')}\n"
                       f"PidFile {path('sshd.pid')}\nAuthorizedKeysFile {path('authorized_keys')}\n"
                       "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                       "StrictModes no\nPermitRootLogin prohibit-password\n"
                       "PermitUserEnvironment no\nMaxStartups 64\nMaxSessions 64\n")
        with open(path("ssh_config"), "w", encoding="ascii") as conf:
            conf.write(f"Host *\n  IdentityFile {path('client_key')}\n  IdentitiesOnly yes\n"
                       "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                       "  LogLevel ERROR\n  BatchMode yes\n")
        wrapper = path("bin", "ssh")
        with open(wrapper, "w", encoding="ascii") as script:
            script.write(f"#!/bin/sh\nexec /usr/bin/ssh -F {path('ssh_config')} \"$@\"\n")
        os.chmod(wrapper, 0o755)

    def _wait(self, timeout):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise SshUnavailable(f"sshd exited {self.process.returncode}: {self._tail()}")
            try:
                if all(self.ssh(host, "echo ok", timeout=10).stdout.strip() == "ok"
                       for host in self.hosts):
                    return
            except subprocess.TimeoutExpired as err:
                last = err
            time.sleep(0.3)
        raise SshUnavailable(f"ssh to {', '.join(self.hosts)} port {self.port} failed within "
                             f"{timeout} s ({last or self._tail()})")

    def _tail(self):
        try:
            with open(self.log, errors="replace") as log:
                return " | ".join(log.read().strip().splitlines()[-3:]) or "(empty log)"
        except OSError:
            return "(no sshd log)"


@pytest.fixture(scope="module")
def ssh_hosts():
    """Started `SshHosts` (skips saying why where this machine cannot), stopped after the
    module."""
    hosts = SshHosts()
    try:
        hosts.start()
    except SshUnavailable as err:
        pytest.skip(f"no ssh hosts on the loopback: {err}")
    try:
        yield hosts
    finally:
        hosts.stop()
