# mxtrain build. `make` builds the library, pkg-config file, CLI, tests and benchmarks into
# $(BUILD); `make test` runs the tests; `make check` is what CI runs: warnings as errors,
# gcc and clang builds, and an ASan+UBSan build, each running every test, then each libFuzzer
# target for FUZZ_SECONDS; `make fuzz` builds the libFuzzer targets into build-fuzz/.
# MPI=mpich builds against Debian's MPICH instead of Open MPI, into build-mpich/ by default.

# The MPI implementation, by its pkg-config name: Open MPI (the default) or MPICH.
MPI     ?= openmpi
ifeq ($(MPI),openmpi)
  MPI_PKG = ompi-c
else ifeq ($(MPI),mpich)
  MPI_PKG = mpich
else
  $(error MPI=$(MPI) is not supported (allowed: openmpi, mpich))
endif
BUILD   ?= $(if $(filter mpich,$(MPI)),build-mpich,build)
CC      ?= gcc
OPT     ?= -O2
SAN     ?=
WERROR  ?=

PKGS    = yaml-0.1 jansson zlib libpcre2-8 libutf8proc $(MPI_PKG)
CFLAGS_BASE = -std=c11 $(OPT) -g -ffp-contract=off -Wall -Wextra -Wshadow -Wstrict-prototypes -fopenmp \
              -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc $(shell pkg-config --cflags $(PKGS))
ifeq ($(SAN),1)
  CFLAGS_BASE += -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
  LDFLAGS_SAN  = -fsanitize=address,undefined
endif
# The libFuzzer build (`make fuzz`, clang only): the library instrumented for coverage and
# sanitized; the targets link libFuzzer's main.
ifeq ($(SAN),fuzz)
  CFLAGS_BASE += -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
  LDFLAGS_SAN  = -fsanitize=address,undefined
endif
ifeq ($(WERROR),1)
  CFLAGS_BASE += -Werror
endif
CFLAGS  += $(CFLAGS_BASE)
LDLIBS   = $(shell pkg-config --libs $(PKGS)) -ldnnl -lm
LDFLAGS += -fopenmp $(LDFLAGS_SAN)

# SIMD kernels (any src/**/x86/ file) are compiled for their instruction set and only
# called after a CPU check (mx_kernel_available): *_avx512.c files for AVX-512, the others
# for AVX2. The rest of the library is plain x86-64, so one binary runs on any of them.
AVX2_FLAGS   = -mavx2 -mfma -mf16c -mbmi2
AVX512_FLAGS = -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma -mbmi2
# SIMDE=1: the AVX-512 kernels' source compiled for AVX2 on SIMDe's portable intrinsics
# (libsimde-dev), so that the AVX-512 code runs, and is tested, on CPUs without AVX-512.
SIMDE   ?=
ifeq ($(SIMDE),1)
  CFLAGS_BASE += -DMXI_AVX512_SIMDE -Wno-psabi
  AVX512_FLAGS = $(AVX2_FLAGS)
endif
SIMD_FLAGS = $(if $(findstring /x86/,$<),$(if $(findstring _avx512,$<),$(AVX512_FLAGS),$(AVX2_FLAGS)))

# The library is every source under src/ but the CLI; layers are folders (see README).
LIB_SRC   = $(sort $(filter-out src/cli/%,$(wildcard src/*/*.c src/*/*/*.c)))
LIB_OBJ   = $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_SRC   = $(wildcard src/cli/*.c)
CLI_OBJ   = $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC  = $(wildcard tests/test_*.c)
TEST_BIN  = $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# MPI tests: run under mpirun by tests/*.sh, not directly by tests/run
MPI_TEST_SRC = $(wildcard tests/mpi_*.c)
TEST_BIN += $(MPI_TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# Fuzz targets: in every build a replayer over files (with tests/fuzz/replay_main.c), run by
# tests/fuzz_replay.sh; in the SAN=fuzz build a libFuzzer fuzzer, run by tests/fuzz/run.sh.
FUZZ_SRC  = $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN  = $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)
FUZZ_SECONDS ?= 5
ifeq ($(SAN),fuzz)
  FUZZ_MAIN =
  FUZZ_LINK = -fsanitize=fuzzer
else
  FUZZ_MAIN = $(BUILD)/obj/tests/fuzz/replay_main.o
  FUZZ_LINK =
endif
BENCH_SRC = $(wildcard bench/bench_*.c)
BENCH_BIN = $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
HEADERS   = $(wildcard include/mxtrain/*.h src/*/*.h src/*/*/*.h tests/*.h tests/fuzz/*.h bench/*.h)

LIB = $(BUILD)/libmxtrain.a
PC  = $(BUILD)/mxtrain.pc
CLI = $(BUILD)/mxtrain

.PHONY: all test check bench clean fuzz fuzz-targets simde-tests mpi-tests
all: $(LIB) $(PC) $(CLI) $(TEST_BIN) $(FUZZ_BIN) $(BENCH_BIN)

# What the MPI tests need (the CLI and the MPI test binaries): `make check` builds only this
# with MPI=mpich and runs only the tests that launch ranks there (tests/run --mpi).
mpi-tests: $(CLI) $(MPI_TEST_SRC:tests/%.c=$(BUILD)/tests/%)

# The tests of the kernels alone, for the SIMDe build (make BUILD=build-simde SIMDE=1
# simde-tests): there the AVX-512 kernels run, emulated, on any CPU with AVX2.
SIMDE_TESTS = $(BUILD)/tests/test_mx $(BUILD)/tests/test_mx_gemm $(BUILD)/tests/test_gemm \
              $(BUILD)/tests/test_nn_kernels $(BUILD)/tests/test_attention $(BUILD)/tests/test_scaled
simde-tests: $(SIMDE_TESTS)

$(BUILD)/obj/src/%.o: src/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SIMD_FLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# pkg-config file pointing into this checkout, for linking outside programs against it.
# Its `cc` variable names the compiler the library was built with (OpenMP runtimes differ).
$(PC): Makefile
	@mkdir -p $(dir $@)
	printf '%s\n' 'prefix=$(CURDIR)' 'libdir=$(abspath $(BUILD))' 'includedir=$${prefix}/include' 'cc=$(CC)' '' \
	  'Name: mxtrain' 'Description: MXFP8 low-precision training library' 'Version: 0.1.0' \
	  'Requires.private: $(PKGS)' 'Cflags: -I$${includedir}' \
	  'Libs: -L$${libdir} -lmxtrain -fopenmp' 'Libs.private: -ldnnl -lm $(LDFLAGS_SAN)' > $@

$(CLI): $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(BUILD)/obj/tests/harness.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(FUZZ_MAIN) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(FUZZ_LINK) $^ $(LDLIBS) -o $@

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

test: all
	tests/run $(BUILD)

bench: all
	$(BUILD)/bench/bench_quant

fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang SAN=fuzz OPT=-O1 WERROR=1 fuzz-targets
fuzz-targets: $(FUZZ_BIN)

# CI: every test in ASan's build, gcc's and clang's C tests and their shell tests that launch
# no MPI ranks, the kernel tests of the SIMDe build (the AVX-512 kernels, emulated, wherever
# the CPU lacks AVX-512), the MPI tests on MPICH (optimized, as gcc's) and every fuzz target
# for FUZZ_SECONDS; the runner's closing line sums all of them. Open MPI's optimized path runs
# in the README's main job; its MPI tests under ASan check the same code with more eyes. The builds are prerequisites, so
# that under -j they share the jobs. The SIMDe build is clang's: on SIMDe's emulated
# intrinsics gcc takes two minutes over the AVX-512 MX kernels, clang 20 s.
CHECK_BUILDS = check-build-simde check-build-gcc check-build-clang check-build-asan check-build-mpich check-build-fuzz
.PHONY: $(CHECK_BUILDS)
check: $(CHECK_BUILDS)
	tests/run --no-mpi build --no-mpi build-clang build-asan build-simde --mpi build-mpich --fuzz build-fuzz $(FUZZ_SECONDS)
check-build-gcc:
	$(MAKE) -Otarget BUILD=build WERROR=1 all
check-build-clang:
	$(MAKE) -Otarget BUILD=build-clang CC=clang WERROR=1 all
check-build-asan:
	$(MAKE) -Otarget BUILD=build-asan SAN=1 OPT=-O1 WERROR=1 all
check-build-simde:
	$(MAKE) -Otarget BUILD=build-simde CC=clang SIMDE=1 WERROR=1 simde-tests
check-build-mpich:
	$(MAKE) -Otarget BUILD=build-mpich MPI=mpich WERROR=1 mpi-tests
check-build-fuzz:
	$(MAKE) -Otarget fuzz

clean:
	rm -rf build build-clang build-asan build-simde build-mpich build-fuzz
