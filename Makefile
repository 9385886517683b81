# zodbd - build, test and demo.
#
#   make run     build zodbd, make a small demo Data.fs with ZODB/py, inspect it
#   make test    everything CI runs (.ci/run calls exactly this)
#
# Other targets: build, venv, vet, gotest, pytest, datasets, check-hashes,
# bench, gobench, fuzz, clean, distclean.
#
# ../shared (beside the repository) holds the reference test data and tools;
# override with `make SHARED=/path/to/shared ...`.

SHARED   ?= ../shared
GO       ?= go
PYTHON   ?= python3
VENV     ?= .venv
BIN      ?= bin/zodbd

# -race where the toolchain can do it (it needs cgo and a C compiler).
RACE     ?= $(shell [ "$$($(GO) env CGO_ENABLED)" = 1 ] && command -v "$$($(GO) env CC)" >/dev/null 2>&1 && echo -race)
# A package's tests take 30 s at most under -race on 2 cores: a hang fails
# after 5 minutes with every goroutine's stack, not after go test's 10.
GOTESTFLAGS ?= $(RACE) -timeout 5m
PYTESTFLAGS ?=
GOBENCH  ?= .
GOBENCHFLAGS ?= -benchmem
BENCHFLAGS ?=
FUZZTIME ?= 10s

VPY        := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.stamp
DATASETS   := prod1-1024 wczblk1-8
DSDIR      ?= data/datasets
DSREF      := testdata/datasets
DEMO       := data/demo/Data.fs

# the Go tests find the shared data through $ZODBD_SHARED
export ZODBD_SHARED := $(abspath $(SHARED))

.DELETE_ON_ERROR:
.PHONY: all build venv test vet gotest pytest datasets check-hashes run bench gobench fuzz clean distclean

all: build

## build: bin/zodbd (go build is incremental, so this always runs it)
build:
	$(GO) mod download
	$(GO) build -o $(BIN) ./cmd/zodbd

## venv: .venv with requirements.txt; reinstalled only when requirements.txt changes
venv: $(VENV_STAMP)

$(VENV_STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

## test: the whole suite: go vet, go test, pytest, dataset hashes
test: venv build vet gotest pytest check-hashes
	@echo "make test: all passed"

vet:
	$(GO) vet ./...

# The benchmarks against the TCP floor run once, briefly: they fail if
# their servers or clients do (their figures: BENCHMARKS.md).
gotest:
	$(GO) test $(GOTESTFLAGS) ./...
	$(GO) test -run '^$$' -bench 'VsFloor|NEOvsZEO' -benchtime 200x ./zeo/... ./neo/... ./bench/...

# pytest exits 5 when it collects no tests; the suite has tests, so that is
# a failure too, but say so plainly.
pytest: venv build
	ZODBD=$(abspath $(BIN)) $(VPY) -m pytest $(PYTESTFLAGS) tests/; \
	rc=$$?; \
	if [ $$rc = 5 ]; then echo "pytest: no tests collected (exit 5)" >&2; fi; \
	exit $$rc

## datasets: data/datasets/{prod1-1024,wczblk1-8}.fs from $(SHARED)
datasets: $(DATASETS:%=$(DSDIR)/%.fs)

$(DSDIR)/%.fs: $(DSREF)/SHA256SUMS | $(VENV_STAMP)
	@mkdir -p $(DSDIR)
	SHARED=$(SHARED) PYTHON=$(VPY) scripts/dataset.sh $* $@

## check-hashes: zodbd hash --crc32/--sha1 on the datasets == ZODB/py's reference
check-hashes: build datasets
	scripts/check_hashes.sh $(BIN) $(DSREF) $(DSDIR) $(DATASETS)

## run: demo database made by ZODB/py, served by zodbd serve on $(RUNADDR)
RUNADDR ?= 127.0.0.1:8100
run: build $(DEMO)
	$(BIN) info $(DEMO)
	@echo
	@echo "Serving $(DEMO) to ZEO clients on $(RUNADDR) (Ctrl-C stops). Try, in another shell:"
	@echo "  $(VPY) -c \"import ZEO; db = ZEO.DB(('127.0.0.1', $(lastword $(subst :, ,$(RUNADDR))))); print(dict(db.open().root()))\""
	$(BIN) serve -a $(RUNADDR) -f $(DEMO)

$(DEMO): scripts/make_demo.py | $(VENV_STAMP)
	$(VPY) scripts/make_demo.py $@

## bench: the ZEO server benchmark harness, bench/run.py (BENCHMARKS.md,
## "make bench"): zodbd serve vs runzeo vs a TCP ping-pong floor, results
## and plots in data/bench/<timestamp>/. Options: BENCHFLAGS='--quick',
## '--pin', '--tune', '--sched', ... (bench/run.py -h)
BENCH_STAMP := $(VENV)/.bench-stamp

bench: build datasets $(BENCH_STAMP)
	SHARED=$(SHARED) $(VPY) bench/run.py --zodbd $(abspath $(BIN)) $(BENCHFLAGS)

# matplotlib for the plots, kept out of requirements.txt (make test stays lean)
$(BENCH_STAMP): requirements-bench.txt $(VENV_STAMP)
	$(VPY) -m pip install --disable-pip-version-check -q -r requirements-bench.txt
	touch $@

## gobench: Go benchmarks (BENCHMARKS.md); GOBENCH=pattern, GOBENCHFLAGS
gobench:
	$(GO) test -run '^$$' -bench '$(GOBENCH)' $(GOBENCHFLAGS) ./...

## fuzz: every Fuzz target for $(FUZZTIME) each
fuzz:
	@set -e; \
	for pkg in $$($(GO) list ./...); do \
	  list=$$($(GO) test -list '^Fuzz' $$pkg) || { echo "$$list"; exit 1; }; \
	  for f in $$(echo "$$list" | grep '^Fuzz'); do \
	    echo "== $$pkg $$f ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

## stress: the big form of the FileStorage crash tests (2000 SIGKILLs of a
## committing writer, then ZODB/py's fstest; 2000 of a writer handing out
## oids; 1000 simulated power losses, fstest on 50 of them), 10-15 minutes
## with -race; and of zodb/resolve's differential test
## against BTrees (100,000 conflicts per class kind), about 15 minutes
.PHONY: stress
stress: venv
	ZODBD_STRESS=1 $(GO) test $(GOTESTFLAGS) -run '^(TestCrash|TestOidCrash|TestPowerLoss)$$' -timeout 90m -v ./fs1
	ZODBD_STRESS=1 $(GO) test -run '^TestDifferential$$' -timeout 60m -v ./zodb/resolve

clean:
	rm -rf bin data/demo .pytest_cache
	find . -name __pycache__ -type d -not -path './$(VENV)/*' -prune -exec rm -rf {} +

## distclean: also the venv and the datasets
distclean: clean
	rm -rf $(VENV) data
