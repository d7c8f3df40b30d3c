# dsv4cp: one plain Makefile.
#   make            library (build/libdsv4cp.a, build/libdsv4cp.so) and CLI (build/dsv4cp)
#   make test       install missing Debian packages, build, run every test (then again under ASan+UBSan)
#   make demo       install, build, run the main job on a built-in default
#   make bench      install, build, run the benchmark report (bench/out/)
#   make install PREFIX=/usr/local   headers, libraries, CLI and a pkg-config file
#   make fuzz FUZZ_SECONDS=60        each fuzz harness of tests/fuzz for that long (libFuzzer)

CC       := mpicc
BUILD    ?= build
PREFIX   ?= /usr/local
PYTHON   ?= /usr/bin/python3

VERSION  := $(shell sed -n 's/^\#define DSV4_VERSION_STRING "\(.*\)"/\1/p' include/dsv4cp.h)
BLAS_INC := /usr/include/x86_64-linux-gnu/openblas-openmp
BLAS_LIB := /usr/lib/x86_64-linux-gnu/openblas-openmp
MPI_INC  := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIB  := $(shell mpicc --showme:link 2>/dev/null)

# -ffp-contract=off: a loop's vector body and its scalar remainder must give the same bits, so a
# token's result never depends on where it sits (CP = N bitwise equal to CP = 1).
OPT      ?= -O3 -march=native
CFLAGS   += -std=c17 -D_DEFAULT_SOURCE $(OPT) -ffp-contract=off -fopenmp -fPIC -Wall -Wextra -Werror \
            -Iinclude -I$(BLAS_INC) $(MPI_INC) $(EXTRA_CFLAGS)
LDLIBS   += -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas $(MPI_LIB) -lcjson -lm -fopenmp $(EXTRA_LDFLAGS)

LIB_SRC  := $(wildcard src/*.c src/util/*.c src/io/*.c src/ops/*.c src/plan/*.c src/model/*.c src/cp/*.c)
CLI_SRC  := $(wildcard tools/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(wildcard tests/c/test_*.c)
TEST_BIN := $(TEST_SRC:tests/c/%.c=$(BUILD)/tests/%)
MPITEST_SRC := $(wildcard tests/c/mpitest_*.c)
TEST_BIN += $(MPITEST_SRC:tests/c/%.c=$(BUILD)/tests/%)

.PHONY: all deps test test-fast test-asan demo bench bench-long install clean fuzz fuzz-build
all: $(BUILD)/libdsv4cp.a $(BUILD)/libdsv4cp.so $(BUILD)/dsv4cp $(TEST_BIN)

HEADERS  := $(wildcard include/*.h src/*/*.h tools/*.h tests/c/*.h)
# Library objects export only what the public headers mark DSV4_API (include/dsv4cp*.h). Only the
# library and its unit tests see src/: the program (tools/) is built against the public headers
# alone, so it cannot use anything a user could not.
LIB_CFLAGS := -fvisibility=hidden -DDSV4_BUILDING_LIBRARY -Isrc

$(BUILD)/obj/src/%.o: src/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LIB_CFLAGS) -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -c $< -o $@

$(BUILD)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libdsv4cp.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libdsv4cp.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS)

$(BUILD)/dsv4cp: $(CLI_OBJ) $(BUILD)/libdsv4cp.a
	$(CC) -o $@ $(CLI_OBJ) $(BUILD)/libdsv4cp.a $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/c/%.o $(BUILD)/obj/tests/c/testutil.o $(BUILD)/libdsv4cp.a
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(BUILD)/obj/tests/c/testutil.o $(BUILD)/libdsv4cp.a $(LDLIBS)

deps:
	@scripts/install-deps.sh

# The whole suite (with a few seconds of each fuzz harness), then once more built with
# AddressSanitizer + UndefinedBehaviorSanitizer.
test: deps
	$(MAKE) --no-print-directory all fuzz-build
	FUZZ_BUILD=$(FUZZ_BUILD) tests/run_all.sh $(BUILD)
	$(MAKE) --no-print-directory test-asan

test-fast: all
	tests/run_all.sh $(BUILD)

# gcc's "undefined" leaves out float-cast-overflow (a double too large for its int: undefined behaviour)
SANITIZE := -fsanitize=address,undefined,float-cast-overflow

test-asan:
	$(MAKE) --no-print-directory BUILD=build-asan OPT="-O1 -g -fno-omit-frame-pointer" \
	  EXTRA_CFLAGS="$(SANITIZE) -fno-sanitize-recover=all" EXTRA_LDFLAGS="$(SANITIZE)" all
	DSV4_SANITIZED=1 tests/run_all.sh build-asan

# The demo runs with CP = 2 so that it also shows CP = N against CP = 1.
DEMO_RANKS ?= 2
MPIRUN     := mpirun --quiet --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root)
demo: deps all
	$(MPIRUN) -np $(DEMO_RANKS) $(BUILD)/dsv4cp demo

bench: deps all
	bench/run_bench.sh $(BUILD)

# CSA and HCA at 65,536 tokens, CP = 2, with recomputation (about 20 minutes)
bench-long: deps all
	bench/run_bench_long.sh $(BUILD)

install: all
	install -d $(PREFIX)/include $(PREFIX)/lib/pkgconfig $(PREFIX)/bin
	install -m 644 include/dsv4cp.h include/dsv4cp_io.h include/dsv4cp_mpi.h include/dsv4cp_ops.h $(PREFIX)/include/
	install -m 644 $(BUILD)/libdsv4cp.a $(PREFIX)/lib/
	install -m 755 $(BUILD)/libdsv4cp.so $(PREFIX)/lib/
	install -m 755 $(BUILD)/dsv4cp $(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@BLAS_LIB@|$(BLAS_LIB)|' -e 's|@MPI_LIB@|$(MPI_LIB)|' \
	    -e 's|@VERSION@|$(VERSION)|' dsv4cp.pc.in > $(PREFIX)/lib/pkgconfig/dsv4cp.pc

# ---- fuzzing (tests/fuzz): four harnesses (safetensors reader + weight loader, config.json,
# index file, packing metadata) over a library built with sanitizers. libFuzzer with clang where it
# links; otherwise gcc and tests/fuzz/driver.c, which replays the corpus and mutates it for as long.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_NAMES   := safetensors config index packing
# probed only for the goals that build the harnesses (it costs a clang run)
ifneq ($(filter fuzz fuzz-build test,$(MAKECMDGOALS)),)
HAVE_LIBFUZZER ?= $(shell printf 'int LLVMFuzzerTestOneInput(const char *d, long n) { return d && n; }\n' | \
                    clang -fsanitize=fuzzer -x c - -o /dev/null >/dev/null 2>&1 && echo yes)
endif
ifeq ($(HAVE_LIBFUZZER),yes)
FUZZ_CC      := clang
FUZZ_COMPILE := -fsanitize=fuzzer-no-link,address,undefined,float-cast-overflow
FUZZ_LINK    := -fsanitize=fuzzer,address,undefined,float-cast-overflow
FUZZ_MAIN    :=
else
FUZZ_CC      := gcc
FUZZ_COMPILE := $(SANITIZE)
FUZZ_LINK    := $(SANITIZE)
FUZZ_MAIN    := $(FUZZ_BUILD)/obj/tests/fuzz/driver.o
endif
# single-threaded (no OpenMP: src/util/par.h falls back); MPI headers only (the harnesses use no MPI)
FUZZ_CFLAGS  := -std=c17 -D_DEFAULT_SOURCE -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=all -Wall -Wextra \
                -Werror -Wno-unknown-pragmas -Iinclude -Isrc -Itests/fuzz -I$(BLAS_INC) $(MPI_INC) $(FUZZ_COMPILE)
FUZZ_OBJ     := $(LIB_SRC:%.c=$(FUZZ_BUILD)/obj/%.o)

$(FUZZ_BUILD)/obj/%.o: %.c $(HEADERS) tests/fuzz/fuzz_util.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_BUILD)/libdsv4cp.a: $(FUZZ_OBJ)
	rm -f $@ && ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/obj/tests/fuzz/fuzz_%.o $(FUZZ_MAIN) $(FUZZ_BUILD)/libdsv4cp.a
	$(FUZZ_CC) $(FUZZ_LINK) -o $@ $^ -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas $(MPI_LIB) -lcjson -lm

fuzz-build: $(FUZZ_NAMES:%=$(FUZZ_BUILD)/fuzz_%)

fuzz: deps fuzz-build
	tests/fuzz/run_fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

clean:
	rm -rf build build-asan $(FUZZ_BUILD)
