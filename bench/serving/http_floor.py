"""The floor under any Python HTTP server here: uvicorn (uvloop, httptools, as the service runs it) with an
ASGI app that does nothing but parse the JSON body and answer each input with a 32-wide zero vector. Its
CPU per request under `bench.serving.server_cpu`'s load is what the socket, the HTTP parsing and the event
loop cost before any of the service's own work.

    python -m uvicorn bench.serving.http_floor:app --port 8000
"""

from __future__ import annotations

import orjson

ZEROS = [0.0] * 32


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["method"] == "POST":
        answer = orjson.dumps([ZEROS] * len(orjson.loads(body)["inputs"]))
    else:  # /health, polled until the server is up
        answer = b'{"status":"ok"}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})
