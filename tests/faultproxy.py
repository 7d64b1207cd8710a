"""A fault-injecting HTTP proxy in front of the S3 server: an asyncio TCP proxy on 127.0.0.1.

Each connection carries one request (the proxy asks the server to close after it), so every request
is seen and can be given a fault by the first matching ``Rule``: a ``503 SlowDown`` instead of an
answer, or a TCP reset (RST) after ``after`` bytes of the request body (``PUT``) or of the response
(``GET``) went through.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Literal

SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                 b"<Message>Please reduce your request rate.</Message></Error>")
SLOWDOWN = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(SLOWDOWN_BODY), SLOWDOWN_BODY))


@dataclass
class Rule:
    """Give ``times`` requests whose method is ``method`` and whose target contains ``match`` a fault."""

    method: str
    fault: Literal["reset", "503"]
    times: int
    match: str = ""
    after: int = 0
    hits: int = 0


class FaultProxy:
    """Forwards 127.0.0.1:``port`` to the S3 server at 127.0.0.1:``upstream``, injecting ``rules``."""

    def __init__(self, upstream: int, rules: list[Rule]) -> None:
        self.upstream = upstream
        self.rules = rules
        self.requests = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fault-proxy")
        self._server: asyncio.Server | None = None
        self.port = 0

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        """Stop listening and end every connection still open."""
        assert self._server is not None
        self._server.close()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def _take(self, method: str, target: str) -> Rule | None:
        with self._lock:
            self.requests += 1
            for rule in self.rules:
                if rule.method == method and rule.match in target and rule.hits < rule.times:
                    rule.hits += 1
                    return rule
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target = lines[0].split(" ")[:2]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        rule = self._take(method, target)
        if rule is not None and rule.fault == "503":
            if headers.get("expect", "").lower() != "100-continue":
                await reader.readexactly(int(headers.get("content-length", "0")))
            writer.write(SLOWDOWN)
            await writer.drain()
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        kept = [line for line in lines[1:] if line and not line.lower().startswith("connection:")]
        up_writer.write("\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1"))
        reset_after = rule.after if rule is not None else None
        upload = method == "PUT"
        await asyncio.gather(
            self._pipe(reader, up_writer, reset_after if upload else None, writer),
            self._pipe(up_reader, writer, None if upload else reset_after, writer),
        )

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, reset_after: int | None,
                    client: asyncio.StreamWriter) -> None:
        carried = 0
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
                carried += len(data)
                if reset_after is not None and carried > reset_after:
                    sock = client.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.transport.abort()  # RST to the client, not FIN
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()
            client.close()
