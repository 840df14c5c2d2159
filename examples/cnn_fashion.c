/* A small CNN on Fashion-MNIST, as one writes it in PyTorch:
 *
 *   model = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
 *                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
 *                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 10)).to(device)
 *   opt = torch.optim.Adam(model.parameters(), lr=1e-3)
 *   for x, y in loader: loss = F.cross_entropy(model(x), y); ...   (x: [64, 1, 28, 28])
 *
 * Usage: example_cnn_fashion [STEPS]   (default 60 steps: a quick run for CI; 938 is one
 * epoch). It prints the loss as it trains and the accuracy on 2000 test images, and fails
 * unless the loss fell. The device is em_device_auto() (EMBER_DEVICE=opencl:0 picks PoCL). */
#include <stdio.h>
#include <stdlib.h>
#include <ember/ember.h>

#define CHECK_OR_DIE(cond, what)                                                      \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "cnn_fashion: %s: %s\n", what, em_last_error());          \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

int main(int argc, char **argv) {
    long steps = argc > 1 ? strtol(argv[1], NULL, 10) : 60;
    em_device dev = em_device_auto();
    em_manual_seed(0);

    em_dataset *train = em_dataset_fashion_mnist(NULL, true), *test = em_dataset_fashion_mnist(NULL, false);
    CHECK_OR_DIE(train && test, "Fashion-MNIST (Debian's dataset-fashion-mnist)");

    em_module *model = em_nn_sequential(
        em_nn_conv2d_ex(1, 6, EM_HW1(5), EM_HW1(1), EM_HW1(2), EM_HW1(1), 1, true), em_nn_relu(),
        em_nn_max_pool2d(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false),
        em_nn_conv2d(6, 16, EM_HW1(5)), em_nn_relu(),
        em_nn_max_pool2d(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false),
        em_nn_flatten(), em_nn_linear(400, 120), em_nn_relu(), em_nn_linear(120, 10));
    CHECK_OR_DIE(model && em_module_to(model, dev) == EM_OK, "building the model");
    em_module_print(model);
    em_optimizer *opt = em_adam(model, 1e-3);
    em_loader *loader = em_loader_new(train, (em_loader_opts){.batch_size = 64, .shuffle = true, .device = dev});
    CHECK_OR_DIE(opt && loader, "optimizer and loader");

    double first = 0, last = 0;
    em_batch b;
    for (long step = 0; step < steps; step++) {
        if (!em_loader_next(loader, &b) && !em_loader_next(loader, &b)) break; /* next epoch */
        em_scope s = em_scope_begin();
        em_tensor *x = b.x;                                        /* [64, 1, 28, 28], as torchvision gives it */
        em_tensor *loss = em_cross_entropy(em_forward(model, x), b.y, 0.0);
        CHECK_OR_DIE(em_zero_grad(opt) == EM_OK && em_backward(loss) == EM_OK && em_step(opt) == EM_OK, "step");
        last = em_item(loss);
        if (step == 0) first = last;
        if (step % 20 == 0 || step == steps - 1) printf("step %4ld  loss %.4f\n", step, last);
        em_scope_end(s);
    }

    /* accuracy on the first 2000 test images, without gradients */
    em_module_eval(model);
    em_grad_mode g = em_no_grad_begin();
    em_scope s = em_scope_begin();
    em_tensor *x = em_to(em_narrow(em_dataset_x(test), 0, 0, 2000), dev);   /* [2000, 1, 28, 28] */
    em_tensor *y = em_to(em_narrow(em_dataset_y(test), 0, 0, 2000), dev);
    em_tensor *hits = em_sum(em_eq(em_argmax(em_forward(model, x), 1, false), y), EM_ALL_DIMS, false);
    double acc = em_item(hits) / 2000.0;
    CHECK_OR_DIE(!em_failed(), "evaluation");
    printf("on %s: loss %.4f -> %.4f after %ld steps, test accuracy %.1f%%\n", em_device_str(dev).s, first, last,
           steps, 100 * acc);
    em_scope_end(s);
    em_no_grad_end(g);

    em_loader_free(loader);
    em_optim_free(opt);
    em_module_free(model);
    em_dataset_free(train);
    em_dataset_free(test);
    return last < first ? 0 : 1;
}
