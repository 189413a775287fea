"""Inside a sandbox, one run of a program by the warm server there, as if run directly (same stdout, stderr and exit);
standard library only.  Usage: `python3 -I -S -c <this file> SOCKET < REQUEST`"""

import json
import os
import socket
import sys
import time

CONNECT_WAIT_S = 120.0
"""How long the warm server may still be importing its program."""


def main():
    address = sys.argv[1]
    request = json.load(sys.stdin)
    request["env"] = {**os.environ, **request.get("env", {})}
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(address)
            break
        except OSError:
            conn.close()
            if time.monotonic() > deadline:
                sys.exit(f"envrl warm client: no warm server listens on {address}")
            time.sleep(0.01)
    lines = conn.makefile("rwb")
    lines.write(json.dumps(request).encode() + b"\n")
    lines.flush()
    lines.readline()  # the run's pid
    exited = lines.readline().strip()
    for path, stream in ((request["stdout"], sys.stdout.buffer), (request["stderr"], sys.stderr.buffer)):
        try:
            with open(path, "rb") as f:
                stream.write(f.read())
            os.unlink(path)
        except OSError:
            pass
        stream.flush()
    if not exited.lstrip(b"-").isdigit():
        sys.exit("envrl warm client: the warm server ended the run without an exit code")
    code = int(exited)
    if code < 0:
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
