// Defaults for the sanitized build (`make sanitize`: -DMEGATRON_SANITIZE=ON, AddressSanitizer and
// UndefinedBehaviorSanitizer), compiled into each of its programs (CMakeLists.txt). The runtimes
// read these before main, so every process the tests start -- ranks, launchers, converters --
// runs with them whatever its environment; ASAN_OPTIONS, LSAN_OPTIONS and UBSAN_OPTIONS still
// override them. In other builds this file is not compiled.
#if defined(__SANITIZE_ADDRESS__)

extern "C" {

// allocator_may_return_null: a model too large for the machine must reach our "out of memory"
// error (core/memory.h) as std::bad_alloc, as it does unsanitized, not stop in the allocator.
const char* __asan_default_options() { return "detect_leaks=1:allocator_may_return_null=1:check_initialization_order=1"; }

const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }

// Memory LibTorch (and the libraries it loads) keeps for the life of the process by design --
// operator registries, thread pools, CPU feature tables -- is reported at exit as leaked by the
// leak checker, which sees only the instrumented code's frees. A suppression matches a leak with
// any frame in these libraries, so what is allocated through a LibTorch call (a tensor) is not
// checked here; what our code allocates itself (new, malloc, containers) still is.
const char* __lsan_default_suppressions() {
  return "leak:libtorch_cpu.so\n"
         "leak:libc10.so\n"
         "leak:libgomp.so\n"
         "leak:libsentencepiece.so\n";
}

}  // extern "C"

#endif
