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
    x = em_to(x, device);                          /* x = x.to(device) */
    seed_linear model = seed_linear_new(3, 1, EM_DEVICE_CPU); /* model = torch.nn.Linear(3, 1) */
    seed_linear_to(&model, device);                /* model = model.to(device) */
    em_tensor *output = seed_linear_forward(&model, x);
    SEED_CHECK(output);
    print_tensor("output.to('cpu'): ", em_to(output, EM_DEVICE_CPU)); /* tensor([[...], [...], [...]]) */
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
    seed_linear model = seed_linear_new(10, 10, EM_DEVICE_CPU);
    em_tensor *x = em_arange(1, 11, 1, EM_OPTS(0));
    em_tensor *y = em_arange(10, 0, -1, EM_OPTS(0));
    SEED_CHECK(x && y);
    print_device_of("model.weight.device: ", model.weight); /* cpu */
    print_device_of("model.bias.device: ", model.bias);     /* cpu */
    print_device_of("x.device: ", x);                       /* cpu */
    print_device_of("y.device: ", y);                       /* cpu */

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

    /* model_gpu = model.cuda(): a module moves in place, so the two names are one model
     * (model.weight is model_gpu.weight: True). TODO(nn): em_module_to keeps handles valid. */
    seed_linear *model_gpu = &model;
    seed_linear_to(model_gpu, device);
    print_device_of("model_gpu.weight.device: ", model_gpu->weight); /* cuda:0 */
    print_device_of("model_gpu.bias.device: ", model_gpu->bias);     /* cuda:0 */
    printf("model.weight is model_gpu.weight: %s\n", py_bool(model.weight == model_gpu->weight)); /* True */

    /* model = torch.nn.Linear(10,10); model(x_gpu)   # RuntimeError */
    seed_linear cpu_model = seed_linear_new(10, 10, EM_DEVICE_CPU);
    em_tensor *r = seed_linear_forward(&cpu_model, x_gpu);
    if (!r) print_expected_error("cpu model(x_gpu)"); /* Expected all tensors to be on the same device */
    else printf("cpu model(x_gpu): no error (x_gpu is on the CPU: there is no second device here)\n");

    /* model = torch.nn.Linear(10,10).cuda(); result_gpu = model(x_gpu) */
    seed_linear gpu_model = seed_linear_new(10, 10, EM_DEVICE_CPU);
    seed_linear_to(&gpu_model, device);
    em_tensor *result_gpu = seed_linear_forward(&gpu_model, x_gpu);
    SEED_CHECK(result_gpu);
    print_tensor("result_gpu: ", result_gpu);            /* tensor([...], device='cuda:0') */
    print_device_of("result_gpu.device: ", result_gpu); /* cuda:0 */
    em_tensor *result = em_cpu(result_gpu);               /* result = result_gpu.cpu() */
    SEED_CHECK(result);
    print_tensor("result: ", result);            /* tensor([...]) */
    print_device_of("result.device: ", result); /* cpu */
}

int main(void) {
    em_scope scope = em_scope_begin();
    em_manual_seed(1);
    em_device device = cuda_or_substitute();
    simple_example(device);
    send_tensors(device);
    the_program(device);
    em_scope_end(scope);
    SEED_CHECK(!em_failed());
    return 0;
}
