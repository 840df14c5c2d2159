/* The soak: many training steps of the seed's MLP (784-256-10, Adam, batch 64) on
 * Fashion-MNIST (or, without it, random data of the same shape), with an evaluation on the
 * test split and a checkpoint every `every` steps. At each of those points it records the
 * device's allocated and reserved memory, the process's RSS and its open file descriptors.
 * After warm-up (the first 20% of the run, at least two points) it requires allocated and
 * reserved memory to stay exactly where they were, RSS to grow by less than 4 MiB, the
 * number of descriptors not to change after the first point, and the checkpoint directory to hold only the
 * checkpoint; it prints each one's least-squares slope per 1,000 steps.
 * Not a ctest: scripts/soak.sh runs it (CI runs a short form).
 * Usage: soak_train [--steps 20000] [--every 1000] [--device cpu] */
#include <dirent.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ember/ember.h>

typedef struct point {
    long step;
    double alloc, reserved, rss, fds, acc;
} point;

static double rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return (double)resident * (double)sysconf(_SC_PAGESIZE);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return d ? n - (strcmp(dir, "/proc/self/fd") == 0) : -1;   /* opendir's own descriptor */
}

/* Least-squares slope of y over step, per 1,000 steps, from point `from` on. */
static double slope(const point *p, int from, int n, size_t off) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int k = n - from;
    for (int i = from; i < n; i++) {
        double x = (double)p[i].step / 1000.0, y = *(const double *)((const char *)&p[i] + off);
        sx += x, sy += y, sxx += x * x, sxy += x * y;
    }
    double den = k * sxx - sx * sx;
    double b = k > 1 && den != 0 ? (k * sxy - sx * sy) / den : 0.0;
    return fabs(b) < 1e-6 ? 0.0 : b;   /* rounding of a constant series: print 0, not -0.0 */
}

static double evaluate(em_module *m, em_loader *test, em_device dev) {
    em_module_eval(m);
    em_grad_mode g = em_no_grad_begin();
    int64_t right = 0, total = 0;
    for (em_batch b; em_loader_next(test, &b);) {
        em_scope s = em_scope_begin();
        em_tensor *pred = em_argmax(em_forward(m, em_reshape(em_to(b.x, dev), EM_SHAPE(b.size, 784))), 1, false);
        em_tensor *hit = em_sum(em_to_dtype(em_eq(pred, em_to(b.y, dev)), EM_F32), EM_ALL_DIMS, false);
        if (hit) right += (int64_t)em_item(hit);
        total += b.size;
        em_scope_end(s);
    }
    em_no_grad_end(g);
    em_module_train(m);
    return total ? (double)right / (double)total : 0.0;
}

int main(int argc, char **argv) {
    long steps = 20000, every = 1000;
    const char *device = "cpu";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps")) steps = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--every")) every = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else {
            fprintf(stderr, "soak_train: unknown option %s (expected --steps, --every, --device)\n", argv[i]);
            return 2;
        }
    }
    if (steps < 1 || every < 1 || steps / every < 3) {
        fprintf(stderr, "soak_train: need --steps and --every with at least 3 measuring points\n");
        return 2;
    }
    em_device dev;
    if (em_device_parse(device, &dev) != EM_OK) {
        fprintf(stderr, "%s\n", em_last_error());
        return 2;
    }
    char dir[] = "/tmp/ember-soak-XXXXXX", ckpt[64];
    if (!mkdtemp(dir)) return 1;
    snprintf(ckpt, sizeof ckpt, "%s/soak.safetensors", dir);

    em_manual_seed(0);
    em_dataset *train = em_dataset_fashion_mnist(NULL, true), *test = em_dataset_fashion_mnist(NULL, false);
    if (!train || !test) {
        printf("Fashion-MNIST not found (%s): random data of its shape\n", em_last_error());
        em_clear_error();
        em_dataset_free(train);
        em_dataset_free(test);
        em_scope s = em_scope_begin();
        train = em_dataset_new(em_rand(EM_SHAPE(6000, 28, 28), EM_OPTS(0)),
                               em_randint(0, 10, EM_SHAPE(6000), EM_OPTS(.dtype = EM_I64)));
        test = em_dataset_new(em_rand(EM_SHAPE(1000, 28, 28), EM_OPTS(0)),
                              em_randint(0, 10, EM_SHAPE(1000), EM_OPTS(.dtype = EM_I64)));
        em_scope_end(s);
    }
    em_loader *tl = em_loader_new(train, (em_loader_opts){.batch_size = 64, .shuffle = true, .seed = 1});
    em_loader *vl = em_loader_new(test, (em_loader_opts){.batch_size = 1000});
    em_module *m = em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
    em_module_to(m, dev);
    em_optimizer *opt = em_adam(m, 1e-3);
    if (em_failed()) {
        fprintf(stderr, "soak_train: setup failed: %s\n", em_last_error());
        return 1;
    }
    int npoints = (int)(steps / every);
    point *pts = calloc((size_t)npoints, sizeof *pts);
    int n = 0, bad = 0;
    printf("%8s %12s %12s %12s %5s %7s\n", "step", "allocated", "reserved", "rss", "fds", "acc");
    for (long step = 1; step <= steps && !bad; step++) {
        em_batch b;
        if (!em_loader_next(tl, &b) && (em_failed() || !em_loader_next(tl, &b))) {
            fprintf(stderr, "soak_train: loader: %s\n", em_last_error());
            return 1;
        }
        em_scope s = em_scope_begin();
        em_zero_grad(opt);
        em_tensor *x = em_reshape(em_to(b.x, dev), EM_SHAPE(b.size, 784));
        em_tensor *loss = em_cross_entropy(em_forward(m, x), em_to(b.y, dev), 0.0);
        if (!loss || em_backward(loss) != EM_OK || em_step(opt) != EM_OK) bad = 1;
        em_scope_end(s);
        if (step % every) continue;
        double acc = evaluate(m, vl, dev);
        const char *k[] = {"step"};
        char v[32];
        snprintf(v, sizeof v, "%ld", step);
        const char *vals[] = {v};
        if (em_checkpoint_save(ckpt, m, opt, k, vals, 1) != EM_OK) bad = 1;
        em_device_synchronize(dev);
        point p = {step, (double)em_memory_allocated(dev), (double)em_memory_reserved(dev), rss_bytes(),
                   (double)count_entries("/proc/self/fd"), acc};
        pts[n++] = p;
        printf("%8ld %12.0f %12.0f %12.0f %5.0f %6.2f%%\n", step, p.alloc, p.reserved, p.rss, p.fds, 100 * acc);
        fflush(stdout);
        if (count_entries(dir) != 1) {
            fprintf(stderr, "soak_train: %d files in the checkpoint directory (expected 1)\n", count_entries(dir));
            bad = 1;
        }
    }
    if (bad || em_failed()) {
        fprintf(stderr, "soak_train: failed: %s\n", em_last_error());
        return 1;
    }
    int warm = npoints / 5 > 2 ? npoints / 5 : 2;
    double sa = slope(pts, warm, n, offsetof(point, alloc)), sr = slope(pts, warm, n, offsetof(point, reserved));
    double ss = slope(pts, warm, n, offsetof(point, rss)), sf = slope(pts, warm, n, offsetof(point, fds));
    printf("after warm-up (from step %ld): slope per 1000 steps: allocated %.1f B, reserved %.1f B, "
           "RSS %.1f KiB, fds %.3f; RSS grew %.1f KiB; accuracy %.2f%%\n",
           pts[warm].step, sa, sr, ss / 1024, sf, (pts[n - 1].rss - pts[warm].rss) / 1024, 100 * pts[n - 1].acc);
    int fail = 0;
    for (int i = warm; i < n; i++) {
        if (pts[i].alloc != pts[warm].alloc || pts[i].reserved != pts[warm].reserved) {
            fprintf(stderr, "soak_train: device memory moved after warm-up (step %ld)\n", pts[i].step);
            fail = 1;
            break;
        }
    }
    for (int i = 1; i < n; i++)   /* from the first point on: backends open theirs lazily */
        if (pts[i].fds != pts[0].fds) {
            fprintf(stderr, "soak_train: %g open descriptors at step %ld, %g at step %ld\n", pts[i].fds,
                    pts[i].step, pts[0].fds, pts[0].step);
            fail = 1;
            break;
        }
    if (pts[n - 1].rss - pts[warm].rss > 4.0 * 1048576) {
        fprintf(stderr, "soak_train: RSS grew by more than 4 MiB after warm-up\n");
        fail = 1;
    }
    em_loader_free(tl);
    em_loader_free(vl);
    em_dataset_free(train);
    em_dataset_free(test);
    em_optim_free(opt);
    em_module_free(m);
    free(pts);
    remove(ckpt);
    if (rmdir(dir) != 0) {
        fprintf(stderr, "soak_train: %s not empty at the end (a temporary file left behind?)\n", dir);
        fail = 1;
    }
    printf("%s\n", fail ? "FAILED" : "ok");
    return fail;
}
