# cmake -DIN=file.cu[h] -DOUT=file.cpp -P rewrite_cuda.cmake
# Writes a C++ copy of a CUDA source for the lessons' CPU emulation (include/flashlab_cpu/emulation.hpp):
#  * every launch  NAME<<<CONFIG>>>(ARGS)  becomes  ::flashlab_cpu::launcher(NAME, CONFIG)(ARGS);
#    NAME may carry template arguments (fill_random_kernel<T>), CONFIG is grid, block[, shared bytes, stream];
#  * every  __shared__ TYPE NAME[...];  becomes  static TYPE NAME[...];  followed, on the same line, by a static
#    ::flashlab_cpu::SharedMemory that fills it with NaN bytes before each block (a GPU's shared memory holds
#    garbage until written);
#  * nvcc's `#pragma nv_diag_suppress 177` / `550` (a variable declared and never used / set and never used)
#    become the same request to g++, so an unfinished exercise compiles under -Werror as it does under nvcc;
#  * the emulation header is included first, and a #line directive makes the compiler's messages name the
#    original file and its lines (the rewrite keeps every line where it was).
# The build runs this again whenever IN or this script changes: you edit the .cu file, never the copy.
if(NOT DEFINED IN OR NOT DEFINED OUT)
  message(FATAL_ERROR "usage: cmake -DIN=file.cu -DOUT=file.cpp -P rewrite_cuda.cmake")
endif()
file(READ "${IN}" text)
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_:]*(<[^<>;]*>)?)[ \t\r\n]*<<<([^;]*)>>>"
       "::flashlab_cpu::launcher(\\1, \\3)" text "${text}")
string(REGEX REPLACE "__shared__([^;=(){}/\n]*[ \t*])([A-Za-z_][A-Za-z0-9_]*)[ \t]*((\\[[^;]*\\])?)[ \t]*;"
       "static\\1\\2\\3; static const ::flashlab_cpu::SharedMemory flashlab_shared_\\2(&\\2, sizeof \\2);"
       text "${text}")
string(REGEX REPLACE "#pragma[ \t]+nv_diag_suppress[ \t]+177"
       "#pragma GCC diagnostic ignored \"-Wunused-variable\"" text "${text}")
string(REGEX REPLACE "#pragma[ \t]+nv_diag_suppress[ \t]+550"
       "#pragma GCC diagnostic ignored \"-Wunused-but-set-variable\"" text "${text}")
set(header "// Generated from ${IN}\n// by lessons/cpu_emulation/rewrite_cuda.cmake for the CPU emulation: edit that file, not this copy.\n#include \"flashlab_cpu/emulation.hpp\"\n#line 1 \"${IN}\"\n")
file(WRITE "${OUT}" "${header}${text}")
