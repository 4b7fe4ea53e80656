# Build switches (combine freely):
#   MPI=1          ranks are Open MPI processes (./run uses mpirun); default: threads
#   GPU=1          CUDA kernels + cuBLAS + NCCL from $(CUDA_HOME)
#   DEBUG=1        -O0 -g
#   SAN=address    AddressSanitizer + UBSan;  SAN=thread  ThreadSanitizer;
#   SAN=undefined  UBSan alone
#   O=name         a separate build folder (build/<variant>-name), for parallel builds
#   MATMUL=onednn  the fp32 linears on oneDNN unless --matmul says otherwise (default
#                  openblas: common/tensor/matmul_engine.h says why)
# Targets: all, baseline, chapterN, check, test, bench, clean.

CC        ?= gcc
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
# Extra include / library paths, e.g. for OpenBLAS unpacked from .debs on a GPU box.
EXTRA_CFLAGS  ?=
EXTRA_LDFLAGS ?=

# Install (as root) or name the missing Debian packages before any flags are computed
# from pkg-config, so that a fresh machine needs nothing but `make`.
DEPS_STAMP := build/.deps-ok
ifeq ($(wildcard $(DEPS_STAMP)),)
  ifneq ($(MAKECMDGOALS),clean)
    deps_status := $(shell tools/ensure-deps >&2 && mkdir -p build && touch $(DEPS_STAMP) && echo ok)
    ifneq ($(deps_status),ok)
      $(error build dependencies are missing (see above))
    endif
  endif
endif

variant := cpu$(if $(MPI),-mpi)$(if $(GPU),-gpu)$(if $(DEBUG),-debug)$(if $(SAN),-$(SAN))
BUILD   := build/$(variant)$(if $(O),-$(O))

PKGS     := openblas check
# -fno-math-errno: no maths function here reports through errno, and without it sqrtf()
# cannot become the vector instruction (the same correctly rounded result)
# common/ by concern, bottom to top: base, tensor ops and devices, the communicator, the
# model, a run's configuration, checkpoints, training and reports, the strategies (a
# folder a dimension, then where they compose), the planner, the command line. Each
# folder includes only from the folders below it.
parallel_dirs := mesh dp tp cp ep pp compose
common_dirs := base tensor comm model config checkpoint train \
               $(parallel_dirs:%=parallel/%) plan cli
common_includes := $(common_dirs:%=-Icommon/%)
CFLAGS   := -std=c11 -D_GNU_SOURCE -fno-math-errno -Wall -Wextra -Werror -pthread \
            $(common_includes) \
            $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(EXTRA_CFLAGS)
# oneDNN (Debian's libdnnl-dev ships no .pc file): 16-bit matmuls (common/tensor/
# matmul16.c). It runs on the OpenMP runtime, which matmul16 keeps to one thread per
# calling thread (omp_set_num_threads(1) there: one core per rank); -lgomp for that call.
DNNL_LIBS := -ldnnl -lgomp
# The linker: gold where it links this toolchain's programs (binutils' other linker),
# else the default. make test links about 270 programs (every suite and program in six
# builds): GNU ld took 0.45 CPU-seconds a link here, 8% of make test's CPU time, and gold
# takes 0.12. The probe links a program, with libstdc++ in a GPU build: a gcc installed
# beside the system's binutils can leave a libstdc++.so that gold cannot open where
# GNU ld searches on (seen on a GPU machine with gcc 13 under /opt).
FUSE_LD  := $(shell t=$$(mktemp) && echo 'int main(void) { return 0; }' | \
              $(CC) -fuse-ld=gold -x c - -o $$t $(if $(GPU),-lstdc++) >/dev/null 2>&1; \
              s=$$?; rm -f $$t; [ $$s = 0 ] && echo -fuse-ld=gold)
LDLIBS   := $(FUSE_LD) $(shell pkg-config --libs openblas 2>/dev/null) $(DNNL_LIBS) -lm \
            -pthread $(EXTRA_LDFLAGS)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)

# A sanitizer build compiles at -O1, as the sanitizers' own documentation advises: its
# instrumented code compiled at -O3 took 1.6 times as long to build (the largest part
# of make test's builds) and ran its suites only 10% faster. Its debug information is
# -g1's: the line tables a report's stack names file:line with, without the variables
# (DEBUG=1 is the build for a debugger), which took a quarter of its compile time.
ifdef DEBUG
  CFLAGS += -O0 -g
else ifneq ($(SAN),)
  CFLAGS += -O1 -march=native -g1
else
  # 512-bit vectors where the CPU has them (GCC prefers 256 by default): the element-wise
  # loops give the same bits at any width, and bench256's bf16 step on an AVX-512 CPU
  # took 32.4 against 36.8 ms (GELU 3.7 against 5.0, the residual adds half); no change
  # where there is no AVX-512
  CFLAGS += -O3 -march=native -mprefer-vector-width=512 -g
endif
ifeq ($(SAN),address)
  CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDLIBS += -fsanitize=address,undefined
else ifeq ($(SAN),thread)
  CFLAGS += -fsanitize=thread
  LDLIBS += -fsanitize=thread
else ifeq ($(SAN),undefined)
  CFLAGS += -fsanitize=undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDLIBS += -fsanitize=undefined
else ifneq ($(SAN),)
  # a misspelt value would otherwise build without any sanitizer, silently
  $(error SAN=$(SAN): unknown sanitizer (valid: address, thread, undefined))
endif

common_src := $(filter-out common/comm/comm_mpi%.c common/tensor/device_cpu.c,$(wildcard $(common_dirs:%=common/%/*.c)))
# variant_cflags: what MPI=1 and GPU=1 add to the compile of the sources they change
# (tools/variant-sources); every other object is shared with the plain variant (below)
variant_cflags :=
ifdef MPI
  variant_cflags += -DUSE_MPI $(shell pkg-config --cflags ompi-c 2>/dev/null)
  LDLIBS += $(shell pkg-config --libs ompi-c 2>/dev/null)
  common_src += $(wildcard common/comm/comm_mpi*.c)
endif
ifdef GPU
  variant_cflags += -DUSE_CUDA -I$(CUDA_HOME)/include -Igpu
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lcublas -lcudart -lstdc++
  NVCCFLAGS := -O3 -std=c++17 $(common_includes) -Igpu -gencode arch=compute_90,code=sm_90 \
               -gencode arch=compute_90,code=compute_90 $(if $(MPI),-DUSE_MPI)
  common_src += $(wildcard gpu/*.c)
  cuda_src   := $(wildcard gpu/*.cu)
else
  common_src += common/tensor/device_cpu.c
  cuda_src   :=
endif

# Objects shared between variants. MPI=1 and GPU=1 change only the sources that name
# USE_MPI or USE_CUDA or include a header that does (tools/variant-sources: the
# communicator, the GPU backend); every other source compiles to the same object with or
# without them, so an MPI or GPU build links the plain variant's object (build/cpu,
# build/cpu-address, ...) rather than compiling the whole tree again, and builds that
# object there if it is missing. obj_of turns sources into the objects this build links.
plain_build := build/cpu$(if $(DEBUG),-debug)$(if $(SAN),-$(SAN))$(if $(O),-$(O))
ifneq ($(plain_build),$(BUILD))
  variant_src := $(shell tools/variant-sources $(wildcard common/*/*.c common/*/*/*.c \
                                     chapters/*/*.c tests/*.c bench/*.c gpu/*.c))
endif
# MATMUL=openblas|onednn: the engine of the fp32 linears' products when --matmul is not
# given (common/tensor/matmul_engine.h). Only matmul_engine.o sees it; a file holding the
# value, rewritten when it changes, rebuilds that object.
MATMUL ?= openblas
ifeq ($(filter $(MATMUL),openblas onednn),)
  $(error MATMUL=$(MATMUL): unknown fp32 matmul engine (valid: openblas, onednn))
endif
matmul_stamp := $(plain_build)/matmul-engine
ifneq ($(MAKECMDGOALS),clean)
  $(shell mkdir -p $(plain_build) && { [ "$$(cat $(matmul_stamp) 2>/dev/null)" = $(MATMUL) ] || \
      echo $(MATMUL) > $(matmul_stamp); })
endif
$(plain_build)/obj/common/tensor/matmul_engine.o: CFLAGS += \
    -DMATMUL_DEFAULT_ONEDNN=$(if $(filter onednn,$(MATMUL)),1,0)
$(plain_build)/obj/common/tensor/matmul_engine.o: $(matmul_stamp)

# make compares times, never commands: a tree built before a flag changed (a new -O or
# -m flag here, EXTRA_CFLAGS, another compiler) would keep its old objects. So each build
# folder holds the compile command of its objects in a file (cflags), rewritten only when
# the command changes, and every object depends on it; every program depends on its
# folder's link flags (ldflags) the same way. The plain folder's cflags holds only what
# every variant compiles the shared objects with, so that variants never rewrite it.
# $(call remember,FILE,VAR): FILE holds VAR's value, rewritten only when that changes.
define remember
ifneq ($$(file <$(1)),$$($(2)))
  $$(shell mkdir -p $(dir $(1)))
  $$(file >$(1),$$($(2)))
endif
endef
plain_flags := $(plain_build)/cflags
plain_compile := $(CC) $(CFLAGS)
build_link := $(CC) $(LDLIBS) $(CHECK_LIBS)
build_compile := $(plain_compile) $(variant_cflags) $(NVCC) $(NVCCFLAGS)
ifneq ($(MAKECMDGOALS),clean)
  $(eval $(call remember,$(plain_flags),plain_compile))
  $(eval $(call remember,$(BUILD)/ldflags,build_link))
  ifneq ($(plain_build),$(BUILD))
    $(eval $(call remember,$(BUILD)/cflags,build_compile))
  endif
endif
obj_of = $(foreach s,$(1),$(if $(filter $(variant_src) gpu/% %.cu,$(s)),$(BUILD),$(plain_build))/obj/$(basename $(s)).o)
common_obj := $(call obj_of,$(common_src) $(cuda_src))

.PHONY: all baseline test bench clean deps
.SECONDARY:
.SECONDEXPANSION:

chapter_dirs := $(filter-out chapters/00-%,$(wildcard chapters/0* chapters/1*))
# a folder builds its program once it has a main.c (a chapter's parts may come first)
chapter_dirs := $(foreach dir,$(chapter_dirs),$(if $(wildcard $(dir)/main.c),$(dir)))
chapter_number = $(patsubst chapters/%,%,$(patsubst chapters/0%,%,$(firstword $(subst -, ,$(1)))))
all: baseline $(foreach dir,$(chapter_dirs),chapter$(call chapter_number,$(dir)))

deps: $(DEPS_STAMP)
$(DEPS_STAMP): tools/ensure-deps
	@tools/ensure-deps
	@mkdir -p build && touch $@

# An object is written under a temporary name and renamed: two builds that share it (a
# plain and an MPI build at once) never link a half-written file.
compile = $(CC) $(1) -MMD -MP -MT $@ -MF $@.$$$$.d -c $< -o $@.$$$$.tmp && \
    mv -f $@.$$$$.d $(@:.o=.d) && mv -f $@.$$$$.tmp $@ || { rm -f $@.$$$$.*; exit 1; }
# ... and so is a program: a suite never starts one half linked by another build
link = $(CC) $(filter %.o,$(1)) -o $@.$$$$.tmp $(2) && mv -f $@.$$$$.tmp $@ || { rm -f $@.$$$$.tmp; exit 1; }
$(BUILD)/obj/%.o: %.c $(BUILD)/cflags | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(call compile,$(CFLAGS) $(variant_cflags))
ifneq ($(plain_build),$(BUILD))
$(plain_build)/obj/%.o: %.c $(plain_flags) | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(call compile,$(CFLAGS))
endif

$(BUILD)/obj/%.o: %.cu $(BUILD)/cflags | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

-include $(shell find build -name '*.d' 2>/dev/null)

# Chapter N's folder (chapters/0N-* or, from 10, chapters/N-*), and its strategy code
# (every .c but main.c) as objects.
chapter_dir = $(wildcard chapters/0$(1)-* chapters/$(1)-*)
chapter_objs = $(if $(1),$(call obj_of,$(filter-out %/main.c,$(wildcard $(addsuffix /*.c,$(call chapter_dir,$(1)))))))
# The chapter a test suite named test_chapterN*.c (or test_mpi_chapterN*.c) belongs to.
chapter_of = $(shell echo $(1) | sed -n 's/.*test_\(mpi_\)\{0,1\}chapter\([0-9][0-9]*\).*/\2/p')

# ---- programs: a chapter is every .c file in its folder, linked with common/ ----------
# `make chapterN` builds chapters/0N-*/ into $(BUILD)/chapterN and records it for ./run.
# A chapter links no other chapter's code: strategies live in common/parallel/.
define program
$(BUILD)/$(1): $$(call obj_of,$$(wildcard $(2)/*.c)) $$(common_obj) $(BUILD)/ldflags
	$$(call link,$$^,$$(LDLIBS))
.PHONY: $(1)
$(1): $(BUILD)/$(1)
	@printf '%s\n%s\n' "$(BUILD)/$(1)" "$(if $(MPI),mpi,threads)" > build/last
	@echo "built $(BUILD)/$(1)  (run it: ./run N [flags])"
endef
$(eval $(call program,baseline,chapters/00-baseline))
$(foreach dir,$(chapter_dirs),$(eval $(call program,chapter$(call chapter_number,$(dir)),$(dir))))

# ---- tests -------------------------------------------------------------------------
# tests/test_*.c are Check suites; test_mpi_*.c need MPI=1 and run under mpirun.
test_src := $(filter-out tests/test_mpi_%,$(wildcard tests/test_*.c))
ifdef MPI
  test_src += $(wildcard tests/test_mpi_*.c)
endif
test_helpers := $(filter-out tests/test_%,$(wildcard tests/*.c))
test_bins := $(test_src:tests/%.c=$(BUILD)/tests/%)

# A suite named test_chapterN*.c (or test_mpi_chapterN*.c) also links chapter N's
# strategy code: every .c of chapters/0N-*/ except main.c.
define test_program
$(BUILD)/tests/$(1): $(call obj_of,tests/$(1).c $(test_helpers)) $(call chapter_objs,$(call chapter_of,$(1))) $$(common_obj) $(BUILD)/ldflags
	@mkdir -p $$(dir $$@)
	$$(call link,$$^,$$(LDLIBS) $$(CHECK_LIBS))
endef
$(foreach t,$(test_src:tests/%.c=%),$(eval $(call test_program,$(t))))
# ... and sees that chapter's headers by name (#include "dp.h").
$(foreach t,$(test_src:tests/%.c=%),$(if $(call chapter_of,$(t)),$(eval \
  $(call obj_of,tests/$(t).c): CFLAGS += -I$(call chapter_dir,$(call chapter_of,$(t))))))

.PHONY: tests
# Some suites run the programs of their own build when it has them (test_chapter6): the
# programs this build already has are brought up to date with the suites.
tests: $(test_bins) $(wildcard $(BUILD)/baseline $(BUILD)/chapter[0-9] $(BUILD)/chapter[0-9][0-9])

# make test: every suite, threads and MPI, plus the programs' command-line checks.
test: | $(DEPS_STAMP)
	@tools/run-tests

# make check: each chapter against the single-device baseline (threads), under 2 minutes.
.PHONY: check
check: | $(DEPS_STAMP)
	@tools/run-check

# ---- benchmarks: bench/*.c, each linked with common/ --------------------------------
bench_bins := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))
$(BUILD)/bench/%: $$(call obj_of,bench/$$*.c) $$(common_obj) $(BUILD)/ldflags
	@mkdir -p $(dir $@)
	$(call link,$^,$(LDLIBS))
.PHONY: benches
benches: $(bench_bins)

bench: | $(DEPS_STAMP)
	@tools/run-bench

# ---- fuzzing: fuzz/*.c are libFuzzer targets over the parsers (clang; `make fuzz
# SAN=address` adds AddressSanitizer + UBSan) ------------------------------------------
fuzz_sources := common/base/json.c common/checkpoint/safetensors.c common/base/crc32.c
fuzz_bins := $(patsubst fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard fuzz/*.c))
$(BUILD)/fuzz/%: fuzz/%.c $(fuzz_sources)
	@mkdir -p $(dir $@)
	clang -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -O1 $(common_includes) \
	    -fsanitize=fuzzer$(if $(filter address,$(SAN)),$(comma)address$(comma)undefined -fno-sanitize-recover=undefined) $^ -o $@
comma := ,
.PHONY: fuzz
fuzz: $(fuzz_bins)

clean:
	rm -rf build
