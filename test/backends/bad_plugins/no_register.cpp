// A plugin that exports its ABI version but no registration function. No torchcompile headers,
// so it builds in no time; the symbol name is spelled out as TORCHCOMPILE_PLUGIN_ABI_SYMBOL.
#include <cstdint>

extern "C" __attribute__((visibility("default"))) uint32_t torchcompile_plugin_abi_version() { return 1; }
