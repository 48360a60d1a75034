/* Compile test: the implementation in one translation unit, used from another. */
#define MNISTCU_IMPLEMENTATION
#include "../../mnistcu.h"
