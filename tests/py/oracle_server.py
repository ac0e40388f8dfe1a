"""A fork server for the Python oracles: tests/run starts one per test run, and tests/py/run
hands it each oracle script to run instead of starting Python and importing PyTorch again
(about 2.5 s a call, and a test run makes about a hundred calls).

    /usr/bin/python3 tests/py/oracle_server.py SOCKET

Listens on the Unix socket SOCKET. A client sends one JSON request, {"argv": [SCRIPT, ARG,
...], "cwd": DIR, "env": {...}}, with its standard input, output and error as passed file
descriptors; the server forks, and the child, in the client's directory and environment,
with the client's descriptors as its own, runs SCRIPT as __main__ (as `python3 SCRIPT
ARG...` would, SCRIPT's directory first on sys.path) and sends back its exit status as one
line. The parent only accepts and forks, so nothing a script does outlives it. Exits when
its parent (tests/run) is gone.
"""
import json
import os
import runpy
import signal
import socket
import sys
import traceback

import numpy  # noqa: F401  (imported once here, inherited by every child)
import torch  # noqa: F401


def serve_one(conn):
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not msg.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            break
        msg += more
    req = json.loads(msg)
    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    script = req["argv"][0]
    sys.argv = list(req["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        code = code or 1
    conn.sendall(b"%d\n" % code)


def main():
    path = sys.argv[1]
    parent = os.getppid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # children reaped by the kernel
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".tmp")
    os.rename(path + ".tmp", path)   # the socket appears ready to accept
    srv.listen(16)
    srv.settimeout(5.0)
    while True:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            if os.getppid() != parent:
                return
            continue
        if os.fork() == 0:
            srv.close()
            conn.settimeout(None)
            try:
                serve_one(conn)
            finally:
                os._exit(0)
        conn.close()


if __name__ == "__main__":
    main()
