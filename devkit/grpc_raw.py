"""A gRPC call written frame by frame over a plain socket (HTTP/2 by hand), for the hostile-client drills: it can
send what no gRPC library sends, such as a message that stops half-way (its length says more than follows) and then
nothing, the gRPC form of a stalled HTTP body.

    call = RawCall("127.0.0.1", 50051, "/tei.v1.Embed/EmbedStream")
    call.send_partial_message(declared=200, sent=10)   # headers, then 10 bytes of a 200-byte message
    call.wait_for_end(timeout_s=10)                    # seconds until the server ended the stream (or None)

Only what the drills need: one stream a connection, literal (never Huffman-coded) HPACK headers out, the server's
frames read to acknowledge its settings, answer its pings and notice the stream's end (trailers or RST_STREAM). Keep
reading while the call stalls (`wait_for_end` in a thread of its own), as a client's HTTP/2 layer would.
"""

from __future__ import annotations

import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
STREAM = 1


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """HPACK "literal header field without indexing, new name" (RFC 7541 6.2.2), lengths under 127."""
    name_bytes, value_bytes = name.encode(), value.encode()
    return b"\x00" + bytes((len(name_bytes),)) + name_bytes + bytes((len(value_bytes),)) + value_bytes


class RawCall:
    def __init__(self, host: str, port: int, path: str, metadata: dict[str, str] | None = None,
                 timeout_s: float = 10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self._buffer = b""
        self._read_until(lambda kind, flags, stream: kind == SETTINGS and not flags & ACK)  # acknowledged there
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", f"{host}:{port}"),
                   ("content-type", "application/grpc"), ("te", "trailers"), *(metadata or {}).items()]
        self.sock.sendall(frame(HEADERS, END_HEADERS, STREAM, b"".join(_literal(k, v) for k, v in headers)))

    def send_partial_message(self, declared: int, sent: int) -> None:
        """A gRPC message whose length prefix says `declared` bytes, of which `sent` follow."""
        self.sock.sendall(frame(DATA, 0, STREAM, b"\x00" + struct.pack(">I", declared) + b"\x00" * sent))

    def wait_for_end(self, timeout_s: float) -> float | None:
        """Seconds until the server ended the stream (trailers with END_STREAM, or RST_STREAM, or GOAWAY, or the
        connection closed), or None if it did not within `timeout_s`."""
        started = time.monotonic()
        self.sock.settimeout(timeout_s)
        try:
            self._read_until(lambda kind, flags, stream: (kind == HEADERS and flags & END_STREAM and stream == STREAM)
                             or (kind == RST_STREAM and stream == STREAM) or kind == GOAWAY)
        except (TimeoutError, socket.timeout):
            return None
        except ConnectionError:
            pass
        return time.monotonic() - started

    def _read_until(self, wanted) -> None:
        while True:
            while len(self._buffer) < 9:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the server closed the connection")
                self._buffer += chunk
            length = int.from_bytes(self._buffer[:3], "big")
            while len(self._buffer) < 9 + length:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the server closed the connection")
                self._buffer += chunk
            kind, flags = self._buffer[3], self._buffer[4]
            stream = int.from_bytes(self._buffer[5:9], "big") & 0x7FFFFFFF
            payload, self._buffer = self._buffer[9:9 + length], self._buffer[9 + length:]
            # What any HTTP/2 client does below its application, stalled or not: acknowledge the server's settings and
            # answer its pings (gRPC's bandwidth probes; unanswered, the server drops the connection as dead).
            if kind == SETTINGS and not flags & ACK:
                self.sock.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self.sock.sendall(frame(PING, ACK, 0, payload))
            if wanted(kind, flags, stream):
                return

    def close(self) -> None:
        self.sock.close()
