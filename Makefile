# Thin verbs over CMake (STYLE.md): the README's two commands are
# `make demo` and `make test`; both install what they need first.
PY      := /usr/bin/python3
JOBS    ?= 2
CTEST   := ctest --timeout 300 --output-on-failure -j $(JOBS)
# Keep the recursive make chatter of CMake's generated Makefiles out of the output.
CMAKE_BUILD := env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL cmake --build

.PHONY: all deps build build-asan test test-c test-asan test-py test-fuzz lint format \
        demo install uninstall deb bundle fuzz-build \
        bench bench-all bench-probe bench-verify bench-index bench-decode bench-plan bench-ddl fuzz clean

all: build

deps:
	@scripts/setup-deps.sh

build:
	@cmake --preset default >/dev/null
	@$(CMAKE_BUILD) --preset default -j$(JOBS)

build-asan:
	@cmake --preset asan >/dev/null
	@$(CMAKE_BUILD) --preset asan -j$(JOBS)

test: deps
	@$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory build build-asan
	@$(MAKE) --no-print-directory test-c test-asan test-py test-fuzz

# checksrc (banned calls, unchecked allocations, whitespace) always; the
# clang-format check, enforced (FORMAT_CHECK=on; the tree was reformatted
# once with `make format`; FORMAT_CHECK=off only counts the files).
FORMAT_CHECK ?= on
lint:
	@FORMAT_CHECK=$(FORMAT_CHECK) scripts/lint.sh

# Reformats every C file of the tree in place with .clang-format.
format:
	@scripts/lint.sh --files | xargs clang-format -i

test-c:
	@echo "== C unit tests" && cd build && $(CTEST)

test-asan:
	@echo "== C unit tests under ASan+UBSan" && cd build-asan && \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(CTEST)

test-py:
	@echo "== integration tests (pytest)" && \
	  DATAHELIX_BIN=$(CURDIR)/build/datahelix \
	  DATAHELIX_ASAN_BIN=$(CURDIR)/build-asan/datahelix \
	  $(PY) -m pytest -q -p no:cacheprovider tests/integration

demo: deps build
	@scripts/demo.sh build/datahelix

# `make install [PREFIX=DIR]` (default /usr/local) records what it put
# where in DIR/share/datahelix/installed-files; `make uninstall [PREFIX=DIR]`
# removes exactly those files (and the folders they leave empty).
PREFIX ?= /usr/local
install: build
	@scripts/install.sh install build $(PREFIX)

uninstall:
	@scripts/install.sh uninstall build $(PREFIX)

# A Debian package of the build (dpkg-deb; installs under /usr, with the
# Python package in /usr/lib/python3/dist-packages): DIST/datahelix_V_ARCH.deb.
DIST ?= dist
deb: build
	@scripts/make-deb.sh build $(DIST)

# A relocatable tree and tarball of the build, with the libraries a stock
# glibc >= 2.36 Linux lacks and $ORIGIN run paths (docs/bundle.md):
# DIST/datahelix-V-linux-ARCH{/,.tar.gz}.  Reuses build/; tested by
# tests/integration/test_bundle.py.  BUNDLE_GZIP=9: a smaller tarball.
bundle: deps build
	@scripts/make-bundle.sh build $(DIST)

# Issue 7's evaluation matrix in <= 15 minutes here: every system side by
# side on mixed/videomae, mixed/qwen-vl and shared/dit, the Table 2
# aggregate, the simulator's validation and its paper-scale Table 2.
bench: build
	@scripts/setup-deps.sh bench
	@$(PY) bench/bench_matrix.py --bin build/datahelix

# Every benchmark, one after the other (well over 15 minutes).
bench-all: bench-probe bench-audio bench-shards bench-storage bench-verify bench-index bench-decode bench-decoder-reuse bench-arena bench-handover bench-python bench-ddl bench-plan bench-coschedule bench-place bench-route bench-exchange bench-live bench-regimes bench-tails bench

bench-probe: build
	@$(PY) bench/bench_probe.py --bin build/datahelix

# Issue 35: the bench-live cell (dh-ddl) from a folder of files and from
# 1 GiB shards of the same clips, alternated; probe files/s of both.
.PHONY: bench-shards
bench-shards: build
	@$(PY) bench/bench_shards.py --bin build/datahelix

# Issue 37: the bench-live cell with the clips on local disk, on nginx
# (HTTP) and in s3rver (S3) at 0, 20 and 50 ms RTT, cold and warm cache,
# dh-ddl beside torch's DataLoader + PyAV reading the same objects.
.PHONY: bench-storage
bench-storage: build
	@scripts/setup-deps.sh bench
	@$(PY) bench/bench_storage.py --bin build/datahelix

# probe --verify: files/s and x real time, beside ffmpeg -f null per file.
bench-verify: build
	@$(PY) bench/bench_verify.py --bin build/datahelix

bench-decode: build
	@scripts/setup-deps.sh bench
	@$(PY) bench/bench_decode.py --bin build/datahelix

# Issue 38: 5 s windows of sound to 16 kHz mono, datahelix vs PyAV vs
# torchaudio, one CPU each.
.PHONY: bench-audio
bench-audio: build
	@scripts/setup-deps.sh bench
	@$(PY) bench/bench_audio.py --bin build/datahelix

# Decoders taken over across files vs one per file (issue 21 item 2).
.PHONY: bench-decoder-reuse
bench-decoder-reuse: build
	@$(PY) bench/bench_decoder_reuse.py --bin build/datahelix

# The Python DataLoader: next() overhead, samples/s vs torch's DataLoader.
bench-python: build
	@$(PY) bench/bench_python.py --bin build/datahelix

# DistributedDataLoader against torch's DataLoader: first batch, its split,
# steady samples/s, the warm second epoch (docs/benchmarks.md).
bench-ddl: build
	@$(PY) bench/bench_ddl.py --bin build/datahelix

# Loaders side by side in one run under one CPU budget, the paper's metrics
# (`datahelix bench`; needs python3-distributed and python3-matplotlib).
LIVE := build/datahelix bench --workload mixed --ranks 4 --workers 2 \
        --batch-size 2 --steps 40 --warmup 5 --plots --validate
.PHONY: bench-live
bench-live: build
	@scripts/setup-deps.sh bench
	@$(LIVE) --model videomae --out bench/out/live/videomae
	@$(LIVE) --model qwen-vl --out bench/out/live/qwen-vl

# Both regimes of issue 21 on purpose, native, the pool and dh-ddl side by
# side with each one's ceiling: every process pinned to 1 CPU (CPU-bound),
# then 2 CPUs with every GPU window 3x as long (GPU-bound).  The 1-CPU run
# also checks the simulator against live there (issue 21 item 4).
REGIME := build/datahelix bench --workload mixed --ranks 4 --batch-size 2 \
        --steps 40 --warmup 5 --model qwen-vl \
        --systems native,dask-pool,dh-ddl
.PHONY: bench-regimes
bench-regimes: build
	@scripts/setup-deps.sh bench
	@$(REGIME) --workers 1 --validate --out bench/out/regimes/cpu-bound
	@$(REGIME) --workers 2 --gpu-scale 3 --out bench/out/regimes/gpu-bound

# Tails when the CPUs are short (issue 21 item 3): dh-ddl with the CPU
# pools on / off and the plan's steps alternating / sorted, on 1 and 2 CPUs.
.PHONY: bench-tails
bench-tails: build
	@scripts/setup-deps.sh bench
	@$(PY) bench/bench_tails.py --bin build/datahelix

# Co-scheduling live: deadline + fixed plans vs least-request + no balance,
# DDL miss and input-wait p95 (medians of 3 rounds) beside the simulator's.
.PHONY: bench-coschedule
bench-coschedule: build
	@$(PY) bench/bench_coschedule.py --bin build/datahelix

# Token balance of the plans, then how long planning a large epoch takes
# (PLAN_N samples, the median of 3).
PLAN_N ?= 10000000
bench-plan: build
	@build/bench_plan_balance
	@build/bench_plan_time $(PLAN_N) 3

bench-index: build
	@build/bench_index
	@$(PY) bench/bench_index_python.py

.PHONY: bench-arena
bench-arena: build
	@build/bench_arena

# The arena vs torch.utils.data.DataLoader vs memcpy, one run (needs python3-torch).
.PHONY: bench-handover
bench-handover: build
	@scripts/setup-deps.sh bench
	@$(PY) bench/bench_handover.py --bin build/bench_arena

# Tier-2's exchange: 64 decoded-size samples over 4 gloo ranks, one
# all_to_all_single vs one-by-one send/recv vs loopback TCP (needs
# python3-torch; docs/rebalance.md "The exchange"); then Tier 2 live in the
# loader, step p50/p95 off and on, wrong and right estimates ("Live").
.PHONY: bench-exchange
bench-exchange: build
	@scripts/setup-deps.sh bench
	@$(PY) bench/bench_exchange.py
	@$(PY) bench/bench_tier2.py --bin build/datahelix

.PHONY: bench-place
bench-place: build
	@build/bench_place

.PHONY: bench-route
bench-route: build
	@build/bench_route

# Every attack of issue 13 as a regression test (README "Trust and
# survival"): the C ones in both builds, then the process-level ones.
.PHONY: attacks
attacks: build build-asan
	@cd build && $(CTEST) -R 'test_attacks|test_transport|test_remote|test_peer_cred|test_keys|test_client|fuzz_coordinator_seq|fuzz_payload_seq|fuzz_client_seq'
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $(CTEST) -R 'test_attacks|test_transport|test_remote|test_peer_cred|test_keys|test_client|fuzz_coordinator_seq|fuzz_payload_seq|fuzz_client_seq'
	@DATAHELIX_BIN=$(CURDIR)/build/datahelix DATAHELIX_ASAN_BIN=$(CURDIR)/build-asan/datahelix \
	  $(PY) -m pytest -q -p no:cacheprovider tests/integration/test_attacks.py \
	  tests/integration/test_auth.py tests/integration/test_slot_format.py \
	  tests/integration/test_service_logs.py tests/integration/test_survival.py \
	  tests/integration/test_runtime.py::test_external_link_hands_the_arena_only_to_the_named_pid

# Chaos soak (issue 13 item 9; needs root): a 4-rank job with sidecars in
# network namespaces, kill -9 and link flaps at random, corrupt clips, and a
# key-holding insider that lies, stays silent and forges (issue 36); fails
# on any sample lost or duplicated, a hang, RSS/fd drift or residue.  CI runs
# 60 s of it (tests/integration/test_chaos.py).
SOAK_SECONDS ?= 600
SOAK_KINDS ?= sidecar,dataserver,coordinator,link,worker
.PHONY: soak
soak: build
	@DATAHELIX_BIN=$(CURDIR)/build/datahelix $(PY) tests/soak/chaos.py \
	  --seconds $(SOAK_SECONDS) --kinds $(SOAK_KINDS)

FUZZ_SECONDS ?= 6
FUZZERS := fuzz_desc_json fuzz_index_open fuzz_media_decode fuzz_wire_decode \
           fuzz_coordinator_seq fuzz_payload_seq fuzz_client_seq \
           fuzz_remote_text

# `make fuzz` grows the checked-in corpora: every target runs FUZZ_MINUTES
# (default 1) from its corpus, and what it finds that adds coverage is
# merged back into tests/fuzz/corpus/<target> (libFuzzer -merge=1, so the
# corpus stays minimal); commit what it adds.  `make test` replays them
# (ctest *_replay, also under ASan) and runs each for FUZZ_SECONDS.
FUZZ_MINUTES ?= 1
fuzz: fuzz-build
	@for f in $(FUZZERS); do \
	  d=$$(mktemp -d) && \
	  echo "== $$f: $(FUZZ_MINUTES) min" && \
	  build-fuzz/$$f -max_total_time=$$(( $(FUZZ_MINUTES) * 60 )) -timeout=10 \
	    -rss_limit_mb=2048 -max_len=32768 $$d tests/fuzz/corpus/$$f \
	    > build-fuzz/$$f.grow.log 2>&1 || { tail -40 build-fuzz/$$f.grow.log; rm -rf $$d; exit 1; }; \
	  n0=$$(ls tests/fuzz/corpus/$$f | wc -l); \
	  build-fuzz/$$f -merge=1 tests/fuzz/corpus/$$f $$d > build-fuzz/$$f.merge.log 2>&1; \
	  echo "$$f: $$(grep -o 'Done [0-9]* runs' build-fuzz/$$f.grow.log), corpus $$n0 -> $$(ls tests/fuzz/corpus/$$f | wc -l) inputs"; \
	  rm -rf $$d; \
	done

fuzz-build:
	@cmake --preset fuzz >/dev/null
	@$(CMAKE_BUILD) --preset fuzz -j$(JOBS)

# A short bounded libFuzzer run of every target from its checked-in corpus
# (new inputs go to a scratch folder; the corpus is never written).
test-fuzz: fuzz-build
	@echo "== libFuzzer smoke run, $(FUZZ_SECONDS) s per target"
	@for f in $(FUZZERS); do \
	  d=$$(mktemp -d) && \
	  if build-fuzz/$$f -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	       -rss_limit_mb=2048 -max_len=32768 $$d tests/fuzz/corpus/$$f \
	       > build-fuzz/$$f.log 2>&1; then \
	    rm -rf $$d; echo "$$f: $$(grep -o 'Done [0-9]* runs' build-fuzz/$$f.log)"; \
	  else \
	    tail -40 build-fuzz/$$f.log; rm -rf $$d; exit 1; \
	  fi; \
	done

clean:
	rm -rf build build-asan build-debug build-release build-fuzz
