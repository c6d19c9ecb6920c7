# Driver of the install test (cmake -P). Variables: BUILD_DIR, PREFIX, CONSUMER_SOURCE_DIR,
# CONSUMER_BINARY_DIR, GENERATOR, BUILD_TYPE, CXX_COMPILER, COMPILER_LAUNCHER, Torch_DIR.
cmake_minimum_required(VERSION 3.18)

function(run step)
  message(STATUS "install test: ${step}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test: ${step} failed (${rc})")
  endif()
endfunction()

if(NOT BUILD_TYPE)
  set(BUILD_TYPE RelWithDebInfo)
endif()

# A fresh prefix and consumer build each time, so nothing stale is picked up.
file(REMOVE_RECURSE "${PREFIX}" "${CONSUMER_BINARY_DIR}")

run(install "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}" --config "${BUILD_TYPE}")

include("${CMAKE_CURRENT_LIST_DIR}/consumer_args.cmake")
tc_consumer_configure_args(configure_args "${CONSUMER_SOURCE_DIR}" "${CONSUMER_BINARY_DIR}")
run(configure "${CMAKE_COMMAND}" ${configure_args})
run(build "${CMAKE_COMMAND}" --build "${CONSUMER_BINARY_DIR}" --config "${BUILD_TYPE}")
run(run "${CONSUMER_BINARY_DIR}/consumer")
