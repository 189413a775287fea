"""Inside a sandbox: once its first process exits 0, every given port listens on the sandbox's loopback, relayed to
the host bridge; stdlib only. Usage: `python3 -I -S -c <this file> SOCKET PORT [PORT ...]`"""

import asyncio
import contextlib
import os
import socket
import sys


async def _pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass


async def _relay(path, port, reader, writer):
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(path)
    except OSError:
        writer.close()
        return
    up_writer.write(f"{port}\n".encode())
    try:
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    finally:
        for w in (writer, up_writer):
            with contextlib.suppress(OSError):
                w.close()


async def _serve(path, listeners):
    for port, sock in listeners:
        await asyncio.start_server(lambda r, w, port=port: _relay(path, port, r, w), sock=sock)
    await asyncio.Event().wait()


def main():
    path, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
    listeners = []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        listeners.append((port, sock))
    ready_r, ready_w = os.pipe()
    if os.fork():  # the first process: exit once the daemon has let go of the caller's pipes
        os.close(ready_w)
        os.read(ready_r, 1)
        os._exit(0)
    os.close(ready_r)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(ready_w)
    asyncio.run(_serve(path, listeners))


if __name__ == "__main__":
    main()
