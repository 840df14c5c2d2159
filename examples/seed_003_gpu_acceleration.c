/* Seed 003 "[파이썬] PyTorch GPU 가속 사용 방법" (how to use GPU acceleration in PyTorch), in C.
 *
 * The seed checks for a GPU, sets a device, moves a tensor and a small model (Linear(2, 1))
 * to it, and moves every batch of a DataLoader to the device before the forward pass.
 * The comments quote the seed's messages (in Korean in the seed, in English here). */
#include <ember/ember.h>
#include "seed_common.h"

/* if torch.cuda.is_available(): print("GPU를 사용할 수 있습니다.") else: print("GPU를 사용할 수 없습니다.") */
static void check_support(void) {
    printf("== GPU support\n");
    if (em_device_available(EM_CUDA)) printf("The GPU can be used.\n");
    else printf("The GPU cannot be used. (%s)\n", em_device_unavailable_reason(EM_CUDA));
}

static em_device set_device(void) {
    printf("\n== Device setup\n");
    em_device device;
    if (em_device_available(EM_CUDA)) {
        device = EM_DEVICE(EM_CUDA, -1); /* torch.device("cuda") */
        printf("Using the GPU.\n");
    } else {
        device = EM_DEVICE_CPU; /* torch.device("cpu") */
        printf("The GPU cannot be used.\n");
    }
    /* x = torch.tensor([1., 2.]).to(device) */
    static const float v[] = {1, 2};
    em_tensor *x = em_to(em_from_data(v, EM_F32, EM_SHAPE(2), EM_OPTS(0)), device);
    SEED_CHECK(x);
    print_tensor("x: ", x);
    return device;
}

/* class MyModel(nn.Module): self.linear = nn.Linear(2, 1); forward(x) = self.linear(x) */
typedef struct my_model { seed_linear linear; } my_model;
static em_tensor *my_model_forward(const my_model *m, em_tensor *x) { return seed_linear_forward(&m->linear, x); }

static my_model make_model(em_device device) {
    printf("\n== The model\n");
    my_model model = {seed_linear_new(2, 1, EM_DEVICE_CPU)};
    if (em_device_available(EM_CUDA)) {
        seed_linear_to(&model.linear, device); /* model.to(device) */
        printf("Moved the model to the GPU.\n");
    } else {
        printf("No GPU: the model stays on the CPU.\n");
    }
    return model;
}

/* dataset = ...; dataloader = DataLoader(dataset, batch_size=32, shuffle=True)
 * for inputs, labels in dataloader: inputs.to(device); labels.to(device); outputs = model(inputs)
 * TODO(data): em_loader from the data helper. Until then an in-memory dataset of 100
 * samples, shuffled once, cut into batches of 32 with index_select. */
static void train_loop(const my_model *model, em_device device) {
    printf("\n== Batches to the device\n");
    enum { N = 100, BATCH = 32 };
    em_tensor *inputs_all = em_randn(EM_SHAPE(N, 2), EM_OPTS(0));
    em_tensor *labels_all = em_randint(0, 2, EM_SHAPE(N), EM_OPTS(.dtype = EM_I64));
    SEED_CHECK(inputs_all && labels_all);
    int64_t order[N];
    for (int i = 0; i < N; i++) order[i] = i;
    srand(3);
    for (int i = N - 1; i > 0; i--) { /* shuffle=True */
        int j = rand() % (i + 1);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    int batches = 0;
    for (int start = 0; start < N; start += BATCH) {
        em_scope s = em_scope_begin(); /* the batch's tensors are freed at the end of each step */
        int n = start + BATCH <= N ? BATCH : N - start;
        em_tensor *idx = em_from_data(order + start, EM_I64, EM_SHAPE(n), EM_OPTS(.dtype = EM_I64));
        em_tensor *inputs = em_to(em_index_select(inputs_all, 0, idx), device);
        em_tensor *labels = em_to(em_index_select(labels_all, 0, idx), device);
        em_tensor *outputs = my_model_forward(model, inputs);
        SEED_CHECK(outputs && labels);
        printf("batch %d: inputs [%lld, 2] on %s, labels [%lld], outputs [%lld, %lld]\n", batches,
               (long long)em_size(inputs, 0), em_device_str(em_device_of(inputs)).s,
               (long long)em_size(labels, 0), (long long)em_size(outputs, 0), (long long)em_size(outputs, 1));
        batches++;
        em_scope_end(s);
    }
    printf("%d batches\n", batches); /* ceil(100 / 32) = 4 */
}

int main(void) {
    em_scope scope = em_scope_begin();
    em_manual_seed(3);
    check_support();
    em_device device = set_device();
    my_model model = make_model(device);
    train_loop(&model, device);
    em_scope_end(scope);
    SEED_CHECK(!em_failed());
    return 0;
}
