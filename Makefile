# dsv4cp: one plain Makefile.
#   make            library (build/libdsv4cp.a, build/libdsv4cp.so) and CLI (build/dsv4cp)
#   make test       install missing Debian packages, build, run every test (then again under ASan+UBSan)
#   make demo       install, build, run the main job on a built-in default
#   make bench      install, build, run the benchmark report (bench/out/)
#   make install PREFIX=/usr/local   headers, libraries, CLI and a pkg-config file

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
            -Iinclude -Isrc -I$(BLAS_INC) $(MPI_INC) $(EXTRA_CFLAGS)
LDLIBS   += -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas $(MPI_LIB) -lcjson -lm -fopenmp $(EXTRA_LDFLAGS)

LIB_SRC  := $(wildcard src/*.c src/util/*.c src/io/*.c src/ops/*.c src/model/*.c src/cp/*.c)
CLI_SRC  := $(wildcard tools/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(wildcard tests/c/test_*.c)
TEST_BIN := $(TEST_SRC:tests/c/%.c=$(BUILD)/tests/%)
MPITEST_SRC := $(wildcard tests/c/mpitest_*.c)
TEST_BIN += $(MPITEST_SRC:tests/c/%.c=$(BUILD)/tests/%)

.PHONY: all deps test test-fast test-asan demo bench bench-long install clean
all: $(BUILD)/libdsv4cp.a $(BUILD)/libdsv4cp.so $(BUILD)/dsv4cp $(TEST_BIN)

HEADERS  := $(wildcard include/*.h src/*/*.h tools/*.h tests/c/*.h)
# Library objects export only what the public headers mark DSV4_API (include/dsv4cp.h).
LIB_CFLAGS := -fvisibility=hidden -DDSV4_BUILDING_LIBRARY

$(BUILD)/obj/src/%.o: src/%.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LIB_CFLAGS) -c $< -o $@

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

# The whole suite, then once more built with AddressSanitizer + UndefinedBehaviorSanitizer.
test: deps
	$(MAKE) --no-print-directory all
	tests/run_all.sh $(BUILD)
	$(MAKE) --no-print-directory test-asan

test-fast: all
	tests/run_all.sh $(BUILD)

test-asan:
	$(MAKE) --no-print-directory BUILD=build-asan OPT="-O1 -g -fno-omit-frame-pointer" \
	  EXTRA_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	  EXTRA_LDFLAGS="-fsanitize=address,undefined" all
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
	install -m 644 include/dsv4cp.h include/dsv4cp_mpi.h $(PREFIX)/include/
	install -m 644 $(BUILD)/libdsv4cp.a $(PREFIX)/lib/
	install -m 755 $(BUILD)/libdsv4cp.so $(PREFIX)/lib/
	install -m 755 $(BUILD)/dsv4cp $(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@BLAS_LIB@|$(BLAS_LIB)|' -e 's|@MPI_LIB@|$(MPI_LIB)|' \
	    -e 's|@VERSION@|$(VERSION)|' dsv4cp.pc.in > $(PREFIX)/lib/pkgconfig/dsv4cp.pc

clean:
	rm -rf build build-asan
