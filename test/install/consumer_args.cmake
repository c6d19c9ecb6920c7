# Included by the install and repro-program drivers: the arguments that configure an outside
# project against the installed prefix with this build's compiler, launcher and LibTorch.
# Reads GENERATOR, BUILD_TYPE, PREFIX, CXX_COMPILER, COMPILER_LAUNCHER, Torch_DIR.
function(tc_consumer_configure_args out source_dir binary_dir)
  set(args -S "${source_dir}" -B "${binary_dir}" -G "${GENERATOR}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
      "-DCMAKE_PREFIX_PATH=${PREFIX}")
  if(CXX_COMPILER)
    list(APPEND args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
  endif()
  if(COMPILER_LAUNCHER)
    list(APPEND args "-DCMAKE_CXX_COMPILER_LAUNCHER=${COMPILER_LAUNCHER}")
  endif()
  if(Torch_DIR)
    list(APPEND args "-DTorch_DIR=${Torch_DIR}")
  endif()
  set(${out} "${args}" PARENT_SCOPE)
endfunction()
