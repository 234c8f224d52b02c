"""The hostile-client drills of devkit.grpc_drills with small counts and short settings, against a real
`--workers 2` server: stalled calls, oversized messages, a stream of many tiny messages, bad bytes to every method.
RELIABILITY.md has the full-size runs."""

from __future__ import annotations

import asyncio

import grpc
import httpx

from devkit.grpc_drills import embed, front_end_pids, garbage, oversized, server_faults, stalled_calls, tiny_messages
from service.frontend.tei_grpc import tei_pb2 as pb
from tests.service.frontend.tei_grpc.conftest import real_server


def test_hostile_clients_get_their_codes_and_cost_the_others_nothing(tiny_checkpoint):
    server = real_server(tiny_checkpoint, "--workers", "2", "--keep-alive-s", "1.5", "--body-timeout-s", "2",
                         "--max-body-bytes", "65536")
    try:
        with grpc.insecure_channel(server.target) as channel:
            before = channel.unary_unary("/tei.v1.Embed/Embed", response_deserializer=pb.EmbedResponse.FromString)(
                embed("the same"), timeout=30)
        # Stalled mid-message: the complete calls are all answered meanwhile, long before the stalled calls end
        # (streams after keep_alive_s, unary calls after body_timeout_s), and every stalled call is ended.
        stalled = stalled_calls(server.target, stalled=64, calls=64, wait_s=10)
        assert stalled["complete_calls"] == {"OK": 64}
        assert stalled["all_complete_answered_after_s"] < 1.5, stalled
        assert stalled["stalled_never_ended"] == 0
        assert 1.4 <= stalled["stalled_streams_ended_s"][0] and stalled["stalled_streams_ended_s"][1] < 5, stalled
        assert 1.9 <= stalled["stalled_unary_ended_s"][0] and stalled["stalled_unary_ended_s"][1] < 5, stalled

        too_big = oversized(server.target, 65536)
        assert too_big == {"unary": "RESOURCE_EXHAUSTED", "stream": "RESOURCE_EXHAUSTED", "stream_answers_before": 2}

        tiny = asyncio.run(tiny_messages(server.target, 5000, front_end_pids(server.process.pid)))
        assert tiny["answers"] == 5000 and tiny["probe_calls"] >= 1, tiny
        assert tiny["front_end_rss_growth_mib"] < 50, tiny  # the window bounds what a stream holds

        bad = asyncio.run(garbage(server.target, per_method=8))
        assert bad["not_a_client_fault"] == {}, bad
        assert server_faults(server.url) == {}  # what the server itself sent: never INTERNAL or UNKNOWN
        assert bad["codes"].get("INVALID_ARGUMENT", 0) > 50, bad

        with grpc.insecure_channel(server.target) as channel:  # the same answer as before the drills
            call = channel.unary_unary("/tei.v1.Embed/Embed", response_deserializer=pb.EmbedResponse.FromString)
            assert call(embed("the same"), timeout=30).embeddings == before.embeddings
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        server.stop()
