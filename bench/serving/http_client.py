"""A lean HTTP/1.1 client for the load generator: one keep-alive connection, request bytes written by hand,
the answer's status and body read back whole.

Why not httpx: on the GPU host (16 cores, an H100) the load generator's own ceiling with httpx, 64 clients in
8 processes against GET /live, was 1,327 requests/s, and the service rows sat just under it (807 to 1,000
requests/s): the benchmark measured its clients, not the server (BENCHMARKS.md, GPU section). A closed-loop
client needs nothing httpx adds per request (URL and header models, the connection pool's bookkeeping,
timeouts per phase, event hooks), so this one writes the request line and headers as bytes and parses only the
status line, Content-Length or chunked framing and `Connection: close`. Every answer is read to its end, so a
server that sends half a body still fails the run.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class HTTPError(RuntimeError):
    """The server broke HTTP/1.1 framing or closed the connection mid-answer."""


class Connection:
    """One keep-alive connection to `url`'s host; reconnects when the server closes it between requests."""

    def __init__(self, url: str, timeout: float = 120.0):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url}: the load generator speaks plain http://host:port only")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout = timeout
        self._host_header = f"Host: {parts.netloc}\r\n".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._reader = self._writer = None

    async def request(self, method: str, path: str, body: bytes | None = None,
                      content_type: str = "application/json") -> tuple[int, bytes]:
        """Send one request and return (status, body) once the whole answer has arrived."""
        return await asyncio.wait_for(self._exchange(method, path, body, content_type), self.timeout)

    async def _exchange(self, method: str, path: str, body: bytes | None, content_type: str) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        head = f"{method} {path} HTTP/1.1\r\n".encode() + self._host_header
        if body is not None:
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n".encode()
        self._writer.write(head + b"\r\n" + (body or b""))
        try:
            status, keep_alive, answer = await self._read_answer(self._reader)
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            await self.close()
            raise HTTPError(f"{method} {path}: the connection closed before the answer was whole ({error})") from None
        if not keep_alive:
            await self.close()
        return status, answer

    @staticmethod
    async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
            raise HTTPError(f"not an HTTP/1.x status line: {status_line!r}")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        keep_alive = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return int(rest[:3]), keep_alive, await _read_chunked(reader)
        if "content-length" not in headers:  # the body runs to the connection's end
            return int(rest[:3]), False, await reader.read()
        return int(rest[:3]), keep_alive, await reader.readexactly(int(headers["content-length"]))


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";")[0].strip(), 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, up to the empty line
                pass
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise HTTPError("a chunk did not end with CRLF")
