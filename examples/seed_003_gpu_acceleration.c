/* Seed 003 "[파이썬] PyTorch GPU 가속 사용 방법" (how to use GPU acceleration in PyTorch), in C.
 *
 * The seed checks for a GPU, sets a device, moves a tensor and a small model (Linear(2, 1))
 * to it, and moves every batch of a DataLoader to the device before the forward pass.
 * Here the loop goes on to a loss, backward and an optimizer step, and checks that the
 * model learns.
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

/* class MyModel(nn.Module):
 *     def __init__(self): super().__init__(); self.linear = nn.Linear(2, 1)
 *     def forward(self, x): return self.linear(x)
 * A custom module: its kind (name and forward) and a child registered as "linear". */
static em_tensor *my_model_forward(em_module *m, em_tensor *x) {
    return em_forward(em_module_child(m, 0), x); /* self.linear(x) */
}
static const em_module_ops my_model_ops = {.name = "MyModel", .forward = my_model_forward};

static em_module *make_model(em_device device) {
    printf("\n== The model\n");
    em_module *model = em_module_new(&my_model_ops, NULL); /* model = MyModel() */
    SEED_CHECK(model && em_module_add_child(model, "linear", em_nn_linear(2, 1)) == EM_OK);
    em_module_print(model);
    if (em_device_available(EM_CUDA)) {
        SEED_CHECK(em_module_to(model, device) == EM_OK); /* model.to(device) */
        printf("Moved the model to the GPU.\n");
    } else {
        printf("No GPU: the model stays on the CPU.\n");
    }
    SEED_CHECK(module_on(model, em_device_available(EM_CUDA) ? device : EM_DEVICE_CPU));
    return model;
}

/* dataset = ...: 100 points in the plane, labelled 1 above the line x0 + x1 = 0, else 0 */
static em_dataset *make_dataset(void) {
    enum { N = 100 };
    em_tensor *inputs = em_randn(EM_SHAPE(N, 2), EM_OPTS(0));
    em_tensor *above = em_gt(em_sum(inputs, EM_DIMS(1), false), em_scalar(0, EM_OPTS(0)));
    em_dataset *ds = em_dataset_new(inputs, em_to_dtype(above, EM_I64));
    SEED_CHECK(ds && em_dataset_len(ds) == N);
    return ds;
}

/* dataloader = DataLoader(dataset, batch_size=32, shuffle=True)
 * for inputs, labels in dataloader: inputs.to(device); labels.to(device); outputs = model(inputs)
 * The seed stops at the forward pass; a loss (mean squared error against the 0/1 label),
 * backward and an SGD step complete the loop, and a few epochs show that it learns. */
static void train_loop(em_module *model, const em_dataset *dataset, em_device device) {
    printf("\n== Batches to %s, and training\n", em_device_str(device).s);
    em_loader *dataloader = em_loader_new(dataset, (em_loader_opts){
        .batch_size = 32, .shuffle = true, .seed = 3,
        .pin_memory = device.type != EM_CPU /* page-locked batches copy to a device faster */});
    em_optimizer *optimizer = em_sgd(model, 0.5); /* optimizer = torch.optim.SGD(model.parameters(), lr=0.5) */
    SEED_CHECK(dataloader && optimizer);
    SEED_CHECK(em_loader_len(dataloader) == 4); /* ceil(100 / 32) */
    double first = 0, last = 0;
    for (int epoch = 0; epoch < 15; epoch++) {
        double total = 0;
        int batches = 0;
        for (em_batch b = em_loader_iter(dataloader); em_loader_next(dataloader, &b);) { /* for inputs, labels in dataloader: */
            em_scope s = em_scope_begin(); /* the step's tensors are freed at its end */
            em_tensor *inputs = em_to(b.x, device); /* inputs = inputs.to(device) */
            em_tensor *labels = em_to(b.y, device); /* labels = labels.to(device) */
            em_tensor *outputs = em_forward(model, inputs); /* outputs = model(inputs) */
            SEED_CHECK(outputs && em_device_equal(em_device_of(outputs), device));
            /* loss = criterion(outputs, labels.float().unsqueeze(1)) */
            em_tensor *loss = em_mse_loss(outputs, em_unsqueeze(em_to_dtype(labels, EM_F32), 1));
            SEED_CHECK(em_zero_grad(optimizer) == EM_OK); /* optimizer.zero_grad() */
            SEED_CHECK(em_backward(loss) == EM_OK);       /* loss.backward() */
            SEED_CHECK(em_step(optimizer) == EM_OK);      /* optimizer.step() */
            if (epoch == 0)
                printf("batch %lld: inputs [%lld, 2] on %s, labels [%lld], outputs [%lld, %lld]\n",
                       (long long)b.index, (long long)em_size(inputs, 0), em_device_str(em_device_of(inputs)).s,
                       (long long)em_size(labels, 0), (long long)em_size(outputs, 0),
                       (long long)em_size(outputs, 1));
            total += loss_value(loss); /* loss.item(): the number back on the host */
            batches++;
            em_scope_end(s);
        }
        SEED_CHECK(!em_failed() && batches == 4); /* the loop ended at the epoch's end, not on an error */
        last = total / batches;
        if (epoch == 0) first = last;
        if (epoch % 5 == 0 || epoch == 14) printf("epoch %2d: mean loss %.4f\n", epoch, last);
    }
    /* accuracy on the whole dataset, in no-grad mode (with torch.no_grad():) */
    em_scope s = em_scope_begin();
    em_grad_mode g = em_no_grad_begin();
    em_tensor *x = em_to(em_dataset_x(dataset), device), *y = em_to(em_dataset_y(dataset), device);
    em_tensor *predicted = em_gt(em_forward(model, x), em_scalar(0.5, EM_OPTS(.device = device)));
    em_tensor *right = em_sum(em_eq(em_to_dtype(em_view(predicted, EM_SHAPE(-1)), EM_I64), y), EM_ALL_DIMS, false);
    em_no_grad_end(g);
    SEED_CHECK(right);
    double accuracy = em_item(right) / (double)em_dataset_len(dataset);
    printf("mean loss %.4f -> %.4f, accuracy %.0f%%\n", first, last, 100 * accuracy);
    SEED_CHECK(last < 0.75 * first && accuracy >= 0.85); /* a line separates the classes */
    em_scope_end(s);
    em_optim_free(optimizer);
    em_loader_free(dataloader);
}

int main(void) {
    em_scope scope = em_scope_begin();
    em_manual_seed(3);
    check_support();
    em_device device = set_device();
    em_module *model = make_model(device);
    em_dataset *dataset = make_dataset();
    train_loop(model, dataset, device);
    /* The same program on an OpenCL device, when there is one (PoCL runs on the CPU). */
    if (device.type == EM_CPU && em_device_available(EM_OPENCL)) {
        em_device cl = EM_DEVICE(EM_OPENCL, 0);
        em_module_free(model);
        em_manual_seed(3);
        model = make_model(cl);
        SEED_CHECK(em_module_to(model, cl) == EM_OK && module_on(model, cl)); /* model.to("opencl:0") */
        printf("Moved the model to %s.\n", em_device_str(cl).s);
        train_loop(model, dataset, cl);
    }
    em_module_free(model);
    em_dataset_free(dataset);
    em_scope_end(scope);
    SEED_CHECK(!em_failed());
    return 0;
}
