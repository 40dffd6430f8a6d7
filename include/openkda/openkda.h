// Umbrella header of the framework-free OpenKDA C++ API.
#pragma once

#include "openkda/api.h"
#include "openkda/args.h"
#include "openkda/status.h"
#include "openkda/tensor_ref.h"
