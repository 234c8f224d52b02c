"""The facts of a .proto file that decide wire compatibility, as JSON: its package, each service's methods
(request and response types, which side streams, options), each message's fields (name, number, type, label,
message or enum type, proto3 `optional`) and each enum's values.

    python -m devkit.proto_facts path/to/tei.proto --source "text-embeddings-inference proto/tei.proto @<commit>"

compiles the file with grpcio-tools and prints its facts. tests/service/frontend/tei_grpc/data/tei_proto_facts.json was
made so from text-embeddings-inference's published file; tests/service/frontend/tei_grpc/test_proto.py compares our
served descriptor (`facts(FileDescriptorProto)`) with it, field by field.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

FieldType = descriptor_pb2.FieldDescriptorProto.Type
FieldLabel = descriptor_pb2.FieldDescriptorProto.Label
Idempotency = descriptor_pb2.MethodOptions.IdempotencyLevel


def facts(file: descriptor_pb2.FileDescriptorProto) -> dict:
    """What a client generated from `file` relies on, keyed by name (order in the file does not matter)."""
    services = {
        service.name: {method.name: {
            "input": method.input_type, "output": method.output_type,
            "client_streaming": method.client_streaming, "server_streaming": method.server_streaming,
            "idempotency_level": Idempotency.Name(method.options.idempotency_level),
        } for method in service.method}
        for service in file.service}
    messages = {
        message.name: {field.name: {
            "number": field.number, "type": FieldType.Name(field.type), "label": FieldLabel.Name(field.label),
            "type_name": field.type_name, "proto3_optional": field.proto3_optional,
        } for field in message.field}
        for message in file.message_type}
    enums = {enum.name: {value.name: value.number for value in enum.value} for enum in file.enum_type}
    return {"package": file.package, "syntax": file.syntax, "services": services, "messages": messages, "enums": enums}


def compile_proto(path: Path) -> descriptor_pb2.FileDescriptorProto:
    """`path` compiled by grpcio-tools' protoc into its FileDescriptorProto."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "set.pb"
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{path.parent}", f"--descriptor_set_out={out}",
                        path.name], check=True)
        descriptors = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (file,) = descriptors.file
    return file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("proto", type=Path)
    parser.add_argument("--source", default="", help="where the file came from, recorded beside its facts")
    args = parser.parse_args(argv)
    print(json.dumps({"source": args.source, **facts(compile_proto(args.proto))}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
