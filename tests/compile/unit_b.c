/* Compile test: a second translation unit that only includes the declarations. */
#include <stdio.h>
#include <string.h>
#include "../../mnistcu.h"

int main(void)
{
    mnistcu_ctx *ctx = NULL;
    mnistcu_ctx_desc d;
    mnistcu_model *m = NULL;
    memset(&d, 0, sizeof d);
    d.device = MNISTCU_DEVICE_CPU;
    d.log_level = MNISTCU_LOG_SILENT;
    if (mnistcu_ctx_create(&ctx, &d) || mnistcu_model_create_mlp(ctx, "4-3-2", &m)) {
        fprintf(stderr, "two_units: %s\n", mnistcu_ctx_error(ctx));
        return 1;
    }
    printf("two_units: %lu parameters, linked across two translation units\n",
           (unsigned long)mnistcu_model_num_params(m));
    mnistcu_ctx_destroy(ctx);
    return mnistcu_model_num_params(m) == 4 * 3 + 3 + 3 * 2 + 2 ? 0 : 1;
}
