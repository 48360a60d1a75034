/* Compile test: the implementation, as a user includes it. */
#define MNISTCU_IMPLEMENTATION
#include "../../mnistcu.h"
#include "../../mnistcu.h" /* a second include must be harmless */
