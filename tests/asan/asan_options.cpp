// Sanitizer defaults baked into ckpt_asan_test, so running it by hand behaves as under CTest:
// leaks are errors, the first report aborts (a non-zero exit CTest sees), UBSan prints a stack.
// ASAN_OPTIONS / UBSAN_OPTIONS in the environment still override these.
extern "C" {
const char* __asan_default_options();
const char* __ubsan_default_options();

const char* __asan_default_options() {
  return "detect_leaks=1:abort_on_error=1:strict_string_checks=1:"
         "detect_stack_use_after_return=1:check_initialization_order=1";
}

const char* __ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1";
}
}
