/* The seed's MLP, its data and its evaluation, shared by `ember train` and `ember eval`. */
#define _POSIX_C_SOURCE 200809L
#include "mlp.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

em_module *mlp_new(void) {
    return em_nn_sequential(em_nn_linear(784, 256), em_nn_relu(), em_nn_linear(256, 10));
}

em_dataset *mlp_dataset(const char *dir, bool train, int64_t limit, const char *opt) {
    em_dataset *full = em_dataset_fashion_mnist(dir, train);
    if (!full) return NULL;
    int64_t n = em_dataset_len(full);
    const char *split = train ? "training" : "test";
    if (n == 0 || limit > n) {
        if (n == 0) em_error(EM_ERR_FORMAT, "the Fashion-MNIST %s split holds no samples: nothing to %s", split,
                             train ? "train on" : "test on");
        else em_error(EM_ERR_ARGUMENT, "%s %lld: the Fashion-MNIST %s split has only %lld samples", opt,
                      (long long)limit, split, (long long)n);
        em_dataset_free(full);
        return NULL;
    }
    if (limit <= 0) limit = n;
    /* [N, 1, 28, 28] images as [N, 784] rows: x.view(-1, 784), the seed's flattening */
    em_scope s = em_scope_begin();
    em_tensor *x = em_narrow(em_dataset_x(full), 0, 0, limit), *y = em_narrow(em_dataset_y(full), 0, 0, limit);
    if (limit < n) x = em_clone(x), y = em_clone(y);   /* a copy: the rest of the file is freed */
    em_dataset *part = em_dataset_new(em_reshape(x, EM_SHAPE(limit, 784)), y);
    em_scope_end(s);
    em_dataset_free(full);
    return part;
}

em_status mlp_evaluate(em_module *m, const em_dataset *ds, em_device device, int64_t batch_size, mlp_eval *out) {
    *out = (mlp_eval){0};
    em_loader *l = em_loader_new(ds, (em_loader_opts){.batch_size = batch_size, .device = device,
                                                      .pin_memory = device.type != EM_CPU});
    if (!l) return em_last_status();
    bool was_training = em_module_is_training(m);
    em_module_eval(m);
    em_grad_mode g = em_no_grad_begin();
    double t0 = mlp_now();
    em_scope s = em_scope_begin();
    /* correct answers and summed loss accumulate on the device: one read at the end */
    em_tensor *correct = em_zeros(EM_SHAPE0, EM_OPTS(.device = device, .dtype = EM_I64));
    em_tensor *loss_sum = em_zeros(EM_SHAPE0, EM_OPTS(.device = device, .dtype = EM_F64));
    em_batch b;
    em_status st = correct && loss_sum ? EM_OK : em_last_status();
    while (st == EM_OK && em_loader_next(l, &b)) {
        em_scope step = em_scope_begin();
        em_tensor *logits = em_forward(m, b.x);
        em_tensor *hits = em_sum(em_eq(em_argmax(logits, 1, false), b.y), EM_ALL_DIMS, false);
        em_tensor *loss = em_mul_scalar(em_cross_entropy(logits, b.y, 0.0), (double)b.size);
        st = em_add_(correct, hits, 1.0);
        if (st == EM_OK) st = em_add_(loss_sum, loss, 1.0);
        out->samples += b.size;
        em_scope_end(step);
    }
    if (st == EM_OK && em_failed()) st = em_last_status();   /* the loader stopped on an error */
    if (st == EM_OK && out->samples > 0) {
        out->accuracy = em_item(correct) / (double)out->samples;
        out->loss = em_item(loss_sum) / (double)out->samples;
        st = em_failed() ? em_last_status() : EM_OK;
    }
    out->seconds = mlp_now() - t0;
    em_scope_end(s);
    em_no_grad_end(g);
    if (was_training) em_module_train(m);
    em_loader_free(l);
    return st;
}

bool mlp_parse_device(const char *tool, const char *what, const char *s, em_device *out) {
    if (!strcmp(s, "auto")) return mlp_default_device(tool, out);
    if (em_device_parse(s, out) != EM_OK) {
        fprintf(stderr, "%s: %s: %s\n", tool, what, em_last_error());
        em_clear_error();
        return false;
    }
    if (out->type != EM_CPU && !em_device_available(out->type)) {
        const char *why = em_device_unavailable_reason(out->type);
        fprintf(stderr, "%s: %s: device %s is not available%s%s\n", tool, what, s, why ? ": " : "", why ? why : "");
        em_clear_error();
        return false;
    }
    if (out->index < 0) out->index = 0;
    if (out->type != EM_CPU && out->index >= em_device_count(out->type)) {
        fprintf(stderr, "%s: %s: device %s does not exist: %d %s device%s found\n", tool, what, s,
                em_device_count(out->type), em_device_type_name(out->type), em_device_count(out->type) == 1 ? "" : "s");
        em_clear_error();
        return false;
    }
    return true;
}

bool mlp_default_device(const char *tool, em_device *out) {
    /* em_device_auto() passes over a bad EMBER_DEVICE (a library must not fail on it);
     * a command that was told where to run must not run elsewhere */
    const char *env = getenv("EMBER_DEVICE");
    if (env && *env && strcmp(env, "auto")) return mlp_parse_device(tool, "EMBER_DEVICE", env, out);
    *out = em_device_auto();
    return true;
}

bool mlp_check_memory_env(const char *tool, const em_device *devices, int n) {
    for (int i = -1; i < n; i++)
        if (em_memory_check_env(i < 0 ? EM_DEVICE_CPU : devices[i]) != EM_OK) {
            fprintf(stderr, "%s: %s\n", tool, em_last_error());
            em_clear_error();
            return false;
        }
    return true;
}

bool mlp_check_output(const char *tool, const char *opt, const char *path) {
    size_t n = strlen(path);
    if (n == 0) {
        fprintf(stderr, "%s: %s is empty: expected a file path\n", tool, opt);
        return false;
    }
    if (n >= PATH_MAX) {
        fprintf(stderr, "%s: %s is %zu bytes long: the limit is %d bytes (PATH_MAX)\n", tool, opt, n, PATH_MAX - 1);
        return false;
    }
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
        fprintf(stderr, "%s: %s '%s' names a folder: expected a file path\n", tool, opt, path);
        return false;
    }
    if (strlen(base) > NAME_MAX) {
        fprintf(stderr, "%s: %s: the file name is %zu bytes long: the limit is %d bytes (NAME_MAX)\n", tool, opt,
                strlen(base), NAME_MAX);
        return false;
    }
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        fprintf(stderr, "%s: %s '%s' is %s: expected a regular file (it is replaced on every save)\n", tool, opt, path,
                S_ISDIR(st.st_mode) ? "a folder" : "not a regular file");
        return false;
    }
    char dir[PATH_MAX];
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int sr = stat(dir, &st), e = errno;
    if (sr != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: %s '%s': the folder '%s' %s\n", tool, opt, path, dir,
                sr == 0 ? "is not a folder" : e == ENOENT ? "does not exist" : strerror(e));
        return false;
    }
    /* the save writes a temporary file next to the target: make sure one can be made */
    char probe[PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.ember-probe.%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "%s: %s '%s': cannot create a file in the folder '%s': %s\n", tool, opt, path, dir,
                strerror(errno));
        return false;
    }
    close(fd);
    unlink(probe);
    return true;
}

/* Whether a file can be created in the folder dir; prints why not. */
static bool can_create_in(const char *tool, const char *opt, const char *path, const char *dir) {
    char probe[PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.ember-probe.%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "%s: %s '%s': cannot create a file in the folder '%s': %s\n", tool, opt, path, dir,
                strerror(errno));
        return false;
    }
    close(fd);
    unlink(probe);
    return true;
}

bool mlp_check_folder(const char *tool, const char *opt, const char *path) {
    size_t n = strlen(path);
    if (n == 0) {
        fprintf(stderr, "%s: %s is empty: expected a folder\n", tool, opt);
        return false;
    }
    if (n >= PATH_MAX) {
        fprintf(stderr, "%s: %s is %zu bytes long: the limit is %d bytes (PATH_MAX)\n", tool, opt, n, PATH_MAX - 1);
        return false;
    }
    /* the folder itself, or the nearest of its parents that exists: the rest is made */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    for (;;) {
        struct stat st;
        if (stat(dir, &st) == 0) {
            if (!S_ISDIR(st.st_mode)) {
                fprintf(stderr, "%s: %s '%s': '%s' is %s, not a folder\n", tool, opt, path, dir,
                        S_ISREG(st.st_mode) ? "a file" : "a device or another special file");
                return false;
            }
            return can_create_in(tool, opt, path, dir);
        }
        /* missing, or under a file (ENOTDIR): the walk up finds which */
        if ((errno != ENOENT && errno != ENOTDIR) || !strcmp(dir, ".") || !strcmp(dir, "/")) {
            fprintf(stderr, "%s: %s '%s': %s: %s\n", tool, opt, path, dir, strerror(errno));
            return false;
        }
        /* one level up: strip trailing slashes, then the last name */
        size_t len = strlen(dir);
        while (len > 1 && dir[len - 1] == '/') dir[--len] = '\0';
        char *slash = strrchr(dir, '/');
        if (!slash) snprintf(dir, sizeof dir, ".");
        else if (slash == dir) dir[1] = '\0';
        else *slash = '\0';
    }
}

double mlp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mlp_memory_line(em_device d, char *buf, size_t size) {
    char a[32], p[32], r[32];
    em_memory_format_size(em_memory_allocated(d), a, sizeof a);
    em_memory_format_size(em_memory_max_allocated(d), p, sizeof p);
    em_memory_format_size(em_memory_reserved(d), r, sizeof r);
    snprintf(buf, size, "allocated %s, peak %s, reserved %s", a, p, r);
}
