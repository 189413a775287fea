"""The env server's two sockets: the clients' ROUTER and the workers' ipc ROUTER.

Guarantee: the client socket queues at most `client_send_queue` answers per client in ZMQ, and a
full queue raises zmq.Again instead of dropping an answer (ROUTER_MANDATORY; the server's
`ClientSender` decides what then); it drops any connection that sends a frame over twice
`max_frame_bytes` before buffering it (smaller oversized frames are read and answered `too_large`);
with `curve` it admits only clients whose public keys are in `curve.client_keys_dir`.
"""

from __future__ import annotations

from typing import Any

import zmq
import zmq.auth

from envrl.serve.config import CurveServerConfig, EnvServerConfig


def bind_clients(
    context: zmq.Context[zmq.Socket[bytes]], config: EnvServerConfig
) -> tuple[zmq.Socket[bytes], str, Any]:
    """(socket, bound address, CURVE authenticator thread or None); raises zmq.ZMQError or ValueError."""
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.SNDHWM, config.client_send_queue)
    sock.setsockopt(zmq.MAXMSGSIZE, 2 * config.max_frame_bytes)
    sock.setsockopt(zmq.LINGER, 1000)
    authenticator = None
    try:
        if config.curve is not None:
            authenticator = _enable_curve(context, sock, config.curve)
        address = config.address
        if address.startswith("tcp://") and address.endswith(":0"):
            address = address[:-2] + ":*"
        sock.bind(address)
    except BaseException:
        sock.close()
        if authenticator is not None:
            authenticator.stop()
        raise
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT), authenticator


def bind_workers(context: zmq.Context[zmq.Socket[bytes]], directory: str) -> tuple[zmq.Socket[bytes], str]:
    """The socket workers connect to (ipc in `directory`), unbounded both ways: the server bounds the load."""
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    address = f"ipc://{directory}/workers"
    sock.bind(address)
    return sock, address


def _enable_curve(context: zmq.Context[zmq.Socket[bytes]], sock: zmq.Socket[bytes], curve: CurveServerConfig) -> Any:
    if not curve.client_keys_dir.is_dir():
        raise ValueError(f"curve.client_keys_dir {curve.client_keys_dir} is not a directory of client public keys")
    public, secret = zmq.auth.load_certificate(curve.secret_key_file)
    if secret is None:
        raise ValueError(
            f"curve.secret_key_file {curve.secret_key_file} holds no secret key (use the .key_secret file)"
        )
    from zmq.auth.thread import ThreadAuthenticator

    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve(domain="*", location=str(curve.client_keys_dir))
    sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True
    return authenticator
