"""An HTTP front end (with its gRPC API and traces) loads no torch: it reads the checkpoint's text files (model/checkpoint_files.py) and leaves
the weights to the engine. Up to one front end per core runs beside the engine; torch would cost each of them
~250 MiB and seconds of start (docs/processes.md, `python -m bench.serving.frontend_footprint`)."""

from __future__ import annotations

import json
import subprocess
import sys

from devkit.paths import REPO_ROOT

PROBE = """
import json, sys
import service.frontend.worker  # the front-end process's module (python -m service.frontend.worker)
from service.frontend import runtime
from service.frontend.app import create_http_app
from service.settings import Settings
from service.tracing import setup
# With the gRPC API and traces on: their modules (the gRPC server, the OpenTelemetry SDK and exporter) come in too.
settings = Settings(checkpoint=sys.argv[1], grpc_port=50051, otlp_endpoint="http://127.0.0.1:4317")
state = runtime.Runtime(settings, link=None, tracing=setup(settings, "front-end-0"))
state.default_model.checkpoint = runtime.load_checkpoint_files(sys.argv[1])  # what Runtime.start reads
create_http_app(state)
import service.frontend.tei_grpc.server, opentelemetry.exporter.otlp.proto.grpc.trace_exporter  # noqa: E401
print(json.dumps({"torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
                  "vocab": state.checkpoint.tokenizer.vocab_size, "model": state.checkpoint.model is None}))
"""


def test_a_front_end_reads_its_checkpoint_and_builds_its_app_without_torch(tiny_checkpoint):
    done = subprocess.run([sys.executable, "-c", PROBE, str(tiny_checkpoint)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["torch"] == [], found["torch"][:5]
    assert found["vocab"] > 100 and found["model"] is True  # it did read the tokenizer, and no weights


def test_the_checkpoint_text_reader_imports_no_torch():
    done = subprocess.run([sys.executable, "-c", "import sys, model.checkpoint_files, model; model.CheckpointError; "
                           "print('torch' in sys.modules)"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr
