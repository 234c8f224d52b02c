"""The GPU run's summary as Markdown (`gpu-summary.md`): the environment, one line per measured figure (the serving
rows with where their time went, the profiles, the trainings, several models in one server), then the verdicts."""

from __future__ import annotations

from bench.gpu.verdicts import verdict_lines


def fmt(value, spec: str = ".1f") -> str:
    return "–" if value is None else format(value, spec)


def serving_lines(label: str, serve: dict) -> list[str]:
    if "error" in serve:
        return [f"| {label}: serving | failed: {serve['error'][-300:]!r} |"]
    lines = [f"| {label}: {note.split(':')[0]} | {note.split(':', 1)[1].strip()} |" for note in serve.get("notes", [])]
    for r in serve["rows"]:
        if r["system"].startswith("limit"):
            lines.append(f"| {label}: {r['system']} | {r['sequences_per_s']:,.0f} seq/s (batch {r['mean_batch']}"
                         f"{', ' + fmt(r.get('batch_ms'), '.2f') + ' ms a batch' if r.get('batch_ms') else ''}) |")
        elif r["system"].startswith("load generator"):
            lines.append(f"| {label}: {r['system']}, {r['concurrency']} clients in {serve['client_processes']} "
                         f"processes | {r['requests_per_s']:,.0f} requests/s |")
        else:
            lines.append(f"| {label}: {r['system']}, {r['concurrency']} clients x {r['inputs_per_request']} | "
                         f"{r['sequences_per_s']:,.1f} seq/s = {fmt(r['vs_limit'], '.2f')}x the limit, p50 "
                         f"{r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, mean batch {fmt(r['mean_batch'])}, "
                         f"padding {fmt(r['padding'], '.1%')}" + (
                             f"; engine.run {fmt(r.get('batch_ms'), '.2f')} ms a batch, busy "
                             f"{fmt(r.get('engine_busy'), '.0%')}, queue wait {fmt(r.get('queue_ms'), '.1f')} ms"
                             f"; graphed {fmt(r.get('graphed'), '.0%')} of batches"
                             + (f", {r['graph_padding']:.1%} rows of padding" if r.get("graph_padding") else "")
                             + host_work(r)
                             if r["system"].startswith("service") else "") + " |")
    return lines


def host_work(row: dict) -> str:
    """A service row's host side. A request's mean time: at the clients (Little's law: clients over requests/s), in
    the server (the front end's view), and of that in the engine's round trip, so that the front ends' and the
    connections' parts show as differences. Then the engine's wait for its interpreter
    (service/engine/interpreter_lag.py: milliseconds say its threads' Python sets the pace, not the device), the
    cores its process kept busy with its busiest threads, and the front ends' cores."""
    if row.get("interpreter_lag_ms") is None and row.get("engine_cores") is None:
        return ""
    clients_ms = 1000 * row["concurrency"] / row["requests_per_s"] if row.get("requests_per_s") else None
    return (f"; a request's mean {fmt(clients_ms)} ms at the clients, {fmt(row.get('server_ms'))} in the server, "
            f"{fmt(row.get('engine_round_trip_ms'))} in the engine's round trip; interpreter lag "
            f"{fmt(row.get('interpreter_lag_ms'), '.2f')} ms, engine process {fmt(row.get('engine_cores'), '.2f')} "
            f"cores ({row.get('engine_threads') or '-'}), front ends {fmt(row.get('front_end_cores'), '.2f')} cores")


def profile_lines(spy: dict | None, kernels: dict | None) -> list[str]:
    """The profiles' lines; a step left out by --steps (None) has none."""
    lines = []
    if spy is not None and "error" in spy:
        lines.append(f"| py-spy | failed: {spy['error'][-300:]!r} |")
    elif spy is not None:
        lines += [f"| py-spy, {spy['samples']} samples, most on top of the stack | " + "; ".join(
            f"{f['share']:.0%} {f['function']}" for f in spy["self"][:8]) + " |"]
        if "threads" in spy:
            lines += [f"| py-spy: busy cores, {spy['busy_cores']} in all (pid, thread: cores, top function) | " +
                      "; ".join(f"{t['thread']}: {t['busy_cores']:.2f} {t['top'][0][:40]}" for t in spy["threads"][:8])
                      + " |"]
    if kernels is not None and "error" in kernels:
        lines.append(f"| profiler | failed: {kernels['error'][-300:]!r} |")
    elif kernels is not None:
        lines += [f"| top kernels, one batch of {kernels['batch']} ({kernels['real_tokens']} tokens, "
                  f"{kernels['dtype']}, "
                  f"varlen attention {kernels['varlen_attention']}) | " + "; ".join(
                      f"{k['share']:.0%} {k['name'][:60]}" for k in kernels["top"][:6]) + " |"]
    return lines


def training_profile_lines(profile: dict | None) -> list[str]:
    if profile is None:
        return []
    if "error" in profile:
        return [f"| training profile | failed: {profile['error'][-300:]!r} |"]
    kinds = "; ".join(f"{kind} {ms:.1f}" for kind, ms in profile["device_ms_by_kind"].items())
    return [f"| training profile (batch {profile['batch']} x {profile['seq_len']}) | {profile['wall_ms_per_step']:.1f} "
            f"ms a step ({profile['tokens_per_s']:,.0f} tokens/s, {profile['model_tflops']:.1f} TFLOP/s); host: batch "
            f"{profile['host_batch_ms']:.1f} ms, dispatch {profile['host_dispatch_ms']:.1f} ms; device busy "
            f"{profile['device_ms_per_step']:.1f} ms ({profile['device_busy_share']:.0%}), "
            f"{profile['kernels_per_step']:.0f} kernels: {kinds} |",
            "| training profile: top kernels (ms a step) | " + "; ".join(
                f"{k['ms_per_step']:.2f} {k['name'][:50]}" for k in profile["top_kernels"][:8]) + " |"]


def training_line(run: dict) -> str:
    flags = " ".join(run["flags"][:3] + [flag for flag in run["flags"][3:] if flag == "--no-cuda-graphs"])
    graphs = "" if "cuda_graph_skips" not in run else \
        "; CUDA graphs replayed" if not run["cuda_graph_skips"] else f"; {run['cuda_graph_skips']} graph(s) not replayed"
    return (f"{run['tokens_per_s']:,.0f} tokens/s, {run['model_tflops']:.2f} TFLOP/s, MFU {run['mfu_vs_measured_peak']:.1%}"
            f" of the measured peak (hidden {run['hidden']}, {run['layers']} layers, batch {run['batch']}, {flags}){graphs}")


def markdown(summary: dict) -> str:
    env, tests = summary["environment"], summary.get("gpu_tests")
    lines = [f"# GPU path check ({'dry run on CPU' if summary['dry_run'] else env.get('gpu', env['device'])})", "",
             f"`{summary['command']}`, {summary['date']}, {summary['seconds']:.0f} s in all.", "",
             *(["**Cut short**: only the steps under 'seconds per step' ended.", ""] if summary.get("incomplete")
               else []),
             "| what | value |", "| --- | --- |"]
    lines += [f"| {key} | {value} |" for key, value in env.items()]
    if tests:
        lines += [f"| GPU-marked tests | {tests['passed']} passed, {tests['failures'] + tests['errors']} failed, "
                  f"{tests['skipped']} skipped ({tests['seconds']} s) |"]
    for label, key in (("bundled model", "serving"), ("BERT-base shape", "serving_base")):
        lines += serving_lines(label, summary[key]) if key in summary else []
    lines += profile_lines(summary.get("py_spy"), summary.get("kernels"))
    if "matmul_peak_tflops" in summary:
        lines.append(f"| measured matmul peak | {summary['matmul_peak_tflops']:.1f} TFLOP/s |")
    for name, run in {**summary.get("training", {}), **summary.get("training_no_graphs", {})}.items():
        lines.append(f"| training ({name}) | " + (f"failed: {run['error'][-300:]!r}" if "error" in run else
                                                  training_line(run)) + " |")
    lines += training_profile_lines(summary.get("training_profile"))
    several = summary.get("several_models")
    if several:
        lines += [f"| several models in one server | {several['error'][-300:]!r} |"] if "error" in several else \
            [f"| several models in one server | {line} |" for line in several["verdicts"]]
    recipe = summary.get("training", {}).get("train-default", {})
    if "recipe_hours_here" in recipe:
        lines.append(f"| `make train-default` here | {recipe['recipe_hours_here']:.2f} h: the bundled model's "
                     f"{recipe['recipe_tokens']:,} training tokens at {recipe['tokens_per_s']:,.0f} tokens/s |")
    lines.append("| seconds per step | " + ", ".join(f"{k} {v}" for k, v in summary["step_seconds"].items()) + " |")
    if summary.get("skipped"):
        lines.append("| left out, to end within the budget | " + ", ".join(
            f"{name} (`--steps {name}`)" for name in summary["skipped"]) + " |")
    if "verdicts" in summary:
        lines += verdict_lines(summary["verdicts"])
        if summary["dry_run"]:
            lines.append("(A dry run on the CPU: the verdicts are shown, not enforced.)")
    return "\n".join(lines) + "\n"
