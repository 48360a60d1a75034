/* Regression with an MLP 300-300-300-1 (300 inputs, two tanh layers of 300) on random inputs
   and random targets, the mean squared error and plain SGD at 0.1: the same
   training timed on the CPU and on the GPU, and the ratio.

     nvcc -x cu -O3 examples/regression.c -o regression && ./regression   (both devices)
     cc -O3 -fopenmp examples/regression.c -lm -o regression               (CPU only)

   Random targets cannot be learnt beyond memorising them; the point is the
   time an epoch takes, and that both devices train the same model. */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"

#define SAMPLES 8192
#define INPUTS 300
#define EPOCHS 5

/* Trains the model on one device; returns the seconds, or a negative number
   when the device is not there. */
static double run(mnistcu_device device, const float *x, const float *t, double *loss)
{
    mnistcu_ctx *ctx = NULL;
    mnistcu_ctx_desc cd;
    mnistcu_dataset *ds;
    mnistcu_model *net;
    mnistcu_model_desc md;
    mnistcu_train_desc td;
    mnistcu_train_result res;
    double seconds = -1.0;
    memset(&cd, 0, sizeof cd);
    cd.device = device;
    cd.seed = 7;
    cd.log_level = MNISTCU_LOG_SILENT;
    memset(&md, 0, sizeof md);
    md.sizes[0] = INPUTS, md.sizes[1] = 300, md.sizes[2] = 300, md.sizes[3] = 1;
    md.hidden_act = MNISTCU_ACT_TANH;
    md.loss = MNISTCU_LOSS_MSE;
    memset(&td, 0, sizeof td);
    td.epochs = EPOCHS;
    td.batch_size = 64;
    td.optim.kind = MNISTCU_OPTIM_SGD;
    td.optim.learning_rate = 0.1f;
    if (mnistcu_ctx_create(&ctx, &cd) == MNISTCU_OK &&
        mnistcu_dataset_create_targets(ctx, x, t, SAMPLES, INPUTS, 1, &ds) == MNISTCU_OK &&
        mnistcu_model_create(ctx, &md, &net) == MNISTCU_OK && mnistcu_train(net, ds, &td, &res) == MNISTCU_OK) {
        seconds = res.seconds;
        *loss = res.train_loss;
        printf("%-34s %d epochs in %7.3f s   last epoch's loss %.6f\n", mnistcu_ctx_device_name(ctx), EPOCHS, seconds,
               res.train_loss);
    } else if (device == MNISTCU_DEVICE_CPU || (ctx && mnistcu_ctx_last_result(ctx) != MNISTCU_ERR_NO_DEVICE)) {
        fprintf(stderr, "regression: %s\n", ctx ? mnistcu_ctx_error(ctx) : "out of memory");
        seconds = -2.0;
    }
    mnistcu_ctx_destroy(ctx);
    return seconds;
}

int main(void)
{
    static float x[SAMPLES * INPUTS], t[SAMPLES];
    uint64_t s = 99;
    double cpu, gpu, cpu_loss = 0.0, gpu_loss = 0.0;
    int i;
    for (i = 0; i < SAMPLES * INPUTS + SAMPLES; ++i) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        if (i < SAMPLES * INPUTS) x[i] = (float)(s >> 40) / 8388608.0f - 1.0f;
        else t[i - SAMPLES * INPUTS] = (float)(s >> 40) / 8388608.0f - 1.0f;
    }
    printf("MLP %d-300-300-1, tanh, MSE, SGD 0.1, batch 64, %d samples\n", INPUTS, SAMPLES);
    cpu = run(MNISTCU_DEVICE_CPU, x, t, &cpu_loss);
    gpu = run(MNISTCU_DEVICE_CUDA, x, t, &gpu_loss);
    if (cpu < 0.0 || gpu < -1.5) return 1;
    if (gpu < 0.0) printf("GPU: none here (or a build without CUDA: compile with nvcc -x cu to time it)\n");
    else printf("GPU / CPU: the GPU is %.1fx faster (losses %.6f and %.6f)\n", cpu / gpu, gpu_loss, cpu_loss);
    return 0;
}
