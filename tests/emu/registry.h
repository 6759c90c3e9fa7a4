#pragma once
#include <map>
#include <string>

#include "emu.h"

// "<kind>_<dtype>/<kernel name>" -> entry point taking a pointer to its argument struct.
using Registry = std::map<std::string, emu::KernelFn>;
