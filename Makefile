# veil: `make demo` and `make test` set themselves up on a fresh machine (a .venv beside this file).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.veil-installed
# The CPU build of torch that lies on this kind of machine; elsewhere pip resolves torch from pyproject.
TORCH_CPU ?= torch==2.13.0

.PHONY: install demo test test-fast bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_CPU)" || echo "note: $(TORCH_CPU) not available here; pip will pick torch from pyproject.toml"
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/veil demo

# Test files are spread over TEST_WORKERS processes (pytest-xdist, whole files per worker); TEST_WORKERS=0 runs serially.
# A worker that dies (OOM-killed, a native abort) fails the run at once, naming its test: a replaced worker left
# xdist waiting forever at 99 %, and CI stopped at its time limit without a name.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q --timeout=900 -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=0

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" --timeout=600

BENCHMARKS := uldnet_digits uldnet_depth export_minilm serve_http serve_ray he_digits he_cnn he_deep he_layouts adapters_serving adapters_mtlora adapters_e2lora adapters_loramixer optim_lora optim_lm optim_grpo compress_svd compress_heapr compress_safety codec_rd priorguide_gl forecast_linear recommend_pave cluster_oracle games_rm gpu_kernels

bench: $(STAMP)
	for b in $(BENCHMARKS); do $(PY) benchmarks/$$b.py || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf runs benchmarks/out .pytest_cache .ruff_cache
