"""The first process inside an attempt's namespaces (user, mount, network, pid): it hides what the
attempt must not see, opens the one road out (to the gateway), applies the limits, then runs the
harness and reaps everything it leaves behind.

Standard library only, run as a script (`python sandbox_init.py CONFIG.json`): importing reinforge
inside every sandbox would cost a second per attempt for nothing.

Why each step:
- mounts: a tmpfs over every hidden path (the run folder with the store token, the other attempts,
  /tmp, $HOME), then the attempt's own directory bound back at its own path, so paths in the task
  still mean what they say. Directory fds opened before the tmpfs keep the hidden originals reachable
  for exactly these binds.
- network: the namespace has only a loopback device; a relay on 127.0.0.1:<port> forwards each
  connection to a Unix socket the runner serves, which connects to the gateway and nothing else.
  The socket's directory is this process's working directory, so it stays reachable under the tmpfs.
- limits: address space and CPU seconds per process (RLIMIT_AS, RLIMIT_CPU), set on the harness.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading

MS_BIND = 4096
MS_REC = 16384
MS_REMOUNT = 32
MS_RDONLY = 1


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _pipe(a: socket.socket, b: socket.socket, done: threading.Barrier) -> None:
    """Copy a to b; at a's end, half-close b (the other way may still be answering), and the last
    of the pair's two threads closes both sockets."""
    try:
        while chunk := a.recv(65536):
            b.sendall(chunk)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        b.shutdown(socket.SHUT_WR)
    if done.wait() == 0:
        a.close()
        b.close()


def _relay(listener: socket.socket, socket_name: str) -> None:
    """Accept on loopback; connect each client to the runner's Unix socket (relative: cwd)."""
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(socket_name)
        except OSError:
            client.close()
            upstream.close()
            continue
        done = threading.Barrier(2)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b, done), daemon=True).start()


def _loopback_up() -> None:
    # SIOCGIFFLAGS / SIOCSIFFLAGS on "lo": no `ip` binary needed.
    import fcntl
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, siocgifflags, req))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def _hide_and_bind(hide: list[str], binds: list[str], read_only: list[str]) -> None:
    fds = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in [*read_only, *binds]}
    for path in hide:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", 0, "mode=0755,size=64m")
    for path, fd in fds.items():
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
        if path in read_only:
            # What the attempt needs from under a hidden path (the Python installation): seen, not changed.
            statfs = os.statvfs(path)
            kept = statfs.f_flag & (os.ST_NOSUID | os.ST_NODEV | os.ST_NOEXEC)
            _mount("none", path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def _limits(memory_mb: int | None, cpu_seconds: int | None) -> None:
    if memory_mb:
        size = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    if cpu_seconds:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))


def main() -> int:
    with open(sys.argv[1]) as f:  # read before the mounts hide it
        config = json.load(f)
    os.chdir(config["socket_dir"])  # before the tmpfs: the relay connects relative to it
    _hide_and_bind(config["hide"], config["binds"], config.get("read_only", []))
    if config.get("port"):
        _loopback_up()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", config["port"]))
        listener.listen(64)
        threading.Thread(target=_relay, args=(listener, config["socket_name"]), daemon=True).start()
    proc = subprocess.Popen(
        config["argv"],
        cwd=config["cwd"],
        env=config["env"],
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: _limits(config.get("memory_mb"), config.get("cpu_seconds")),
    )
    # As pid 1 of the namespace this process reaps every orphan; the harness's status is the result.
    status = 0
    while True:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == proc.pid:
            status = os.waitstatus_to_exitcode(raw)
            # Whatever the harness left running dies with this process (the namespace's init).
            break
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    try:
        sys.exit(main())
    except OSError as e:
        print(f"reinforge sandbox: {e}", file=sys.stderr)
        sys.exit(126 if e.errno != errno.ENOENT else 127)
