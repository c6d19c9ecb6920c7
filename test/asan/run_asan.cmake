# Configure, build and run test_runtime (graph breaks, fuzzing, parity, signatures), test_aot, test_dynamic,
# test_repro, the onednn backend's tests (test_onednn, backends/onednn/tests/), test_frontend (TorchScript
# modules), test_capture's fast-path operator test, test_package (packages saved and loaded, and
# the loader fuzzed with 10,000 mutated packages), test_precision (the int8 / bfloat16 kernels) and
# test_optimizer (the compiled optimizer step's loops) with AddressSanitizer and UndefinedBehaviorSanitizer. Any UB report aborts the run, and the
# vptr check is off (see TORCHCOMPILE_SANITIZE in the top-level CMakeLists.txt).
#
# LibTorch itself is not instrumented: its allocations are still checked through ASan's malloc
# interceptors, but leak detection would report LibTorch's process-lifetime caches (and the
# registries of statically initialized operators), and the ODR checker can see globals
# defined both in the instrumented library and in LibTorch's headers, so both are off.
# Container-overflow annotations are only meaningful when every user of a container is
# instrumented, so that check is off too.
foreach(var SOURCE_DIR BINARY_DIR GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "asan: run with -D${var}=... (see test/asan/CMakeLists.txt)")
  endif()
endforeach()

execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${BINARY_DIR} -G ${GENERATOR}
                        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}
                        -DTORCHCOMPILE_SANITIZE=address,undefined
                        -DTORCHCOMPILE_BUILD_EXAMPLES=OFF
                        -DTORCHCOMPILE_BUILD_BENCHMARKS=OFF
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: configure failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --target test_runtime test_aot test_dynamic test_repro test_onednn test_frontend test_capture test_package package_loader test_precision test_optimizer RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: build failed")
endif()

set(ENV{ASAN_OPTIONS}
    "detect_leaks=0:detect_odr_violation=0:detect_container_overflow=0:halt_on_error=1:abort_on_error=0:print_summary=1")
set(ENV{UBSAN_OPTIONS} "print_stacktrace=1:halt_on_error=1")

# The parametrized suites are named Backends/Parity, Backends/Fuzz, ...: hence the leading '*'.
execute_process(COMMAND ${BINARY_DIR}/test/test_runtime "--gtest_filter=*GraphBreaks*:*BreakDefects*:*Fuzz*:*Parity*:Signatures*"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: test_runtime failed under AddressSanitizer/UBSan (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/test/test_aot RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: test_aot failed under AddressSanitizer/UBSan (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/test/test_dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: test_dynamic failed under AddressSanitizer/UBSan (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/test/test_repro RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: test_repro failed under AddressSanitizer/UBSan (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/backends/onednn/test_onednn RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: the onednn tests failed under AddressSanitizer/UBSan (exit ${rc})")
endif()
# TorchScript modules, and the fast-path operators traced as their parts.
execute_process(COMMAND ${BINARY_DIR}/test/test_frontend RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: test_frontend failed under AddressSanitizer/UBSan (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/test/test_capture --gtest_filter=Tracer.FastPath* RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: test_capture failed under AddressSanitizer/UBSan (exit ${rc})")
endif()
# Packages: save, load, a second process (package_loader, also instrumented), and the loader fuzzed.
execute_process(COMMAND ${BINARY_DIR}/test/test_package RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: test_package failed under AddressSanitizer/UBSan (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/test/test_precision RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: test_precision failed under AddressSanitizer/UBSan (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/test/test_optimizer RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asan: test_optimizer failed under AddressSanitizer/UBSan (exit ${rc})")
endif()
