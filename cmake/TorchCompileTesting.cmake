# What every test target of the project builds with, defined before src/ and backends/ so that a
# backend's own CMakeLists.txt can add its tests (backends/<name>/tests/) next to its code.
find_package(GTest REQUIRED)
include(GoogleTest)

# One precompiled header (torch/torch.h + gtest) shared by every test target, and the helpers of
# test/support/ (tensors_close, error_of, ScopedEnv, small graphs), reached as "support/..." and
# "ir/ir_test_graphs.h"; examples/models.h as "examples/models.h".
add_library(tc_test_support STATIC ${PROJECT_SOURCE_DIR}/test/support/test_main.cpp
                                   ${PROJECT_SOURCE_DIR}/test/support/test_util.cpp)
target_link_libraries(tc_test_support PUBLIC torchcompile GTest::gtest GTest::gmock)
target_include_directories(tc_test_support PUBLIC ${PROJECT_SOURCE_DIR}/test ${PROJECT_SOURCE_DIR})
target_precompile_headers(tc_test_support PUBLIC ${PROJECT_SOURCE_DIR}/test/support/pch.h)
# The PCH is only reused when the flags match: a static library would get -fPIC and the test
# executables -fPIE (CMAKE_POSITION_INDEPENDENT_CODE is ON), so gcc would ignore the PCH.
set_target_properties(tc_test_support PROPERTIES POSITION_INDEPENDENT_CODE OFF)

# tc_add_test(<name> <label> <sources...>): one gtest executable, each TEST a CTest test. Every
# test runs with TORCHCOMPILE_VERIFY_TEXT=1: each graph with size symbols handed to a backend
# must round-trip through the text format and compute the same after parsing.
function(tc_add_test name label)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE tc_test_support)
  target_precompile_headers(${name} REUSE_FROM tc_test_support)
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 PROPERTIES LABELS "${label}"
                       ENVIRONMENT "TORCHCOMPILE_TEST_BINARY_DIR=${PROJECT_BINARY_DIR};TORCHCOMPILE_VERIFY_TEXT=1")
endfunction()
