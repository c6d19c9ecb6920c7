# Configure, build and run test_runtime's concurrency tests (and test_dynamic's concurrent calls
# of one dynamic entry, test_frontend's of one TorchScript module, test_package's of one loaded
# package, test_precision's of one int8 model, test_distributed's DistributedDataParallel in one
# process: the Reducer's autograd hooks, Gloo's threads completing all-reduces, the watchdog)
# with ThreadSanitizer.
# LibTorch itself is not instrumented; OpenMP is limited to one thread so its uninstrumented
# pool does not appear as a race, and the project's own synchronization is what is checked.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${BINARY_DIR} -G ${GENERATOR}
                        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}
                        -DTORCHCOMPILE_SANITIZE=thread -DTORCHCOMPILE_BUILD_EXAMPLES=OFF
                        -DTORCHCOMPILE_BUILD_BENCHMARKS=OFF
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tsan: configure failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --target test_runtime test_dynamic test_frontend test_package package_loader test_precision test_distributed RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tsan: build failed")
endif()
set(ENV{OMP_NUM_THREADS} 1)
set(ENV{TORCHCOMPILE_STRESS_CALLS} 200)
# Races inside LibTorch (not instrumented) that are not ours: test/tsan/suppressions.txt.
set(ENV{TSAN_OPTIONS} "halt_on_error=1 second_deadlock_stack=1 suppressions=${SOURCE_DIR}/test/tsan/suppressions.txt")
execute_process(COMMAND ${BINARY_DIR}/test/test_runtime --gtest_filter=Threads.*:GraphBreaks.* RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tsan: test_runtime failed under ThreadSanitizer (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/test/test_dynamic --gtest_filter=Dynamic.Concurrent* RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tsan: test_dynamic failed under ThreadSanitizer (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/test/test_frontend --gtest_filter=ScriptModule.FourThreadsAtOnce RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tsan: test_frontend (a TorchScript module called from four threads) failed under ThreadSanitizer (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/test/test_package --gtest_filter=Package.FourThreadsAtOnce RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tsan: test_package (a loaded package called from four threads) failed under ThreadSanitizer (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/test/test_precision --gtest_filter=Precision.FourThreadsAtOnce RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tsan: test_precision (an int8 model called from four threads) failed under ThreadSanitizer (exit ${rc})")
endif()
execute_process(COMMAND ${BINARY_DIR}/test/test_distributed --gtest_filter=*DdpSingleProcess.* RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tsan: test_distributed (DistributedDataParallel in one process) failed under ThreadSanitizer (exit ${rc})")
endif()
