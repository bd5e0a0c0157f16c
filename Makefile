# fattn: one entry point. make [all|shared|python-test|run|test|gpu-test|gpu-sanitize|asan|tsan|fuzz|
# bench|install|uninstall|clean]
# Host code is C11 with -Werror; CUDA code is built for CUDA_ARCHS (sm_90a only for attn/fa3, attn/mla).

CUDA        ?= /usr/local/cuda
NVCC        ?= $(CUDA)/bin/nvcc
CC          ?= gcc
CLANG       ?= clang
CUDA_ARCHS  ?= 80 90a
FUZZ_SECONDS ?= 60
BUILD       ?= build
JOBS        ?= $(shell nproc)
PREFIX      ?= /usr/local
DESTDIR     ?=

# jemalloc: the system's (Debian's libjemalloc-dev) unless JEMALLOC names the prefix of another
# build (make JEMALLOC=/opt/jemalloc: its include/ and lib/); JEMALLOC_CFLAGS and JEMALLOC_LIBS
# may also be given outright. Binaries linking it dynamically find it through an rpath.
JEMALLOC    ?=
JEMALLOC_CFLAGS ?= $(if $(JEMALLOC),-I$(JEMALLOC)/include)
JEMALLOC_LIBS   ?= $(if $(JEMALLOC),-L$(JEMALLOC)/lib -Wl$(comma)-rpath$(comma)$(JEMALLOC)/lib)

comma := ,
gencode = $(foreach a,$(1),-gencode=arch=compute_$(a),code=sm_$(a))
HOPPER_ARCHS := $(filter 90a,$(CUDA_ARCHS))

# include/ holds the public header alone; lib/ the internal ones (`#include "fattn.h"` finds the first).
INCLUDES  := -I. -Iinclude -Ilib $(JEMALLOC_CFLAGS) -I$(CUDA)/include
CWARN     := -Wall -Wextra -Werror
# Every object is position-independent, so that one object set makes both libfattn.a and
# libfattn.so. -fno-semantic-interposition keeps the inlining of -fPIE: the .so exports only
# the public fattn_* symbols, so nothing inside it can be interposed. fattn-bench plan (CPU
# backend) times fattn_plan the same with and without (docs/python.md).
PIC       := -fPIC -fno-semantic-interposition
CFLAGS    ?= -O2 -g
ALL_CFLAGS = -std=c11 -D_GNU_SOURCE $(CWARN) $(PIC) $(CFLAGS) $(INCLUDES) -MMD -MP
NVCCFLAGS ?= -O3 -g -lineinfo
ALL_NVCCFLAGS = -std=c++17 $(NVCCFLAGS) $(INCLUDES) -Xcompiler -Wall,-Wextra,-Werror \
                -Xcompiler -fPIC --expt-relaxed-constexpr -Werror all-warnings -MMD -MP

LIB_C   := $(sort $(wildcard lib/*.c arena/*.c attn/*.c attn/*/*.c graph/*.c))
LIB_CU  := $(sort $(wildcard arena/*.cu attn/*.cu attn/ref/*.cu attn/fa2/*.cu graph/*.cu))
LIB_CU90 := $(sort $(wildcard attn/fa3/*.cu attn/mla/*.cu))
LIB_OBJS := $(LIB_C:%.c=$(BUILD)/obj/%.o) $(LIB_CU:%.cu=$(BUILD)/obj/%.cu.o)
ifneq ($(HOPPER_ARCHS),)
LIB_OBJS += $(LIB_CU90:%.cu=$(BUILD)/obj/%.cu.o)
ALL_CFLAGS += -DFATTN_HAVE_SM90A=1
ALL_NVCCFLAGS += -DFATTN_HAVE_SM90A=1
endif

SUPPORT_C  := $(sort $(wildcard tests/support*.c))
SUPPORT_CU := $(sort $(wildcard tests/support*.cu))
SUPPORT_OBJS := $(SUPPORT_C:%.c=$(BUILD)/obj/%.o) $(SUPPORT_CU:%.cu=$(BUILD)/obj/%.cu.o)
CPU_TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(sort $(wildcard tests/test_*.c)))
GPU_TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(sort $(wildcard tests/gpu_*.c)))
FUZZERS   := $(patsubst fuzz/%.c,%,$(sort $(wildcard fuzz/fuzz_*.c)))
# fattn-bench: the user's subcommands (bench/) and the measurement lab's (tools/: `copies`, and
# the stamps timeline of a -DFATTN_STAMPS build).
BENCH_C   := $(sort $(wildcard bench/*.c)) tools/serve_stamps.c
BENCH_CU  := $(sort $(wildcard bench/*.cu)) tools/copies.cu

# Calls that the hot path must never make; tests/support.c counts them (and injects faults).
WRAPPED := malloc calloc realloc free posix_memalign aligned_alloc \
           cudaMalloc cudaFree cudaHostAlloc cudaMallocHost cudaFreeHost cudaMallocManaged \
           cudaMallocAsync cudaFreeAsync cudaDeviceSynchronize cudaStreamSynchronize \
           cudaEventSynchronize cudaMemcpy cudaMemset
WRAP_FLAGS := $(foreach f,$(WRAPPED),-Wl,--wrap=$(f))

STATIC_DEPS := $(JEMALLOC_LIBS) -Wl,-Bstatic -ljemalloc -lcheck -lsubunit -Wl,-Bdynamic
CUDA_LIBS   := -L$(CUDA)/lib64 $(CUDA)/lib64/libcudart_static.a -lcurand
SYS_LIBS    := -lstdc++ -lm -lpthread -ldl -lrt
LINK_TEST = @echo '  LD    $@'; $(CC) $(CFLAGS) -o $@ $^ $(WRAP_FLAGS) $(STATIC_DEPS) $(CUDA_LIBS) $(SYS_LIBS)

.PHONY: all deps shared python-test run test cpu-test gpu-bundle gpu-test gpu-test-multi gpu-sanitize asan tsan fuzz \
        fuzz-replay bench install uninstall clean
.DEFAULT_GOAL := all
.SECONDARY:

# examples/tp.c, attention under tensor parallelism (cuBLAS, and NCCL from the CUDA toolkit):
# built where the toolkit has NCCL; make gpu-test-multi runs it.
TP := $(if $(wildcard $(CUDA)/include/nccl.h),$(BUILD)/tp)

all: deps $(BUILD)/libfattn.a $(CPU_TESTS) $(GPU_TESTS) $(BUILD)/fattn-bench $(BUILD)/libktrace.so $(TP)

deps:
	@JEMALLOC='$(JEMALLOC)' bash .ci/deps

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo '  CC    $<'
	@$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/attn/fa3/%.cu.o: attn/fa3/%.cu
	@mkdir -p $(dir $@)
	@echo '  NVCC  $< (sm_90a)'
	@$(NVCC) $(ALL_NVCCFLAGS) $(call gencode,$(HOPPER_ARCHS)) -c $< -o $@

$(BUILD)/obj/attn/mla/%.cu.o: attn/mla/%.cu
	@mkdir -p $(dir $@)
	@echo '  NVCC  $< (sm_90a)'
	@$(NVCC) $(ALL_NVCCFLAGS) $(call gencode,$(HOPPER_ARCHS)) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	@echo '  NVCC  $<'
	@$(NVCC) $(ALL_NVCCFLAGS) $(call gencode,$(CUDA_ARCHS)) -c $< -o $@

$(BUILD)/libfattn.a: $(LIB_OBJS)
	@rm -f $@
	@echo '  AR    $@'
	@ar rcs $@ $^

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(SUPPORT_OBJS) $(BUILD)/libfattn.a
	@mkdir -p $(dir $@)
	@$(LINK_TEST)

# The benchmark borrows the GPU test helpers (cuRAND fills) rather than repeating them.
$(BUILD)/fattn-bench: $(BENCH_C:%.c=$(BUILD)/obj/%.o) $(BENCH_CU:%.cu=$(BUILD)/obj/%.cu.o) $(SUPPORT_CU:%.cu=$(BUILD)/obj/%.cu.o) $(BUILD)/libfattn.a
	@echo '  LD    $@'
	@$(CC) $(CFLAGS) -o $@ $^ $(JEMALLOC_LIBS) -Wl,-Bstatic -ljemalloc -Wl,-Bdynamic $(CUDA_LIBS) $(SYS_LIBS)

$(BUILD)/tp: examples/tp.c $(BUILD)/libfattn.a
	@echo '  LD    $@'
	@$(CC) $(ALL_CFLAGS) -I$(CUDA)/include -o $@ $< $(BUILD)/libfattn.a $(JEMALLOC_LIBS) -Wl,-Bstatic -ljemalloc \
	  -Wl,-Bdynamic $(CUDA_LIBS) -lcublas -lnccl -Wl,-rpath,$(CUDA)/lib64 $(SYS_LIBS)

# Kernel-alone times of any program, through CUPTI (tools/ktrace; docs/guide.md):
# KTRACE_OUT=k.txt CUDA_INJECTION64_PATH=$PWD/build/libktrace.so build/fattn-bench decode
$(BUILD)/libktrace.so: tools/ktrace/ktrace.c
	@mkdir -p $(dir $@)
	@echo '  CC    $< (CUPTI injection library)'
	@$(CC) -std=c11 $(CWARN) -O2 -shared -fPIC -I$(CUDA)/include -o $@ $< -L$(CUDA)/lib64 -lcupti -Wl,-rpath,$(CUDA)/lib64

# ---- Shared library, for dlopen (the Python package, python/): the objects of libfattn.a, with
# the public fattn_* symbols exported alone (lib/exports.map), so that its cudart and the
# internal fattn__ symbols never meet the host process's. jemalloc is linked dynamically, as
# for ASan: the static archive would bind the library's malloc and free (cudart_static's among
# them) to a private jemalloc, which would then free what glibc's strdup and realpath allocate
# for cudart. Dynamically, malloc and free stay the process's own and libjemalloc.so.2 serves
# only the arena API (mallocx, mallctl) that arena/heap.c calls. Debian's jemalloc keeps its
# thread state in initial-exec TLS, which a dlopen can place only with a larger static TLS
# surplus: docs/python.md gives the GLIBC_TUNABLES setting.
$(BUILD)/libfattn.so: $(LIB_OBJS) lib/exports.map
	@echo '  LD    $@'
	@$(CC) -shared -o $@ $(LIB_OBJS) -Wl,--version-script=lib/exports.map -Wl,-z,defs \
	  -Wl,--as-needed $(JEMALLOC_LIBS) -ljemalloc $(CUDA_LIBS) $(SYS_LIBS)

shared: deps $(BUILD)/libfattn.so

# The Python package's tests on the CPU backend; without torch the tensor tests skip, without
# transformers the Hugging Face backend's. The tunable gives the dlopen of Debian's
# libjemalloc.so.2 its static TLS (see above).
PYTHON ?= python3
python-test: shared
	@$(PYTHON) -c 'import torch' 2>/dev/null || \
	  echo 'python-test: torch is not installed, the tensor tests skip (pip install torch)'
	@$(PYTHON) -c 'import torch, transformers' 2>/dev/null || \
	  echo 'python-test: torch or transformers is not installed, the Hugging Face tests skip (pip install transformers)'
	@cd python && FATTN_LIB=$(abspath $(BUILD)/libfattn.so) \
	  GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384 $(PYTHON) -m unittest tests.test_binding tests.test_hf

# Every suite; GPU suites skip themselves (one line each, counted) without a device.
test: all
	@bash tests/run.sh $(CPU_TESTS) $(GPU_TESTS)

cpu-test: all
	@bash tests/run.sh $(CPU_TESTS)

# On the GPU machine the binaries built here arrive prebuilt: build/.carried marks them so
# (that machine lacks the static jemalloc and Check to rebuild them).
GPU_PREREQ := $(if $(wildcard $(BUILD)/.carried),,all)

# What travels to a GPU machine: the GPU suites, fattn-bench and libfattn.so (the model check
# of gpu-test), compressed. Each binary holds the same ~60 MB of kernels; one xz stream whose
# window spans a whole binary stores them once (8 MB, against 36 MB with xz's default 8 MiB
# window). libfattn.so takes the libjemalloc.so.2 it was linked with along, in build/lib: the
# GPU machine's PyTorch image has none. There: tar xJf build/gpu-bundle.tar.xz && make gpu-test
gpu-bundle: all $(BUILD)/libfattn.so
	@touch $(BUILD)/.carried
	@jemalloc=$$(ldd $(BUILD)/libfattn.so | awk '$$1 == "libjemalloc.so.2" { print $$3 }'); \
	  [ -f "$$jemalloc" ] || { echo "gpu-bundle: ldd finds no libjemalloc.so.2 for $(BUILD)/libfattn.so"; exit 1; }; \
	  mkdir -p $(BUILD)/lib && cp -L "$$jemalloc" $(BUILD)/lib/libjemalloc.so.2
	@tar cf - $(GPU_TESTS) $(BUILD)/fattn-bench $(TP) $(BUILD)/libfattn.so $(BUILD)/lib/libjemalloc.so.2 \
	  $(BUILD)/libktrace.so $(BUILD)/.carried | \
	  xz -T1 -6 --lzma2=preset=6,dict=256MiB > $(BUILD)/gpu-bundle.tar.xz
	@rm -f $(BUILD)/.carried
	@echo "  TAR   $(BUILD)/gpu-bundle.tar.xz ($$(du -h $(BUILD)/gpu-bundle.tar.xz | cut -f1))"

# The GPU suites, then the model check (python/tests/model_check.py, docs/python.md: small
# random-weight transformers models through fattn against float32 eager) where $(PYTHON) has
# torch, transformers and a CUDA device; else one line says why it skips. It loads
# build/libfattn.so, and build/lib's libjemalloc.so.2 where the bundle brought one.
gpu-test: $(GPU_PREREQ) $(if $(wildcard $(BUILD)/.carried),,$(BUILD)/libfattn.so)
	@bash tests/run.sh --require-gpu $(GPU_TESTS); rc=$$?; \
	if why=$$($(PYTHON) -c 'import torch, transformers; assert torch.cuda.is_available(), "no CUDA device"' 2>&1); then \
	  LD_LIBRARY_PATH=$(abspath $(BUILD)/lib)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} \
	  FATTN_LIB=$(abspath $(BUILD)/libfattn.so) GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384 \
	  $(PYTHON) python/tests/model_check.py || rc=1; \
	else echo "gpu-test: the model check skips ($$(printf '%s\n' "$$why" | tail -n 1))"; fi; \
	exit $$rc

# Tensor parallelism (examples/tp.c --check): N = 2, and 4 and 8 where that many devices are
# present; ranks past the devices share them (two contexts on one device where there is one).
gpu-test-multi: $(GPU_PREREQ)
	@[ -x $(BUILD)/tp ] || { echo "gpu-test-multi: $(BUILD)/tp not built (the CUDA toolkit has no NCCL)"; exit 1; }
	@devices=$$(nvidia-smi -L 2>/dev/null | wc -l); rc=0; for n in 2 4 8; do \
	  if [ $$n -eq 2 ] || [ $$n -le $$devices ]; then NCCL_NVLS_ENABLE=0 $(BUILD)/tp $$n --check || rc=1; fi; \
	done; exit $$rc

gpu-sanitize: $(GPU_PREREQ)
	@bash tests/sanitize.sh $(GPU_TESTS)

run: $(GPU_PREREQ)
	$(BUILD)/fattn-bench run

bench: all
	$(BUILD)/fattn-bench decode
	$(BUILD)/fattn-bench prefill

# ---- AddressSanitizer + UBSan + LeakSanitizer over the CPU suites (host C code only).
ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
ASAN_LIB_OBJS := $(LIB_C:%.c=$(BUILD)/asan/%.o) $(LIB_CU:%.cu=$(BUILD)/obj/%.cu.o)
ifneq ($(HOPPER_ARCHS),)
ASAN_LIB_OBJS += $(LIB_CU90:%.cu=$(BUILD)/obj/%.cu.o)
endif
ASAN_TESTS := $(patsubst tests/%.c,$(BUILD)/asan/tests/%,$(sort $(wildcard tests/test_*.c)))

$(BUILD)/asan/%.o: %.c
	@mkdir -p $(dir $@)
	@echo '  CC    $< (asan)'
	@$(CC) $(ALL_CFLAGS) $(ASAN_FLAGS) -c $< -o $@

$(BUILD)/asan/libfattn.a: $(ASAN_LIB_OBJS)
	@rm -f $@
	@echo '  AR    $@'
	@ar rcs $@ $^

# jemalloc is linked dynamically here so that ASan's allocator keeps malloc.
$(BUILD)/asan/tests/%: $(BUILD)/asan/tests/%.o $(SUPPORT_C:%.c=$(BUILD)/asan/%.o) $(SUPPORT_CU:%.cu=$(BUILD)/obj/%.cu.o) $(BUILD)/asan/libfattn.a
	@mkdir -p $(dir $@)
	@echo '  LD    $@'
	@$(CC) $(ASAN_FLAGS) -o $@ $^ $(WRAP_FLAGS) $(JEMALLOC_LIBS) -ljemalloc -Wl,-Bstatic -lcheck -lsubunit -Wl,-Bdynamic $(CUDA_LIBS) $(SYS_LIBS)

asan: deps $(ASAN_TESTS)
	@ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=1 \
	 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 bash tests/run.sh $(ASAN_TESTS)

# ---- ThreadSanitizer over the threads suite: contexts on the CPU backend driven from two
# threads at once (host C code; jemalloc linked dynamically, as for ASan).
TSAN_FLAGS := -O1 -g -fsanitize=thread -fno-omit-frame-pointer
TSAN_LIB_OBJS := $(LIB_C:%.c=$(BUILD)/tsan/%.o) $(LIB_CU:%.cu=$(BUILD)/obj/%.cu.o)
ifneq ($(HOPPER_ARCHS),)
TSAN_LIB_OBJS += $(LIB_CU90:%.cu=$(BUILD)/obj/%.cu.o)
endif
TSAN_TESTS ?= $(BUILD)/tsan/tests/test_threads

$(BUILD)/tsan/%.o: %.c
	@mkdir -p $(dir $@)
	@echo '  CC    $< (tsan)'
	@$(CC) $(ALL_CFLAGS) $(TSAN_FLAGS) -c $< -o $@

$(BUILD)/tsan/libfattn.a: $(TSAN_LIB_OBJS)
	@rm -f $@
	@echo '  AR    $@'
	@ar rcs $@ $^

$(BUILD)/tsan/tests/%: $(BUILD)/tsan/tests/%.o $(SUPPORT_C:%.c=$(BUILD)/tsan/%.o) $(SUPPORT_CU:%.cu=$(BUILD)/obj/%.cu.o) $(BUILD)/tsan/libfattn.a
	@mkdir -p $(dir $@)
	@echo '  LD    $@'
	@$(CC) $(TSAN_FLAGS) -o $@ $^ $(WRAP_FLAGS) $(JEMALLOC_LIBS) -ljemalloc -Wl,-Bstatic -lcheck -lsubunit -Wl,-Bdynamic $(CUDA_LIBS) $(SYS_LIBS)

tsan: deps $(TSAN_TESTS)
	@TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 bash tests/run.sh $(TSAN_TESTS)

# ---- Install as a C library: the archive, the public header and a pkg-config file (static
# link: pkg-config --static --libs fattn). DESTDIR stages a package; uninstall removes the three.
FATTN_VERSION := $(shell for p in MAJOR MINOR PATCH; do \
  sed -n "s/^\#define FATTN_VERSION_$$p \([0-9]*\)$$/\1/p" include/fattn.h; done | paste -sd.)
INSTALLED := $(PREFIX)/lib/libfattn.a $(PREFIX)/include/fattn.h $(PREFIX)/lib/pkgconfig/fattn.pc

install: $(BUILD)/libfattn.a
	@install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	@install -m 644 $(BUILD)/libfattn.a $(DESTDIR)$(PREFIX)/lib/libfattn.a
	@install -m 644 include/fattn.h $(DESTDIR)$(PREFIX)/include/fattn.h
	@sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(FATTN_VERSION)|' -e 's|@CUDA_LIBDIR@|$(CUDA)/lib64|' \
	     -e 's|@JEMALLOC_LIBS@|$(JEMALLOC_LIBS)|' fattn.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/fattn.pc
	@chmod 644 $(DESTDIR)$(PREFIX)/lib/pkgconfig/fattn.pc
	@for f in $(INSTALLED); do echo "  INSTALL $(DESTDIR)$$f"; done

uninstall:
	@for f in $(INSTALLED); do echo "  RM    $(DESTDIR)$$f"; rm -f "$(DESTDIR)$$f"; done

# ---- libFuzzer harnesses (clang), then a replay of the committed corpora.
FUZZ_FLAGS := -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
FUZZ_LIB_OBJS := $(LIB_C:%.c=$(BUILD)/fuzzobj/%.o) $(LIB_CU:%.cu=$(BUILD)/obj/%.cu.o)
ifneq ($(HOPPER_ARCHS),)
FUZZ_LIB_OBJS += $(LIB_CU90:%.cu=$(BUILD)/obj/%.cu.o)
endif

$(BUILD)/fuzzobj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo '  CLANG $<'
	@$(CLANG) -std=c11 -D_GNU_SOURCE $(CWARN) $(INCLUDES) $(FUZZ_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/fuzz/%: $(BUILD)/fuzzobj/fuzz/%.o $(FUZZ_LIB_OBJS)
	@mkdir -p $(dir $@)
	@echo '  LD    $@'
	@$(CLANG) -fsanitize=fuzzer,address,undefined -o $@ $^ $(JEMALLOC_LIBS) -ljemalloc $(CUDA_LIBS) $(SYS_LIBS)

fuzz: deps $(FUZZERS:%=$(BUILD)/fuzz/%)
	@bash fuzz/run.sh $(FUZZ_SECONDS) $(FUZZERS)

fuzz-replay: deps $(FUZZERS:%=$(BUILD)/fuzz/%)
	@bash fuzz/run.sh 0 $(FUZZERS)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
