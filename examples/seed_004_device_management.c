/* Seed 004 "디바이스 관리" (device management), in C.
 *
 * The seed covers where a tensor lives (x.device), detecting devices and choosing one
 * automatically, torch.device objects, moving with .to() (with a dtype at once), .cuda()
 * and .cpu() (and that .cpu() of a CPU tensor returns the tensor itself), the error for
 * tensors on different devices and its fix, .numpy() only on the CPU, the current device
 * (set_device and the torch.cuda.device(2) context manager) and a portable training loop.
 * The comments quote what the seed prints. */
#include <ember/ember.h>
#include "seed_common.h"

static void where_tensors_live(void) {
    printf("== x.device\n");
    static const float v[] = {1, 2, 3};
    em_tensor *x = em_from_data(v, EM_F32, EM_SHAPE(3), EM_OPTS(0)); /* torch.tensor([1.0, 2.0, 3.0]) */
    print_device_of("x.device: ", x);                               /* device(type='cpu') */
}

static em_device detect(void) {
    printf("\n== Detecting devices\n");
    printf("cuda available: %s\n", py_bool(em_device_available(EM_CUDA))); /* True / False */
    printf("cuda device count: %d\n", em_device_count(EM_CUDA));          /* the number of GPUs */
    if (em_device_available(EM_CUDA))
        printf("cuda:0 name: %s\n", device_name(EM_DEVICE(EM_CUDA, 0)).s); /* 'NVIDIA RTX 4090' */
    printf("mps available: %s\n", py_bool(em_device_available(EM_MPS)));   /* True / False */
    em_device device;                                                       /* cuda -> mps -> cpu */
    if (em_device_available(EM_CUDA)) device = EM_DEVICE(EM_CUDA, -1);
    else if (em_device_available(EM_MPS)) device = EM_DEVICE(EM_MPS, -1);
    else device = EM_DEVICE_CPU;
    printf("device: %s\n", em_device_str(device).s); /* cuda, mps or cpu */
    return device;
}

static void device_objects(void) {
    printf("\n== Device values\n");
    /* torch.device('cpu'), ('cuda'), ('cuda:1'), ('mps'): parsing works whatever exists */
    const char *names[] = {"cpu", "cuda", "cuda:1", "mps", "opencl:0"};
    for (int i = 0; i < 5; i++) {
        em_device d;
        SEED_CHECK(em_device_parse(names[i], &d) == EM_OK);
        printf("em_device_parse(\"%s\") -> %s (type %s, index %d%s)\n", names[i], em_device_str(d).s,
               em_device_type_name(d.type), d.index, d.index < 0 ? ": the current device of its type" : "");
    }
    em_device bad;
    if (em_device_parse("gpu:0", &bad) != EM_OK) print_expected_error("em_device_parse(\"gpu:0\")");

    /* x = torch.zeros(3, 4, device=cuda_device)   # device(type='cuda', index=0)
     * y = torch.ones(3, 4, device='cuda:0') */
    em_device cuda0;
    SEED_CHECK(em_device_parse("cuda:0", &cuda0) == EM_OK);
    em_tensor *x = em_zeros(EM_SHAPE(3, 4), EM_OPTS(.device = EM_DEVICE(EM_CUDA, -1)));
    if (x) print_device_of("zeros(3, 4, device=cuda).device: ", x);
    else print_expected_error("zeros(3, 4, device=cuda)");
    em_tensor *y = em_ones(EM_SHAPE(3, 4), EM_OPTS(.device = cuda0));
    if (y) print_device_of("ones(3, 4, device='cuda:0').device: ", y);
    else print_expected_error("ones(3, 4, device='cuda:0')");
}

static void moving(em_device device, em_device other) {
    printf("\n== .to(device), .to(device, dtype), .cuda(), .cpu()\n");
    static const float v[] = {1, 2, 3};
    em_tensor *x = em_from_data(v, EM_F32, EM_SHAPE(3), EM_OPTS(0));
    em_tensor *x_gpu = em_to(x, device);
    SEED_CHECK(x_gpu);
    print_device_of("x.to(device).device: ", x_gpu); /* device(type='cuda', index=0) */
    /* x_fp16 = x.to(device=device, dtype=torch.float16) */
    em_tensor *x_fp16 = em_to_device_dtype(x, other, EM_F16, false);
    SEED_CHECK(x_fp16);
    printf("x.to(%s, float16): dtype %s, device %s\n", em_device_str(other).s, em_dtype_name(em_dtype_of(x_fp16)),
           em_device_str(em_device_of(x_fp16)).s); /* torch.float16, device(type='cuda', index=0) */
    print_tensor("x_fp16: ", x_fp16);

    em_tensor *r = em_randn(EM_SHAPE(3, 3), EM_OPTS(0));
    em_tensor *rc = em_to(r, EM_DEVICE(EM_CUDA, -1)); /* x.cuda() */
    if (rc) print_device_of("x.cuda(): ", rc);
    else print_expected_error("x.cuda()");
    em_tensor *rc1 = em_to(r, EM_DEVICE(EM_CUDA, 1)); /* x.cuda(1) */
    if (rc1) print_device_of("x.cuda(1): ", rc1);
    else print_expected_error("x.cuda(1)");
    em_tensor *r_gpu = em_to(r, other);
    em_tensor *x_cpu = em_cpu(r_gpu);  /* x_cpu = x_gpu.cpu() */
    em_tensor *x_same = em_cpu(x_cpu); /* already there: no copy, the tensor itself */
    SEED_CHECK(x_cpu && x_same);
    printf("x_same is x_cpu: %s\n", py_bool(x_same == x_cpu));                  /* True */
    printf("x_gpu.cpu() is x_gpu: %s\n", py_bool(x_cpu == r_gpu));              /* False with a second device */
    printf("shares storage with x_gpu: %s\n", py_bool(em_shares_storage(x_cpu, r_gpu)));
}

static void mismatch_and_host_access(em_device other) {
    printf("\n== Tensors on two devices, and host access\n");
    static const float a[] = {1, 2}, b[] = {3, 4};
    em_tensor *x_cpu = em_from_data(a, EM_F32, EM_SHAPE(2), EM_OPTS(0));
    em_tensor *x_gpu = em_to(em_from_data(b, EM_F32, EM_SHAPE(2), EM_OPTS(0)), other);
    SEED_CHECK(x_cpu && x_gpu);
    if (em_device_of(x_gpu).type != EM_CPU) {
        em_tensor *bad = em_add(x_cpu, x_gpu); /* RuntimeError: Expected all tensors to be on the same device */
        if (bad) {
            fprintf(stderr, "adding tensors on two devices did not fail\n");
            exit(1);
        }
        print_expected_error("x_cpu + x_gpu");
    } else {
        printf("x_cpu + x_gpu: only the CPU here, so both are on it and nothing fails\n");
    }
    em_tensor *result = em_add(em_to(x_cpu, em_device_of(x_gpu)), x_gpu); /* x_cpu.to(x_gpu.device) + x_gpu */
    SEED_CHECK(result);
    print_tensor("x_cpu.to(x_gpu.device) + x_gpu: ", result); /* tensor([4., 6.], device=...) */

    /* x_gpu.numpy() fails; x_gpu.cpu().numpy() works: host pointers exist only on the CPU */
    em_tensor *g = em_to(em_randn(EM_SHAPE(3, 3), EM_OPTS(0)), other);
    SEED_CHECK(g);
    if (em_device_of(g).type != EM_CPU) {
        void *p = em_data_ptr(g);
        if (p) {
            fprintf(stderr, "em_data_ptr of a %s tensor returned a pointer\n", em_device_str(em_device_of(g)).s);
            exit(1);
        }
        print_expected_error("em_data_ptr(x_gpu)");
    }
    em_tensor *host = em_contiguous(em_cpu(g));
    float *x_np = em_data_ptr(host);
    SEED_CHECK(x_np);
    printf("em_data_ptr(x_gpu.cpu()): a float * to %lld elements, first %.4f\n", (long long)em_numel(host), x_np[0]);

    /* x = torch.randn(3, 3, requires_grad=True).cuda(); x.detach().cpu().numpy() */
    em_tensor *w = em_to(em_randn(EM_SHAPE(3, 3), EM_OPTS(.requires_grad = true)), other);
    em_tensor *w_host = em_contiguous(em_cpu(em_detach(w)));
    SEED_CHECK(w_host && em_data_ptr(w_host));
    printf("x.detach().cpu(): on %s, float * %s\n", em_device_str(em_device_of(w_host)).s,
           em_data_ptr(w_host) ? "available" : "missing");
}

/* torch.cuda.set_device(1); with torch.cuda.device(2): ... -- on the type that has devices. */
static void current_device(void) {
    printf("\n== The current device\n");
    em_device_type t = em_device_available(EM_CUDA) ? EM_CUDA : em_device_available(EM_OPENCL) ? EM_OPENCL : EM_CPU;
    int n = t == EM_CPU ? 1 : em_device_count(t);
    const char *name = em_device_type_name(t);
    printf("%s device count: %d\n", name, n); /* torch.cuda.device_count() */
    if (t == EM_CPU) {
        printf("no GPU and no OpenCL device: the CPU has no current-device choice\n");
        return;
    }
    em_device start = em_device_current(t);
    printf("current %s device: %s\n", name, em_device_str(start).s);
    if (n > 1) { /* torch.cuda.set_device(1) */
        SEED_CHECK(em_device_set_current(EM_DEVICE(t, 1)) == EM_OK);
        printf("after set_current(%s:1): \"%s\" means %s\n", name, name,
               em_device_str(em_device_resolve(EM_DEVICE(t, -1))).s);
    } else if (em_device_set_current(EM_DEVICE(t, 1)) != EM_OK) {
        print_expected_error("set_current(:1)"); /* there is no device 1 */
    }
    /* with torch.cuda.device(2): the guard changes what "cuda" (no index) means, until its end */
    int g = n > 2 ? 2 : 0; /* another device than the current one where there are two */
    em_device_guard guard = em_device_guard_begin(EM_DEVICE(t, g));
    SEED_CHECK(guard.active);
    em_tensor *on_current = em_randn(EM_SHAPE(3, 3), EM_OPTS(.device = EM_DEVICE(t, -1)));
    em_tensor *no_device = em_randn(EM_SHAPE(3, 3), EM_OPTS(0));
    SEED_CHECK(on_current && no_device);
    printf("inside the guard for %s:%d: randn(device=\"%s\") is on %s\n", name, g, name,
           em_device_str(em_device_of(on_current)).s); /* device(type='cuda', index=2) */
    /* The seed says torch.randn(3, 3) inside the guard is on GPU 2; in PyTorch it is on the
     * CPU (a guard changes the current GPU, not the default device), and so it is here. */
    printf("inside the guard: randn() without a device is on %s\n", em_device_str(em_device_of(no_device)).s);
    em_device_guard_end(guard);
    printf("after the guard: \"%s\" means %s again\n", name, em_device_str(em_device_resolve(EM_DEVICE(t, -1))).s);
    SEED_CHECK(em_device_set_current(start) == EM_OK); /* undo set_current(1) */
}

/* The portable pattern: device chosen automatically; model and every batch on it.
 * model = nn.Linear(10, 5).to(device)
 * for batch_x, batch_y in dataloader: batch_x.to(device); batch_y.to(device);
 *     output = model(batch_x); loss = criterion(output, batch_y)
 * The seed stops at the loss; backward and an Adam step complete the loop. The targets
 * are a fixed linear map of the inputs, so the loss must fall. Returns the last loss. */
static double portable_loop(em_device device) {
    printf("\n== Portable training loop on %s\n", em_device_str(device).s);
    /* Regression data: 256 samples of 10 features, float targets y = x A (A fixed, 10 x 5);
     * a dataset keeps floating targets as they are, [N, 5] float32 here. */
    enum { N = 256 };
    em_tensor *x_all = em_randn(EM_SHAPE(N, 10), EM_OPTS(0));
    em_tensor *y_all = em_matmul(x_all, em_randn(EM_SHAPE(10, 5), EM_OPTS(0)));
    em_dataset *dataset = em_dataset_new(x_all, y_all);
    /* DataLoader(dataset, batch_size=32, shuffle=True); batches go to the device inside
     * the loader (what batch_x.to(device) in the loop does), from pinned host memory. */
    em_loader *dataloader = em_loader_new(dataset, (em_loader_opts){
        .batch_size = 32, .shuffle = true, .seed = 4, .pin_memory = true, .device = device});
    em_module *model = em_nn_linear(10, 5); /* model = nn.Linear(10, 5).to(device) */
    SEED_CHECK(dataset && dataloader && model && em_module_to(model, device) == EM_OK);
    SEED_CHECK(module_on(model, device));
    em_optimizer *optimizer = em_adam(model, 0.05); /* optimizer = torch.optim.Adam(model.parameters(), lr=0.05) */
    SEED_CHECK(optimizer);
    double first = 0, last = 0;
    for (int epoch = 0; epoch < 10; epoch++) {
        double total = 0;
        int n = 0;
        for (em_batch b = em_loader_iter(dataloader); em_loader_next(dataloader, &b);) { /* for batch_x, batch_y in dataloader: */
            em_scope s = em_scope_begin();
            em_tensor *batch_x = em_to(b.x, device); /* already there: the same data, no copy */
            em_tensor *batch_y = em_to(b.y, device); /* [32, 5] float32, already there too */
            SEED_CHECK(batch_x && batch_y && em_device_equal(em_device_of(batch_x), device));
            em_tensor *output = em_forward(model, batch_x);  /* output = model(batch_x) */
            em_tensor *loss = em_mse_loss(output, batch_y);  /* loss = criterion(output, batch_y) */
            SEED_CHECK(em_zero_grad(optimizer) == EM_OK);    /* optimizer.zero_grad() */
            SEED_CHECK(em_backward(loss) == EM_OK);          /* loss.backward() */
            SEED_CHECK(em_step(optimizer) == EM_OK);         /* optimizer.step() */
            total += loss_value(loss);                       /* loss.item() */
            n++;
            em_scope_end(s);
        }
        SEED_CHECK(!em_failed() && n == N / 32);
        last = total / n;
        if (epoch == 0) first = last;
        if (epoch % 3 == 0 || epoch == 9) printf("epoch %d: mean loss %.4f\n", epoch, last);
    }
    /* the trained weights back on the host: model.cpu(); the handle is still model.weight */
    em_tensor *weight = module_param(model, "weight");
    SEED_CHECK(em_module_to(model, EM_DEVICE_CPU) == EM_OK && module_on(model, EM_DEVICE_CPU));
    SEED_CHECK(weight == module_param(model, "weight") && em_data_ptr(weight));
    printf("loss %.4f -> %.4f; model.weight back on %s\n", first, last, em_device_str(em_device_of(weight)).s);
    SEED_CHECK(last < 0.05 * first); /* a linear map is learned almost exactly */
    em_optim_free(optimizer);
    em_module_free(model);
    em_loader_free(dataloader);
    em_dataset_free(dataset);
    return last;
}

int main(void) {
    em_scope scope = em_scope_begin();
    em_manual_seed(4);
    where_tensors_live();
    em_device device = detect();
    /* Without CUDA, the moves are shown between the CPU and the next device there is. */
    em_device other = device.type == EM_CPU ? second_device() : device;
    device_objects();
    moving(device, other);
    mismatch_and_host_access(other);
    current_device();
    /* device = cuda -> mps -> (OpenCL GPU) -> cpu, as the seed's chain */
    em_device device_auto = em_device_auto();
    printf("\ndevice: %s (%s)\n", em_device_str(device_auto).s, em_device_auto_reason());
    em_manual_seed(4);
    double loss_auto = portable_loop(device_auto);
    /* The same loop on an OpenCL device when there is one (PoCL runs on the CPU): the same
     * seed gives the same data and initial weights, so the result must agree. */
    if (em_device_available(EM_OPENCL) && device_auto.type != EM_OPENCL) {
        em_manual_seed(4);
        double loss_cl = portable_loop(EM_DEVICE(EM_OPENCL, 0));
        printf("last loss on %s %.6f, on opencl:0 %.6f\n", em_device_str(device_auto).s, loss_auto, loss_cl);
        SEED_CHECK(fabs(loss_cl - loss_auto) <= 1e-3 * loss_auto + 1e-5);
    }
    em_scope_end(scope);
    SEED_CHECK(!em_failed());
    return 0;
}
