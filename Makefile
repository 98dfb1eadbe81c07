# Thin wrappers over the `grader` CLI. `make demo` on a fresh clone sets everything up and grades the
# reference solutions and the starter stubs; `make test` runs the project's own tests.

# The sandboxed worker drops to an unprivileged user, who must be able to run the virtual
# environment's Python: prefer the system Python over one installed under /root.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV   ?= .venv
TORCH  ?= torch
EXTRAS ?= dev
BIN    := $(VENV)/bin
EX     ?=
SUB    ?= solutions

.PHONY: setup demo check hint progress notebook interview interview-check interview-done grade test test-short bench gpu-check validate sync new release image clean

$(BIN)/grader: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)" -e '.[$(EXTRAS)]'
	@touch $@

setup: $(BIN)/grader

demo: setup                       ## grade the reference solutions and the starter stubs
	$(BIN)/grader demo

check: setup                      ## public tests on your exercises/ (EX=<id> for one; V=1: every failure in full; CALL_TIMEOUT=s)
	$(BIN)/grader check $(EX) $(if $(V),--verbose) $(if $(CALL_TIMEOUT),--call-timeout $(CALL_TIMEOUT))

hint: setup                       ## the next hint: make hint EX=online_softmax
	@test -n "$(EX)" || (echo "usage: make hint EX=<exercise id>" && exit 2)
	$(BIN)/grader hint $(EX)

progress: setup                   ## attempts, first passes and hints (.progress.json); EX=<id>: every check
	$(BIN)/grader progress $(EX)

notebook: setup                   ## a starter notebook to hand in: make notebook EX=online_softmax [FORCE=1]
	@test -n "$(EX)" || (echo "usage: make notebook EX=<exercise id> [FORCE=1]" && exit 2)
	@$(BIN)/python -c "import nbformat" 2>/dev/null || $(BIN)/python -m pip install --quiet "nbformat>=5.7"
	$(BIN)/grader notebook $(EX) $(if $(FORCE),--force)

interview: setup                  ## timed practice: make interview LEVEL=medium MINUTES=45 [EX=gptq/quantizer]
	$(BIN)/grader interview start $(if $(LEVEL),--level $(LEVEL)) $(if $(MINUTES),--minutes $(MINUTES)) $(if $(EX),--exercise $(EX))

interview-check: setup
	$(BIN)/grader interview check

interview-done: setup
	$(BIN)/grader interview done

release: setup                    ## the student repository: make release OUT=../lab-student
	$(BIN)/grader release $(or $(OUT),release)

grade: setup                      ## grade a submission: make grade SUB=path/to/submission
	$(BIN)/grader grade $(SUB) $(if $(EX),--exercise $(EX))

IMAGE      ?= llm-efficiency-lab-grader:latest
BASE_IMAGE ?= python:3.11-slim-bookworm
image:                            ## the grading image: make image [IMAGE=name:tag] [BASE_IMAGE=...]
	docker build -f docker/Dockerfile --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(IMAGE) .

# The project's tests also need the optional extras they test (nbgrader): installed once, on first use.
$(VENV)/.test-deps: $(BIN)/grader pyproject.toml
	$(BIN)/python -m pip install --quiet "$(TORCH)" -e '.[dev,nbgrader]'
	@touch $@

JOBS   ?= 2
test: $(VENV)/.test-deps          ## the project's own tests (JOBS=n parallel processes)
	@$(BIN)/python -c "import sys, torch, triton; print(f'tests on Python {sys.version.split()[0]}, torch {torch.__version__} ({\"CUDA \" + torch.version.cuda if torch.version.cuda else \"CPU\"} build), triton {triton.__version__}')"
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(JOBS) --dist loadgroup --durations=25 tests

# The short suite CI runs on every other tested torch (grader/torchbuild.py TESTED): the guards and probes,
# the hostile files, the tamper scan, the torch check, every reference and stub, and the known-wrongs whose loss
# depends on torch itself (online_softmax's library softmax under other names, and its host-side Triton
# shortcuts: operator families and dispatch differ between releases; a wrong number is wrong on any torch).
SHORT_TESTS ?= tests/test_probes.py tests/test_hostile.py tests/test_error_is_no_answer.py tests/test_tamper.py \
               tests/test_memory_limit.py tests/test_torchbuild.py tests/test_scoring.py
test-short: $(VENV)/.test-deps    ## the short suite, e.g. on another torch: make test-short VENV=.venv-2.14 TORCH=torch==2.14.1
	@$(BIN)/python -c "import sys, torch, triton; print(f'short suite on Python {sys.version.split()[0]}, torch {torch.__version__} ({\"CUDA \" + torch.version.cuda if torch.version.cuda else \"CPU\"} build), triton {triton.__version__}')"
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(JOBS) --dist loadgroup --durations=10 $(SHORT_TESTS) \
		-k "not test_known_wrong_submission_loses_its_checks or (online_softmax and (softmax_ or log_softmax or by_log or triton_in_ or noop_launch))"

gpu-check: setup                  ## every CUDA check proved and calibrated on this GPU; DRY=1: the CPU rehearsal
	$(BIN)/grader gpu-check $(if $(DRY),--dry-run)

bench: setup                      ## CPU/GPU benchmark of one exercise: make bench EX=<id>
	@test -n "$(EX)" || (echo "usage: make bench EX=<exercise id>" && exit 2)
	@test -f grader/bench/$(EX).py || (echo "no benchmark for '$(EX)': expected grader/bench/$(EX).py; the exercises with one: $$(cd grader/bench && ls | sed -n 's/\.py$$//p' | grep -vxE '__init__|batch|harness|kernel_resources|memory|seeds' | tr '\n' ' ')" && exit 2)
	$(BIN)/python -m grader.bench.$(EX)

validate: setup
	$(BIN)/grader validate

new: setup                        ## scaffold a new exercise: make new EX=<id> [TITLE="..."] [FILE=name.py]
	@test -n "$(EX)" || (echo "usage: make new EX=<exercise id> [TITLE=\"...\"] [FILE=name.py]" && exit 2)
	$(BIN)/grader new $(EX) $(if $(TITLE),--title "$(TITLE)") $(if $(FILE),--file $(FILE))

sync: setup                       ## after editing course.yaml: rewrite every block derived from it (CHECK=1: only list stale ones)
	$(BIN)/grader sync $(if $(CHECK),--check)

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info
