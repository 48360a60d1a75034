# mnistcu: build, test, run.  `make help` lists the targets.
#
# Knobs (override on the command line, e.g. `make CC=clang OMP=`):
#   CC, CXX, CLANG      C, C++ and fuzzing compilers
#   OPT                 optimisation flags of the programs (not of the compile tests)
#   OMP                 OpenMP flag for the CPU backend ('' for none)
#   NVCC                CUDA compiler ('' to skip every CUDA build)
#   CUDA_ARCH           e.g. 90 for sm_90 (built as sm_90a); default: the local GPU, else CUDA_ARCHS (+ PTX)
#   MNISTCU_MIRROR      a folder or URL that `make data` fetches from first

CC      ?= cc
CXX     ?= c++
CLANG   ?= clang
OPT     ?= -O3 -march=native
OMP     ?= -fopenmp
WARN    := -Wall -Wextra -Werror -pedantic
NVCC    ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
CUDA_ARCH ?= $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
# With no GPU to ask: machine code for the common architectures CUDA 13 supports
# (Turing to Blackwell), PTX for compute_75 so the driver can compile it for any
# newer GPU, and PTX for compute_120. (-arch=all-major would leave out sm_75.)
CUDA_ARCHS ?= 75 80 86 89 90 100 120
# sm_90 is built as sm_90a, whose code runs on sm_90 GPUs only (as sm_90's does here) and which has Hopper's
# warp-group products (wgmma): TF32X3's faster kernel (mnistcu.h >>cuda_x3).
arch_a = $(if $(filter 90,$(1)),90a,$(1))
ifneq ($(strip $(CUDA_ARCH)),)
NVCC_ARCH := -gencode arch=compute_$(call arch_a,$(CUDA_ARCH)),code=[sm_$(call arch_a,$(CUDA_ARCH)),compute_$(call arch_a,$(CUDA_ARCH))]
else
NVCC_ARCH := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(call arch_a,$(a)),code=sm_$(call arch_a,$(a))) \
             -gencode arch=compute_75,code=compute_75 -gencode arch=compute_120,code=compute_120
endif
NVCC_WARN := -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror
# cuDNN for the optional path (MNISTCU_CUDNN): a folder with include/cudnn.h and lib/ or lib64/ holding
# libcudnn.so.9: the CUDA toolkit's, the system's, or the one inside PyTorch's nvidia-cudnn wheel.
CUDNN_DIR ?= $(shell for d in $(dir $(NVCC)).. /usr/local/cuda /usr; do [ -f $$d/include/cudnn.h ] && { echo $$d; exit 0; }; done; \
               python3 -c 'import nvidia.cudnn as c; print(list(c.__path__)[0])' 2>/dev/null)
CUDNN_FLAGS := $(if $(strip $(CUDNN_DIR)),-DMNISTCU_CUDNN -I$(CUDNN_DIR)/include)
CUDNN_LIBS := $(if $(strip $(CUDNN_DIR)),-L$(CUDNN_DIR)/lib -L$(CUDNN_DIR)/lib64 -l:libcudnn.so.9 \
              -Xlinker -rpath -Xlinker $(CUDNN_DIR)/lib -Xlinker -rpath -Xlinker $(CUDNN_DIR)/lib64)
comma := ,
NVCC_HOST := -Xcompiler -O3,-march=native$(if $(OMP),$(comma)$(OMP))

B := build
HDR := mnistcu.h
TEST_SRC := tests/test_main.c tests/test_idx.c tests/test_data_api.c tests/test_model.c tests/test_train.c tests/test_torch_fixtures.c \
            tests/test_layers.c tests/test_layer_fixtures.c tests/test_toolkit.c tests/test_files.c tests/test_images.c
TEST_HDR := tests/harness.h tests/asserts.h tests/test_util.h
# Tests read the datasets from the local mirror when make data has not run.
MNISTCU_MIRROR ?= $(wildcard ../shared/datasets)
export MNISTCU_MIRROR

.PHONY: all help data run test test-cpu test-cli test-compile test-harness test-fixtures test-interop test-gpu fuzz bench clean

all: $(B)/mnistcu $(B)/mnistcu-cpu $(B)/train_mnist $(B)/perceptron $(B)/regression
	@if [ -n "$(NVCC)" ]; then echo "CUDA: built with $(NVCC) ($(NVCC_ARCH))"; \
	 else echo "CUDA: nvcc not found, built the CPU backend only"; fi

help:
	@echo "make            build the CLI (build/mnistcu), the ten-line example, perceptron and regression"
	@echo "make run        fetch MNIST, build, train 784-128-10, print the test accuracy"
	@echo "make data       fetch and verify MNIST and Fashion-MNIST into data/"
	@echo "make test       CPU test suites, compile tests, fuzzing (what CI runs)"
	@echo "make test-gpu   the suites with CUDA parity tests and compute-sanitizer (needs a GPU);"
	@echo "                GPU_TESTS_PART=1|2 runs half of it, GPU_TESTS_JOBS=N the sanitizer runs N at a time"
	@echo "make fuzz       fuzz the IDX/gzip loader for FUZZ_SECONDS (default 30), spec strings for FUZZ_SPEC_SECONDS (15),"
	@echo "                model files for FUZZ_MODEL_SECONDS (15), images for FUZZ_IMAGE_SECONDS (15)"
	@echo "make bench      time our configurations against PyTorch and JAX (needs a GPU, PyTorch and JAX;"
	@echo "                knobs in bench/run.sh: CONFIGS, PEERS, PRECISIONS, PREBUILT=1, ...)"
	@echo "make clean      remove build/"

$(B):
	@mkdir -p $(B)

# ---- programs ----------------------------------------------------------------
$(B)/mnistcu-cpu: examples/mnistcu_cli.c $(HDR) | $(B)
	$(CC) -std=c99 $(WARN) $(OPT) $(OMP) -o $@ examples/mnistcu_cli.c -lm

ifneq ($(strip $(NVCC)),)
$(B)/mnistcu: examples/mnistcu_cli.c $(HDR) | $(B)
	$(NVCC) -x cu -std=c++17 $(NVCC_ARCH) $(NVCC_WARN) $(NVCC_HOST) -o $@ examples/mnistcu_cli.c $(if $(OMP),-Xcompiler $(OMP) -lgomp)
$(B)/train_mnist_cuda: examples/train_mnist.cu $(HDR) | $(B)
	$(NVCC) $(NVCC_ARCH) -o $@ examples/train_mnist.cu
else
$(B)/mnistcu: $(B)/mnistcu-cpu
	cp $< $@
endif

$(B)/train_mnist: examples/train_mnist.cu $(HDR) | $(B)
	$(CC) -x c $(OPT) $(OMP) -o $@ examples/train_mnist.cu -lm

# The two small examples: with nvcc they run on the GPU (and regression times both devices).
ifneq ($(strip $(NVCC)),)
$(B)/perceptron: examples/perceptron.c $(HDR) | $(B)
	$(NVCC) -x cu -std=c++17 $(NVCC_ARCH) $(NVCC_WARN) $(NVCC_HOST) -o $@ examples/perceptron.c $(if $(OMP),-lgomp)
$(B)/regression: examples/regression.c $(HDR) | $(B)
	$(NVCC) -x cu -std=c++17 $(NVCC_ARCH) $(NVCC_WARN) $(NVCC_HOST) -o $@ examples/regression.c $(if $(OMP),-lgomp)
else
$(B)/perceptron: examples/perceptron.c $(HDR) | $(B)
	$(CC) -std=c99 $(WARN) $(OPT) $(OMP) -o $@ examples/perceptron.c -lm
$(B)/regression: examples/regression.c $(HDR) | $(B)
	$(CC) -std=c99 $(WARN) $(OPT) $(OMP) -o $@ examples/regression.c -lm
endif

# ---- data and the main job ------------------------------------------------------
data:
	sh data/fetch.sh

# SGD with momentum: 97.97-98.03% over seeds 1-3 on the CPU, where plain SGD at
# 0.1 ranged from 97.25% to 98.04% (bench/RESULTS.md).
run: data $(B)/mnistcu
	$(B)/mnistcu train --data data --dataset mnist --layers 784-128-10 --epochs 10 --momentum 0.9 --lr 0.01

# ---- tests --------------------------------------------------------------------
PYTHON_TORCH ?= /usr/bin/python3
test: test-harness test-compile test-cpu test-cli test-fixtures test-interop fuzz
	@echo "make test: all passed"

# The committed PyTorch fixtures are reproduced by their scripts (with the PyTorch
# here: Debian's python3-torch 1.13 on the CPU; they were written with 2.11).
test-fixtures:
	@if $(PYTHON_TORCH) -c 'import torch, numpy' >/dev/null 2>&1; then \
	  $(PYTHON_TORCH) tests/make_optim_fixtures.py --check && \
	  $(PYTHON_TORCH) tests/make_loss_fixtures.py --check && \
	  $(PYTHON_TORCH) -W ignore tests/make_schedule_fixtures.py --check; \
	else echo "PyTorch not found under $(PYTHON_TORCH): fixture reproduction skipped"; fi

$(B)/tests: $(TEST_SRC) $(TEST_HDR) $(HDR) | $(B)
	$(CC) -std=c99 $(WARN) -O2 -march=native $(OMP) -o $@ $(TEST_SRC) -lz -lm

test-cpu: $(B)/tests
	sh data/fetch.sh mnist
	MNISTCU_DEVICE=cpu $(B)/tests

test-cli: $(B)/mnistcu-cpu
	sh data/fetch.sh mnist
	sh tests/cli_test.sh $(B)/mnistcu-cpu

# Model files across frameworks: PyTorch (strict load, the same logits), ONNX Runtime.
test-interop: $(B)/mnistcu-cpu
	sh data/fetch.sh mnist
	PYTHON_TORCH=$(PYTHON_TORCH) sh tests/interop_test.sh $(B)/mnistcu-cpu data

test-harness: | $(B)
	$(CC) -std=c99 $(WARN) -o $(B)/harness_selftest tests/test_harness_selftest.c tests/test_harness_selftest2.c
	sh tests/harness_selftest.sh $(B)/harness_selftest

# The header must compile cleanly in every way a user may include it.
test-compile: | $(B)
	$(CC) -std=c99 $(WARN) -fsyntax-only tests/compile/impl.c
	$(CLANG) -std=c99 $(WARN) -fsyntax-only tests/compile/impl.c
	$(CXX) -std=c++17 $(WARN) -x c++ -fsyntax-only tests/compile/impl.c
	$(CC) -std=c99 $(WARN) -Wunused-function -DMNISTCU_STATIC -fsyntax-only tests/compile/impl.c
	$(CC) -std=c99 $(WARN) $(OMP) -fsyntax-only tests/compile/impl.c
ifeq ($(shell uname -m),x86_64)
	$(CC) -std=c99 $(WARN) -mavx -fsyntax-only tests/compile/impl.c
	$(CXX) -std=c++17 $(WARN) -mavx -x c++ -fsyntax-only tests/compile/impl.c
endif
# the CPU products' tests with the packing's plain loops (make test-cpu's build takes AVX's where it has it)
	$(CC) -std=c99 $(WARN) -O2 -march=native -DMNISTCU_NO_AVX $(OMP) -o $(B)/tests_noavx $(TEST_SRC) -lz -lm && \
	    $(B)/tests_noavx -t cpu_
	$(CC) -std=c99 $(WARN) -o $(B)/two_units tests/compile/unit_a.c tests/compile/unit_b.c -lm && $(B)/two_units
	$(CC) -x c $(WARN) -o $(B)/train_mnist_c examples/train_mnist.cu -lm
	$(CC) -std=c99 $(WARN) -O2 -o $(B)/perceptron_c examples/perceptron.c -lm && $(B)/perceptron_c
	$(CC) -std=c99 $(WARN) -O2 -o $(B)/regression_c examples/regression.c -lm
	@lines=$$(grep -v '^\s*$$' examples/train_mnist.cu | grep -v '^\s*//' | grep -v '^\s*/\*' | grep -v '^\s*\*' | wc -l); \
	 echo "examples/train_mnist.cu: $$lines lines of code"; test $$lines -le 10
ifneq ($(strip $(NVCC)),)
	$(NVCC) -x cu -std=c++17 -arch=sm_75 $(NVCC_WARN) -c -o $(B)/impl_cuda.o tests/compile/impl.c
	$(NVCC) -x cu -std=c++17 -arch=sm_75 $(NVCC_WARN) -DMNISTCU_CUBLAS -c -o $(B)/impl_cublas.o tests/compile/impl.c
	$(NVCC) -x cu -std=c++17 -arch=sm_75 $(NVCC_WARN) -DMNISTCU_DEBUG_SYNC -DMNISTCU_STATIC -c -o $(B)/impl_debug.o tests/compile/impl.c
	$(if $(strip $(CUDNN_DIR)),$(NVCC) -x cu -std=c++17 -arch=sm_75 $(NVCC_WARN) $(CUDNN_FLAGS) -DMNISTCU_CUBLAS -c -o $(B)/impl_cudnn.o tests/compile/impl.c,@echo "cuDNN not found: the MNISTCU_CUDNN compile test is skipped")
	$(NVCC) -arch=sm_75 -o $(B)/train_mnist_nvcc examples/train_mnist.cu
	$(NVCC) -x cu -std=c++17 -arch=sm_75 $(NVCC_WARN) -c -o $(B)/perceptron_cuda.o examples/perceptron.c
	$(NVCC) -x cu -std=c++17 -arch=sm_75 $(NVCC_WARN) -c -o $(B)/regression_cuda.o examples/regression.c
else
	@echo "nvcc not found: CUDA compile tests skipped"
endif

FUZZ_SECONDS ?= 30
FUZZ_SPEC_SECONDS ?= 15
FUZZ_MODEL_SECONDS ?= 15
FUZZ_IMAGE_SECONDS ?= 15
fuzz: | $(B)
	@if echo 'int LLVMFuzzerTestOneInput(const char*d,unsigned long n){(void)d;(void)n;return 0;}' | \
	    $(CLANG) -fsanitize=fuzzer -x c -o $(B)/fuzz_probe - >/dev/null 2>&1; then \
	  $(CLANG) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -o $(B)/fuzz_idx tests/fuzz_idx.c && \
	  rm -rf $(B)/fuzz-corpus && mkdir -p $(B)/fuzz-corpus && sh tests/make_fuzz_corpus.sh $(B)/fuzz-corpus && \
	  $(B)/fuzz_idx -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -print_final_stats=1 $(B)/fuzz-corpus && \
	  $(CLANG) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -o $(B)/fuzz_spec tests/fuzz_spec.c && \
	  rm -rf $(B)/spec-corpus && sh tests/make_fuzz_corpus.sh --spec $(B)/spec-corpus && \
	  $(B)/fuzz_spec -max_total_time=$(FUZZ_SPEC_SECONDS) -rss_limit_mb=2048 -print_final_stats=1 $(B)/spec-corpus && \
	  $(CLANG) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -o $(B)/fuzz_model tests/fuzz_model.c -lm && \
	  rm -rf $(B)/model-corpus && mkdir -p $(B)/model-corpus && cp tests/fixtures/safetensors/*.safetensors $(B)/model-corpus && \
	  $(B)/fuzz_model -max_total_time=$(FUZZ_MODEL_SECONDS) -rss_limit_mb=2048 -print_final_stats=1 $(B)/model-corpus && \
	  $(CLANG) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -o $(B)/fuzz_image tests/fuzz_image.c -lm && \
	  rm -rf $(B)/image-corpus && mkdir -p $(B)/image-corpus && \
	  cp tests/fixtures/images/*.png tests/fixtures/images/*.pgm $(B)/image-corpus && \
	  $(B)/fuzz_image -max_total_time=$(FUZZ_IMAGE_SECONDS) -rss_limit_mb=2048 -print_final_stats=1 $(B)/image-corpus; \
	else echo "clang with libFuzzer not found: fuzzing skipped"; fi

# ---- GPU ------------------------------------------------------------------------
# The CUDA parity suite (tests/test_cuda.h) is compiled into test_main.c, which holds the implementation.
$(B)/tests-cuda: $(TEST_SRC) tests/test_cuda.h $(TEST_HDR) $(HDR) | $(B)
	$(NVCC) -x cu -std=c++17 $(NVCC_ARCH) $(NVCC_WARN) -lineinfo $(NVCC_HOST) -DMNISTCU_CUBLAS $(CUDNN_FLAGS) -o $@ \
	  $(TEST_SRC) -lcublas $(CUDNN_LIBS) -lz $(if $(OMP),-Xcompiler $(OMP) -lgomp)

# GPU_TESTS_PART=1|2: half of it (tests/run_gpu_tests.sh says which); GPU_TESTS_JOBS=N: N sanitizer runs at a time
GPU_TESTS_JOBS ?= 1
test-gpu: $(B)/tests-cuda $(B)/train_mnist_cuda $(B)/perceptron $(B)/regression
	GPU_TESTS_JOBS=$(GPU_TESTS_JOBS) sh tests/run_gpu_tests.sh $(B) $(GPU_TESTS_PART)

bench:
	sh bench/run.sh

clean:
	rm -rf $(B)
