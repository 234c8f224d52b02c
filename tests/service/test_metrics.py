"""`observe_all` counts a list of amounts into a histogram exactly as one `observe` each would: the same buckets (an
amount on a bucket's bound counts in that bucket), the same sum and count, in one process and in the multiprocess
mode the front ends and the engine write through."""

from __future__ import annotations

import os
import subprocess
import sys

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from service.metrics import LATENCY_BUCKETS, observe_all

AMOUNTS = [0.0, 0.0004, 0.001, 0.0010001, 0.003, 0.0025, 0.05, 0.7, 29.0, 30.0, 31.0, 1e6, 0.003, 0.003]


def rendered(observe) -> str:
    registry = CollectorRegistry()
    histogram = Histogram("queue_seconds", "test", ["model"], buckets=LATENCY_BUCKETS, registry=registry)
    observe(histogram.labels(model="m"))
    return "\n".join(line for line in generate_latest(registry).decode().splitlines() if "_created" not in line)


def test_all_at_once_counts_as_one_at_a_time():
    one_by_one = rendered(lambda child: [child.observe(amount) for amount in AMOUNTS])
    at_once = rendered(lambda child: observe_all(child, AMOUNTS))
    assert at_once == one_by_one
    assert 'queue_seconds_count{model="m"} 14.0' in at_once
    assert 'queue_seconds_bucket{le="0.001",model="m"} 3.0' in at_once  # 0.001 itself is in the 0.001 bucket


def test_nothing_to_observe_changes_nothing():
    assert rendered(lambda child: observe_all(child, [])) == rendered(lambda child: None)


def test_an_object_without_prometheus_internals_is_observed_one_by_one():
    seen = []

    class Plain:
        def observe(self, amount):
            seen.append(amount)

    observe_all(Plain(), AMOUNTS)
    assert seen == AMOUNTS


MULTIPROCESS = """
import sys
from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess
from service.metrics import LATENCY_BUCKETS, observe_all
amounts = [float(a) for a in sys.argv[2].split(",")]
histogram = Histogram("queue_seconds", "test", ["model"], buckets=LATENCY_BUCKETS)
if sys.argv[1] == "all":
    observe_all(histogram.labels(model="m"), amounts)
else:
    for amount in amounts:
        histogram.labels(model="m").observe(amount)
summed = CollectorRegistry()
multiprocess.MultiProcessCollector(summed)
print(generate_latest(summed).decode())
"""


def test_the_multiprocess_mode_counts_the_same(tmp_path):
    outputs = {}
    for how in ("all", "one"):
        directory = tmp_path / how
        directory.mkdir()
        result = subprocess.run([sys.executable, "-c", MULTIPROCESS, how, ",".join(map(str, AMOUNTS))],
                                env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)},
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        outputs[how] = result.stdout
    assert outputs["all"] == outputs["one"] and 'queue_seconds_count{model="m"} 14.0' in outputs["all"]
