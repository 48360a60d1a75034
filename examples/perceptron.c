/* A single-layer perceptron on 2-D points: one dense unit, a sigmoid through
   the binary cross-entropy loss (BCE on logits), trained on linearly separable
   synthetic data until every point is on its side; then the learned line.

     cc -O2 examples/perceptron.c -lm -o perceptron && ./perceptron
     nvcc -x cu examples/perceptron.c -o perceptron   (the same on the GPU)

   The points: x uniform in [-1, 1]^2, the class is 1 where 0.6 x0 - x1 + 0.2 > 0,
   and points closer than 0.05 to that line are left out (a margin). */
#define MNISTCU_IMPLEMENTATION
#include "../mnistcu.h"

#define N 400

int main(void)
{
    mnistcu_ctx *ctx = NULL;
    mnistcu_dataset *ds = NULL;
    mnistcu_model *net = NULL;
    mnistcu_model_desc md;
    mnistcu_train_desc td;
    mnistcu_ctx_desc cd;
    static float x[2 * N], t[N], p[N];
    float w[2], b;
    uint64_t s = 12345;
    int i = 0, epoch, correct = 0, ok;

    while (i < N) { /* a small xorshift generator: the example needs no other code */
        float a, c, d;
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        a = (float)(s >> 40) / 8388608.0f - 1.0f;
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        c = (float)(s >> 40) / 8388608.0f - 1.0f;
        d = (0.6f * a - c + 0.2f) / 1.166190f; /* signed distance to the line */
        if (d > -0.05f && d < 0.05f) continue;
        x[2 * i] = a;
        x[2 * i + 1] = c;
        t[i] = d > 0.0f ? 1.0f : 0.0f;
        ++i;
    }
    memset(&cd, 0, sizeof cd);
    cd.log_level = MNISTCU_LOG_WARN; /* errors and warnings only */
    memset(&md, 0, sizeof md);
    md.input_w = 2;                        /* one sample: 2 features */
    md.layers[0].kind = MNISTCU_LAYER_DENSE;
    md.layers[0].units = 1;                /* one output: w . x + b */
    md.loss = MNISTCU_LOSS_BCE;            /* the sigmoid lives in the loss */
    memset(&td, 0, sizeof td);
    td.epochs = 1;
    td.batch_size = 16;
    td.optim.learning_rate = 0.5f;

    ok = !mnistcu_ctx_create(&ctx, &cd) && !mnistcu_dataset_create_targets(ctx, x, t, N, 2, 1, &ds) &&
         !mnistcu_model_create(ctx, &md, &net);
    for (epoch = 1; ok && epoch <= 200 && correct < N; ++epoch) {
        ok = !mnistcu_train(net, ds, &td, NULL) && !mnistcu_predict(net, x, N, NULL, p); /* p: sigmoid(w . x + b) */
        for (correct = 0, i = 0; ok && i < N; ++i) correct += (p[i] > 0.5f) == (t[i] > 0.5f);
    }
    ok = ok && !mnistcu_model_get_tensor(net, "0.weight", w, 2) && !mnistcu_model_get_tensor(net, "0.bias", &b, 1);
    if (ok) {
        printf("%d of %d points on the right side after %d epochs on %s\n", correct, N, epoch - 1,
               mnistcu_ctx_device_name(ctx));
        printf("learned line: %.4f x0 %+.4f x1 %+.4f = 0, i.e. x1 = %.4f x0 %+.4f (true: x1 = 0.6 x0 + 0.2)\n",
               (double)w[0], (double)w[1], (double)b, (double)(-w[0] / w[1]), (double)(-b / w[1]));
    }
    mnistcu_ctx_destroy(ctx); /* frees the dataset and the model too */
    return ok && correct == N ? 0 : 1;
}
