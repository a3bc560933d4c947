// nibble — umbrella header of the public, torch-free C++ API.
#pragma once

#include "nibble/device.h"
#include "nibble/formats.h"
#include "nibble/gemm.h"
#include "nibble/layout.h"
#include "nibble/numeric.h"
#include "nibble/quantize.h"
#include "nibble/status.h"
#include "nibble/tensor.h"
#include "nibble/types.h"
#include "nibble/version.h"
