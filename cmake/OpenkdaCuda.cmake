# CUDA backend: sm_90a (wgmma/setmaxnreg need the arch-specific target), static cudart so the
# extension loads without a CUDA runtime on the library path, no global fast-math.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_ARCHITECTURES ${OPENKDA_CUDA_ARCHS})

file(GLOB_RECURSE OPENKDA_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/*.cu)
add_library(openkda_cuda STATIC ${OPENKDA_CUDA_SOURCES})
target_include_directories(openkda_cuda PUBLIC ${PROJECT_SOURCE_DIR}/include PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(openkda_cuda PUBLIC CUDA::cudart_static)
set_target_properties(openkda_cuda PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
target_compile_options(openkda_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --threads=0 -Xptxas=-v,--warn-on-spills,--warn-on-local-memory-usage>)
