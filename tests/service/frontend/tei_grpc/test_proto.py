"""The served tei.v1 is text-embeddings-inference's: its descriptor, field by field, against the facts of TEI's
published proto/tei.proto (data/tei_proto_facts.json, made by `python -m devkit.proto_facts` from that file; its
`source` says which commit); and tei_pb2.py is what tei.proto generates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

from devkit.proto_facts import facts
from service.frontend.tei_grpc import tei_pb2
from tests.service.frontend.tei_grpc.conftest import PROTO

TEI_FACTS = Path(__file__).parent / "data" / "tei_proto_facts.json"


def served_facts() -> dict:
    file = descriptor_pb2.FileDescriptorProto()
    tei_pb2.DESCRIPTOR.CopyToProto(file)
    return facts(file)


def differences(want, got, where: str = "tei.v1") -> list[str]:
    """Every place where `got` differs from `want`, by path (so that a failure names the field)."""
    if isinstance(want, dict) and isinstance(got, dict):
        found = [f"{where}.{key}: missing" for key in want.keys() - got.keys()]
        found += [f"{where}.{key}: not in TEI's" for key in got.keys() - want.keys()]
        for key in want.keys() & got.keys():
            found += differences(want[key], got[key], f"{where}.{key}")
        return found
    return [] if want == got else [f"{where}: TEI has {want!r}, we have {got!r}"]


def test_every_service_method_message_field_and_enum_is_teis():
    want = json.loads(TEI_FACTS.read_text())
    assert "text-embeddings-inference" in want.pop("source")
    got = served_facts()
    assert differences(want, got) == []
    # The comparison can fail: a renumbered field, a changed type or a missing method is named.
    got["messages"]["EmbedRequest"]["dimensions"]["number"] = 7
    got["messages"]["EmbedResponse"]["embeddings"]["type"] = "TYPE_DOUBLE"
    del got["services"]["Embed"]["EmbedStream"]
    assert sorted(differences(want, got)) == [
        "tei.v1.messages.EmbedRequest.dimensions.number: TEI has 6, we have 7",
        "tei.v1.messages.EmbedResponse.embeddings.type: TEI has 'TYPE_FLOAT', we have 'TYPE_DOUBLE'",
        "tei.v1.services.Embed.EmbedStream: missing"]


def test_the_checked_in_module_is_what_the_proto_generates(tmp_path):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO.parent}", f"--python_out={tmp_path}",
                    PROTO.name], check=True)
    generated = (tmp_path / "tei_pb2.py").read_text()
    assert generated == (PROTO.parent / "tei_pb2.py").read_text(), "tei.proto changed: run `make proto`"
