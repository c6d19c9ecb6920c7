// A plugin built for another ABI version. Its registration function must never be called:
// it aborts if it is.
#include <cstdint>
#include <cstdlib>

extern "C" __attribute__((visibility("default"))) uint32_t torchcompile_plugin_abi_version() { return 9999; }
extern "C" __attribute__((visibility("default"))) void torchcompile_plugin_register(void*) { std::abort(); }
