// nibble — library version.
#pragma once

#define NIBBLE_VERSION_MAJOR 0
#define NIBBLE_VERSION_MINOR 1
#define NIBBLE_VERSION_PATCH 0
#define NIBBLE_VERSION_STRING "0.1.0"
