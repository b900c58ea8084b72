# Front door. `make run` and `make test` do all the set-up on a fresh Debian 12 machine.
BUILD   ?= build
CHECK   ?= build-check
MEMCHECK ?= build-memcheck
FUZZ    ?= build-fuzz
FUZZ_SECONDS ?= 30
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
NANOLM_IMPL ?= src
PREFIX  ?= /usr/local

.PHONY: all deps build run test test-isa test-aarch64 bench check memcheck install uninstall fuzz clean

all: build

deps:
	@scripts/setup-deps.sh

$(BUILD)/Makefile: CMakeLists.txt
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DNANOLM_IMPL=$(NANOLM_IMPL) $(CMAKE_FLAGS)

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) -DNANOLM_IMPL=$(NANOLM_IMPL) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# Installs the CLI (PREFIX/bin/nanolm), libnanolm.a and libnanolm.so, the headers
# (PREFIX/include/nanolm/), PREFIX/lib/pkgconfig/nanolm.pc and the Python package where Debian's
# python3 finds it (PREFIX/lib/python3/dist-packages for /usr, PREFIX/lib/python3.X/dist-packages
# else). DESTDIR=/tmp/stage stages the tree there.
install: build
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix $(PREFIX)

uninstall:
	@test -f $(BUILD)/install_manifest.txt || { echo "nanolm: nothing installed from $(BUILD)"; exit 1; }
	xargs rm -f < $(BUILD)/install_manifest.txt

# The main job on built-in defaults.
run: build
	@scripts/run-main.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 900 -j $(JOBS)

# The kernels' tests and the engine/serving tests again under every lower NANOLM_ISA cap this CPU
# allows (an AVX-512 machine also proves the AVX2 and scalar paths).
test-isa: build
	@scripts/test-isa.sh $(BUILD) $(JOBS)

# Cross-compiles for aarch64 and runs the core tests under qemu-aarch64: NEON with and without
# dotprod, and NANOLM_ISA=scalar (scripts/test-aarch64.sh; correctness only).
test-aarch64:
	@scripts/setup-deps.sh aarch64
	@scripts/test-aarch64.sh build-aarch64 $(JOBS)

bench: build
	@scripts/bench.sh $(BUILD)

# ASan + UBSan (+ LeakSanitizer) build of the whole suite.
check: deps
	cmake -S . -B $(CHECK) -DCMAKE_BUILD_TYPE=Debug -DNANOLM_SANITIZE=ON -DNANOLM_IMPL=$(NANOLM_IMPL) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(CHECK) -j $(JOBS)
	cd $(CHECK) && LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 NANOLM_SANITIZED=1 \
	  ctest --output-on-failure --timeout 1800 -j $(JOBS) -LE 'slow|mpi'
	@# Open MPI's plugins are dlclose()d at MPI_Finalize, so LeakSanitizer cannot name (or suppress)
	@# what they keep; the MPI tests run with ASan + UBSan but without leak checking.
	cd $(CHECK) && ASAN_OPTIONS=detect_leaks=0 NANOLM_SANITIZED=1 \
	  ctest --output-on-failure --timeout 1800 -j $(JOBS) -L mpi -LE slow --no-tests=ignore

# A portable build (no -march=native, which valgrind cannot run) at RelWithDebInfo, running a
# few commands under valgrind's memcheck (ctest label "valgrind"; zero errors required).
memcheck:
	@scripts/setup-deps.sh check
	cmake -S . -B $(MEMCHECK) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNANOLM_NATIVE=OFF -DNANOLM_IMPL=$(NANOLM_IMPL) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(MEMCHECK) -j $(JOBS) --target nanolm_cli test_valgrind
	cd $(MEMCHECK) && ctest --output-on-failure --timeout 1800 -L valgrind

# libFuzzer targets fuzz/fuzz_*.c (clang, ASan+UBSan), each run FUZZ_SECONDS from fuzz/corpus/.
# FUZZ_TARGETS="safetensors llama2c" runs only those.
fuzz:
	@scripts/setup-deps.sh fuzz
	cmake -S . -B $(FUZZ) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DNANOLM_FUZZ=ON -DNANOLM_IMPL=$(NANOLM_IMPL) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(FUZZ) -j $(JOBS) --target fuzzers
	scripts/fuzz.sh $(FUZZ) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf $(BUILD) $(CHECK) $(MEMCHECK) $(FUZZ)
