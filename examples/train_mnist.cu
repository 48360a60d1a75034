// Train a 784-1024-10 MLP on MNIST: nvcc examples/train_mnist.cu -o train_mnist (GPU), or cc -x c (CPU).
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"
int main(void) {
    mnistcu_ctx *ctx = NULL; mnistcu_dataset *train, *test; mnistcu_model *net; mnistcu_train_result r; mnistcu_metrics m;
    int ok = !mnistcu_ctx_create(&ctx, NULL) && !mnistcu_dataset_load_dir(ctx, "data/mnist", MNISTCU_SPLIT_TRAIN, &train) &&
             !mnistcu_dataset_load_dir(ctx, "data/mnist", MNISTCU_SPLIT_TEST, &test) &&
             !mnistcu_model_create_mlp(ctx, "784-1024-10", &net) && !mnistcu_train(net, train, NULL, &r) && !mnistcu_evaluate(net, test, &m, NULL);
    if (ok) printf("test accuracy %.2f%%, trained in %.2f s on %s\n", 100.0 * m.accuracy, r.seconds, mnistcu_ctx_device_name(ctx));
    mnistcu_ctx_destroy(ctx); return !ok;  // errors were already printed by the library's logger
}
