/* Seed 001 "[PyTorch] GPU와 CUDA" (GPU and CUDA), in C.
 *
 * The seed moves a tensor and a model to 'cuda', runs the model and brings the result
 * back; it shows that .cuda()/.to() on a tensor makes a new tensor (x is x_gpu: False)
 * while Module.to() changes the module in place, and that a CPU model applied to a GPU
 * tensor raises a RuntimeError. The comments quote the seed's output (on a machine with a
 * Tesla T4); without CUDA this program says so and uses the next device it has. */
#include <ember/ember.h>
#include "seed_common.h"

/* device = torch.device('cuda'), or what this machine has instead. */
static em_device cuda_or_substitute(void) {
    em_device cuda = EM_DEVICE(EM_CUDA, -1);
    if (em_device_available(EM_CUDA)) return cuda;
    printf("torch.device('cuda') is not usable here: %s\n", em_device_unavailable_reason(EM_CUDA));
    em_device d = second_device();
    printf("using %s instead\n", em_device_str(d).s);
    return d;
}

/* ---- The simple example: tensor and model to the device, result back to the CPU ---- */
static void simple_example(em_device device) {
    printf("\n== Simple example\n");
    em_tensor *x = em_randn(EM_SHAPE(3, 3), EM_OPTS(0));
    x = em_to(x, device);                 /* x = x.to(device) */
    em_module *model = em_nn_linear(3, 1);   /* model = torch.nn.Linear(3, 1) */
    SEED_CHECK(model && em_module_to(model, device) == EM_OK); /* model = model.to(device) */
    SEED_CHECK(module_on(model, device));
    em_tensor *output = em_forward(model, x); /* output = model(x) */
    SEED_CHECK(output);
    em_tensor *host = em_to(output, EM_DEVICE_CPU);
    SEED_CHECK(host && em_device_of(host).type == EM_CPU && em_numel(host) == 3);
    print_tensor("output.to('cpu'): ", host); /* tensor([[...], [...], [...]]) */
    em_module_free(model);
}

/* ---- Sending tensors with .cuda() / .cpu() / .to("cuda:0") ---- */
static void send_tensors(em_device device) {
    printf("\n== .cuda() / .cpu() / .to(\"...\")\n");
    static const float v[] = {1, 2, 3};
    em_tensor *x = em_from_data(v, EM_F32, EM_SHAPE(3), EM_OPTS(0)); /* torch.tensor([1., 2., 3.]) */
    /* .cuda(): the current CUDA device ("the smallest cuda" in the seed). */
    em_tensor *xc = em_to(x, EM_DEVICE(EM_CUDA, -1));
    if (xc) print_device_of("x.cuda(): ", xc);
    else print_expected_error("x.cuda()");
    /* .to() takes PyTorch's device strings. */
    em_device_string here = em_device_str(device);
    const char *names[] = {"cuda:0", "cpu", "opencl:0", here.s};
    for (int i = 0; i < 4; i++) {
        em_device d;
        SEED_CHECK(em_device_parse(names[i], &d) == EM_OK);
        em_tensor *y = em_to(x, d);
        char what[64];
        snprintf(what, sizeof what, "x.to(\"%s\")", names[i]);
        if (y) printf("%s: %s\n", what, em_device_str(em_device_of(y)).s);
        else print_expected_error(what);
    }
    em_tensor *x_gpu = em_to(x, device);
    em_tensor *x_cpu = em_cpu(x_gpu); /* x_gpu.cpu() */
    SEED_CHECK(x_cpu);
    print_device_of("x_gpu.cpu(): ", x_cpu);
}

/* ---- The seed's longer program ---- */
static void the_program(em_device device) {
    printf("\n== Devices, copies and in-place modules\n");
    /* torch.cuda.is_available()   # True */
    printf("cuda available: %s\n", py_bool(em_device_available(EM_CUDA)));
    /* torch.cuda.get_device_name()   # 'Tesla T4' (the current device) */
    if (em_device_available(EM_CUDA)) printf("cuda name: %s\n", device_name(EM_DEVICE(EM_CUDA, -1)).s);
    /* torch.cuda.device_count()   # 1 */
    printf("cuda device count: %d\n", em_device_count(EM_CUDA));

    /* model = torch.nn.Linear(10,10); x = 1..10; y = 10..1, all on the CPU */
    em_module *model = em_nn_linear(10, 10);
    em_tensor *x = em_arange(1, 11, 1, EM_OPTS(0));
    em_tensor *y = em_arange(10, 0, -1, EM_OPTS(0));
    SEED_CHECK(model && x && y);
    em_tensor *weight = module_param(model, "weight"), *bias = module_param(model, "bias");
    print_device_of("model.weight.device: ", weight); /* cpu */
    print_device_of("model.bias.device: ", bias);     /* cpu */
    print_device_of("x.device: ", x);                 /* cpu */
    print_device_of("y.device: ", y);                 /* cpu */

    /* x_gpu = x.cuda(); x_gpu[0] = 100. */
    em_tensor *x_gpu = em_to(x, device);
    SEED_CHECK(x_gpu);
    print_device_of("x_gpu.device: ", x_gpu); /* cuda:0 */
    SEED_CHECK(em_fill_(em_select(x_gpu, 0, 0), 100.0) == EM_OK);
    print_tensor("x: ", x);         /* tensor([ 1.,  2., ..., 10.]) : unchanged */
    print_tensor("x_gpu: ", x_gpu); /* tensor([100.,  2., ..., 10.], device='cuda:0') */
    /* print(x is x_gpu)   # False: .cuda() made a new tensor. On the CPU alone, .to('cpu')
     * returns x itself (True), exactly as PyTorch's x.to('cpu') does. */
    printf("x is x_gpu: %s\n", py_bool(x == x_gpu));
    if (x == x_gpu) printf("(only the CPU here: x.to(cpu) is x itself, so writing x_gpu[0] changed x too)\n");

    /* model_gpu = model.cuda(): a module moves in place, so the two names are one model and
     * the weight handle taken before the move is the moved weight (model.weight is
     * model_gpu.weight: True). */
    em_module *model_gpu = model;
    SEED_CHECK(em_module_to(model_gpu, device) == EM_OK);
    print_device_of("model_gpu.weight.device: ", module_param(model_gpu, "weight")); /* cuda:0 */
    print_device_of("model_gpu.bias.device: ", module_param(model_gpu, "bias"));     /* cuda:0 */
    printf("model.weight is model_gpu.weight: %s\n", py_bool(weight == module_param(model_gpu, "weight"))); /* True */
    SEED_CHECK(weight == module_param(model_gpu, "weight") && bias == module_param(model_gpu, "bias"));
    SEED_CHECK(em_device_equal(em_device_of(weight), device) && em_device_equal(em_device_of(bias), device));

    /* model = torch.nn.Linear(10,10); model(x_gpu)   # RuntimeError */
    em_module *cpu_model = em_nn_linear(10, 10);
    SEED_CHECK(cpu_model);
    em_tensor *r = em_forward(cpu_model, x_gpu);
    if (em_device_of(x_gpu).type != EM_CPU) {
        if (r || !em_failed()) { /* it must fail, not compute */
            fprintf(stderr, "a cpu model applied to a %s tensor did not fail\n", em_device_str(device).s);
            exit(1);
        }
        print_expected_error("cpu model(x_gpu)"); /* Expected all tensors to be on the same device */
    } else {
        SEED_CHECK(r);
        printf("cpu model(x_gpu): no error (x_gpu is on the CPU: there is no second device here)\n");
    }
    em_module_free(cpu_model);

    /* model = torch.nn.Linear(10,10).cuda(); result_gpu = model(x_gpu) */
    em_module *gpu_model = em_nn_linear(10, 10);
    SEED_CHECK(gpu_model && em_module_to(gpu_model, device) == EM_OK);
    em_tensor *result_gpu = em_forward(gpu_model, x_gpu);
    SEED_CHECK(result_gpu);
    print_tensor("result_gpu: ", result_gpu);            /* tensor([...], device='cuda:0') */
    print_device_of("result_gpu.device: ", result_gpu); /* cuda:0 */
    em_tensor *result = em_cpu(result_gpu);               /* result = result_gpu.cpu() */
    SEED_CHECK(result && em_device_of(result).type == EM_CPU);
    print_tensor("result: ", result);            /* tensor([...]) */
    print_device_of("result.device: ", result); /* cpu */
    em_module_free(gpu_model);
    em_module_free(model);
}

/* ---- "Move the parameters to the device before creating the Optimizer" ----
 * In PyTorch an optimizer made before model.cuda() may hold state on the old device.
 * Ember's em_module_to also moves the state of the module's optimizers, so both orders
 * work; this trains a Linear(10, 10) with Adam, moving it halfway through. */
static void optimizer_and_move(em_device device) {
    printf("\n== Adam, with the model moved after the optimizer was made\n");
    em_module *model = em_nn_linear(10, 10);
    SEED_CHECK(model);
    em_optimizer *opt = em_adam(model, 0.05); /* optimizer = torch.optim.Adam(model.parameters(), lr=0.05) */
    SEED_CHECK(opt);
    em_tensor *x = em_randn(EM_SHAPE(32, 10), EM_OPTS(0));
    em_tensor *target = em_randn(EM_SHAPE(32, 10), EM_OPTS(0));
    SEED_CHECK(x && target);
    double first = 0, last = 0;
    for (int step = 0; step < 40; step++) {
        if (step == 20) {
            /* model.to(device) after the optimizer exists: its moments move too */
            SEED_CHECK(em_module_to(model, device) == EM_OK);
            SEED_CHECK(module_on(model, device));
            x = em_to(x, device);
            target = em_to(target, device);
            SEED_CHECK(x && target);
            em_tensor *m = em_optim_state(opt, module_param(model, "weight"), "exp_avg");
            SEED_CHECK(m && em_device_equal(em_device_of(m), device));
            printf("moved to %s at step %d; exp_avg is on %s\n", em_device_str(device).s, step,
                   em_device_str(em_device_of(m)).s);
        }
        em_scope s = em_scope_begin();
        em_tensor *loss = em_mse_loss(em_forward(model, x), target); /* loss = F.mse_loss(model(x), y) */
        SEED_CHECK(em_zero_grad(opt) == EM_OK);                      /* optimizer.zero_grad() */
        SEED_CHECK(em_backward(loss) == EM_OK);                      /* loss.backward() */
        SEED_CHECK(em_step(opt) == EM_OK);                           /* optimizer.step() */
        last = loss_value(loss);                                     /* loss.item() */
        if (step == 0) first = last;
        if (step % 10 == 0 || step == 39) printf("step %2d: loss %.4f\n", step, last);
        em_scope_end(s);
    }
    printf("loss %.4f -> %.4f\n", first, last);
    SEED_CHECK(last < 0.8 * first); /* it learned, on both sides of the move */
    em_optim_free(opt);
    em_module_free(model);
}

int main(void) {
    em_scope scope = em_scope_begin();
    em_manual_seed(1);
    em_device device = cuda_or_substitute();
    simple_example(device);
    send_tensors(device);
    the_program(device);
    optimizer_and_move(device);
    em_scope_end(scope);
    SEED_CHECK(!em_failed());
    return 0;
}
