# Cross build for 64-bit ARM Linux with Debian's gcc-aarch64-linux-gnu and the arm64 builds of the
# libraries (multiarch: /usr/lib/aarch64-linux-gnu), run under qemu-aarch64 (Debian's qemu-user):
# ctest and the tests' NANOLM_BIN go through the emulator. `make test-aarch64` uses it;
# `scripts/setup-deps.sh aarch64` installs what it needs.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
# -L /: the arm64 loader and libraries where multiarch puts them (/lib/ld-linux-aarch64.so.1,
# /usr/lib/aarch64-linux-gnu)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# Debian 12's cross GCC 12 stops with an internal compiler error while vectorizing a double fmax
# reduction (src/train/precision.c) at -O3; this build checks correctness, not speed.
set(CMAKE_C_FLAGS_INIT "-fno-tree-loop-vectorize")
