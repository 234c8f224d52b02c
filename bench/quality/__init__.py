"""Probes of the model decisions (cloze answers, held-out accuracy through the service, embedding retention,
NSP heads): what BENCHMARKS.md and docs/model-making.md quote about the models, not about serving."""
