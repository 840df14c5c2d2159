/* Training checkpoints (em_checkpoint_save / em_checkpoint_load): a run continued from a
 * checkpoint takes exactly the steps the original run takes; errors change nothing; a
 * process killed while saving leaves the previous checkpoint intact. */
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "test.h"

static char dir[64];
static int temp_files(const char *name, off_t *largest);

static em_module *small_model(void) {
    return em_nn_sequential(em_nn_linear(6, 5), em_nn_relu(), em_nn_linear(5, 3));
}

/* One step of training on fixed data; returns the loss. */
static double step(em_module *m, em_optimizer *o, em_tensor *x, em_tensor *y) {
    em_scope s = em_scope_begin();
    em_tensor *loss = em_cross_entropy(em_forward(m, x), y, 0.0);
    CHECK(em_zero_grad(o) == EM_OK && em_backward(loss) == EM_OK && em_step(o) == EM_OK);
    double v = em_item(loss);
    em_scope_end(s);
    return v;
}

static double max_param_diff(em_module *a, em_module *b) {
    em_named_tensor pa[8], pb[8];
    int n = em_module_parameters(a, pa, 8);
    CHECK(n == em_module_parameters(b, pb, 8));
    double worst = 0;
    for (int i = 0; i < n; i++) {
        em_scope s = em_scope_begin();
        double d = em_item(em_max(em_abs(em_sub(em_cpu(pa[i].tensor), em_cpu(pb[i].tensor))), EM_ALL_DIMS, false));
        worst = d > worst ? d : worst;
        em_scope_end(s);
    }
    return worst;
}

typedef em_optimizer *(*make_opt)(em_module *);
static em_optimizer *make_adam(em_module *m) { return em_adam(m, 0.01); }
static em_optimizer *make_amsgrad(em_module *m) {
    em_adam_opts a = em_adamw_defaults(0.01);
    a.amsgrad = true;
    return em_adamw_ex(m, a);
}
static em_optimizer *make_sgd(em_module *m) {
    em_sgd_opts s = em_sgd_defaults(0.1);
    s.momentum = 0.9;
    s.nesterov = true;
    return em_sgd_ex(m, s);
}

/* Train 3 steps, save, train 3 more; a fresh model loaded from the file and trained 3
 * steps must end bit for bit where the first did (on device dev). */
static void roundtrip(make_opt make, em_device dev, const char *label) {
    char path[128];
    snprintf(path, sizeof path, "%s/roundtrip.safetensors", dir);
    em_scope s = em_scope_begin();
    em_manual_seed(11);
    em_tensor *x = em_to(em_randn(EM_SHAPE(8, 6), EM_OPTS(0)), dev);
    em_tensor *y = em_to(em_from_data((int64_t[]){0, 1, 2, 0, 1, 2, 0, 1}, EM_I64, EM_SHAPE(8), EM_OPTS(.dtype = EM_I64)), dev);
    em_module *a = small_model(), *b = small_model();  /* b starts from other weights */
    CHECK(em_module_to(a, dev) == EM_OK && em_module_to(b, dev) == EM_OK);
    em_optimizer *oa = make(a), *ob = make(b);
    for (int i = 0; i < 3; i++) step(a, oa, x, y);
    const char *keys[] = {"epoch", "note"}, *vals[] = {"7", "a \"quoted\" value"};
    CHECK(em_checkpoint_save(path, a, oa, keys, vals, 2) == EM_OK);
    for (int i = 0; i < 3; i++) step(a, oa, x, y);
    em_safetensors *meta = NULL;
    CHECK(em_checkpoint_load(path, b, ob, &meta) == EM_OK);
    CHECK(meta && !strcmp(em_safetensors_metadata(meta, "epoch"), "7"));
    CHECK(meta && !strcmp(em_safetensors_metadata(meta, "note"), "a \"quoted\" value"));
    em_safetensors_free(meta);
    CHECK(em_optim_steps(ob) == 3);
    for (int i = 0; i < 3; i++) step(b, ob, x, y);
    double d = max_param_diff(a, b);
    printf("  %s on %s: continued from the checkpoint vs uninterrupted: max |difference| %g\n", label,
           em_device_str(dev).s, d);
    CHECK(d == 0);
    /* the state lives on the parameters' device */
    em_named_tensor p[1];
    em_module_parameters(b, p, 1);
    em_tensor *st = em_optim_state(ob, p[0].tensor, strcmp(label, "sgd") ? "exp_avg" : "momentum_buffer");
    CHECK(st && em_device_equal(em_device_of(st), dev));
    em_optim_free(oa);
    em_optim_free(ob);
    em_module_free(a);
    em_module_free(b);
    em_scope_end(s);
    CHECK(!em_failed());
    em_clear_error();
}

static void test_roundtrip_continues_exactly(void) {
    roundtrip(make_adam, EM_DEVICE_CPU, "adam");
    roundtrip(make_amsgrad, EM_DEVICE_CPU, "adamw+amsgrad");
    roundtrip(make_sgd, EM_DEVICE_CPU, "sgd");
    if (em_device_available(EM_OPENCL)) {
        roundtrip(make_adam, EM_DEVICE(EM_OPENCL, 0), "adam");
        roundtrip(make_sgd, EM_DEVICE(EM_OPENCL, 0), "sgd");
    } else {
        test_skip_case("test_roundtrip_continues_exactly (OpenCL part)", "no OpenCL device: %s", em_device_unavailable_reason(EM_OPENCL));
    }
}

/* Every error leaves the module and optimizer as they were. */
static void test_errors_change_nothing(void) {
    char path[128], plain[128];
    snprintf(path, sizeof path, "%s/adam.safetensors", dir);
    snprintf(plain, sizeof plain, "%s/plain.safetensors", dir);
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_SHAPE(4, 6), EM_OPTS(0));
    em_tensor *y = em_from_data((int64_t[]){0, 1, 2, 0}, EM_I64, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64));
    em_module *a = small_model();
    em_optimizer *adam = em_adam(a, 0.01);
    step(a, adam, x, y);
    CHECK(em_checkpoint_save(path, a, adam, NULL, NULL, 0) == EM_OK);
    CHECK(em_module_save(a, plain) == EM_OK);

    em_module *b = small_model();
    em_optimizer *sgd = em_sgd(b, 0.1);
    em_named_tensor pb[1];
    em_module_parameters(b, pb, 1);
    em_tensor *w0 = em_clone(pb[0].tensor);
    CHECK(em_checkpoint_load(path, b, sgd, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "holds adam state, but the optimizer is sgd");
    CHECK(em_item(em_max(em_abs(em_sub(w0, pb[0].tensor)), EM_ALL_DIMS, false)) == 0);
    CHECK(em_checkpoint_load(plain, b, NULL, NULL) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "is not an Ember checkpoint");
    em_module *wide = em_nn_sequential(em_nn_linear(6, 7), em_nn_relu(), em_nn_linear(7, 3));
    em_optimizer *wide_adam = em_adam(wide, 0.01);
    CHECK(em_checkpoint_load(path, wide, wide_adam, NULL) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "shape");
    CHECK(em_optim_steps(wide_adam) == 0);
    /* the model alone: a checkpoint also loads with em_module_load and without an optimizer */
    CHECK(em_module_load(b, path) == EM_OK);
    CHECK(em_checkpoint_load(path, b, NULL, NULL) == EM_OK);
    CHECK(em_checkpoint_save(path, a, adam, (const char *[]){"format"}, (const char *[]){"x"}, 1) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "reserved");
    CHECK(em_checkpoint_save(NULL, a, adam, NULL, NULL, 0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "must not be NULL");
    CHECK(em_checkpoint_save(path, a, adam, NULL, NULL, 1) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "NULL array");
    CHECK(em_checkpoint_load(path, NULL, NULL, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "must not be NULL");
    CHECK(em_safetensors_save_meta(path, NULL, NULL, 0, (const char *[]){NULL}, (const char *[]){"v"}, 1) ==
          EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "metadata entry 0 is NULL");
    CHECK(em_checkpoint_load(path, b, NULL, NULL) == EM_OK);   /* the failed saves left the file intact */
    CHECK(em_checkpoint_load("/nonexistent/ckpt.safetensors", b, NULL, NULL) != EM_OK);
    CHECK(strstr(em_last_error(), "/nonexistent/ckpt.safetensors") != NULL);
    em_clear_error();
    em_optim_free(wide_adam);
    em_module_free(wide);
    em_optim_free(sgd);
    em_module_free(b);
    em_optim_free(adam);
    em_module_free(a);
    em_scope_end(s);
}

/* A checkpoint loaded once with em_safetensors_load serves the model, the optimizer and the
 * estimate (the file is not opened again: it is removed before they run), and the same
 * checks hold as for the path forms; bad arguments are errors, never crashes. */
static void test_load_from_one_read(void) {
    char path[128], plain[128], ints[128];
    snprintf(path, sizeof path, "%s/once.safetensors", dir);
    snprintf(plain, sizeof plain, "%s/once_plain.safetensors", dir);
    snprintf(ints, sizeof ints, "%s/once_ints.safetensors", dir);
    em_scope s = em_scope_begin();
    em_manual_seed(5);
    em_tensor *x = em_randn(EM_SHAPE(4, 6), EM_OPTS(0));
    em_tensor *y = em_from_data((int64_t[]){0, 1, 2, 0}, EM_I64, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64));
    em_module *a = small_model(), *b = small_model();
    em_optimizer *oa = em_adam(a, 0.01), *ob = em_adam(b, 0.01);
    for (int i = 0; i < 2; i++) step(a, oa, x, y);
    CHECK(em_checkpoint_save(path, a, oa, (const char *[]){"epoch"}, (const char *[]){"2"}, 1) == EM_OK);
    CHECK(em_module_save(a, plain) == EM_OK);
    em_safetensors *file = em_safetensors_load(path, EM_DEVICE_CPU);
    CHECK(file != NULL);
    CHECK(file && !strcmp(em_safetensors_path(file), path));
    CHECK(remove(path) == 0);   /* nothing below may open it again */
    CHECK(em_checkpoint_load_safetensors(file, b, ob) == EM_OK);
    CHECK(!strcmp(em_safetensors_metadata(file, "epoch"), "2"));   /* still the caller's */
    CHECK(em_optim_steps(ob) == 2 && max_param_diff(a, b) == 0);
    step(a, oa, x, y);
    step(b, ob, x, y);
    CHECK(max_param_diff(a, b) == 0);   /* the optimizer's state came along */
    em_module *c = small_model();
    CHECK(em_module_load_safetensors(c, file) == EM_OK);   /* the optimizer's tensors are ignored */
    em_estimate e;
    CHECK(em_estimate_safetensors(file, &(em_estimate_opts){.mode = EM_ESTIMATE_INFERENCE}, &e) == EM_OK);
    CHECK(e.params == (double)em_module_num_parameters(a));
    CHECK(e.layers == 2);   /* the two Linear weights */
    em_safetensors_free(file);
    /* the checks of the path forms */
    em_safetensors *pf = em_safetensors_load(plain, EM_DEVICE_CPU);
    CHECK(em_checkpoint_load_safetensors(pf, b, NULL) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "once_plain.safetensors is not an Ember checkpoint");
    em_module *wide = em_nn_sequential(em_nn_linear(6, 7), em_nn_relu(), em_nn_linear(7, 3));
    CHECK(em_module_load_safetensors(wide, pf) == EM_ERR_FORMAT);
    CHECK_ERROR(EM_ERR_FORMAT, "once_plain.safetensors");
    em_safetensors_free(pf);
    CHECK(em_checkpoint_load_safetensors(NULL, b, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "must not be NULL");
    CHECK(em_module_load_safetensors(b, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "'file' is NULL");
    CHECK(em_estimate_safetensors(NULL, &(em_estimate_opts){0}, &e) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "NULL argument");
    CHECK(em_safetensors_path(NULL) == NULL);
    /* a state dict of integer tensors has no parameters: the estimate says what it found */
    em_tensor *idx = em_arange(0, 4, 1, EM_OPTS(.dtype = EM_I64));
    CHECK(em_safetensors_save(ints, (const char *[]){"index"}, &idx, 1) == EM_OK);
    CHECK(em_estimate_checkpoint(ints, &(em_estimate_opts){.mode = EM_ESTIMATE_INFERENCE}, &e) == EM_ERR_DTYPE);
    CHECK_ERROR(EM_ERR_DTYPE, "the file's 1 tensor is integer or bool ('index' is int64)");
    em_module_free(wide);
    em_module_free(c);
    em_optim_free(oa);
    em_optim_free(ob);
    em_module_free(a);
    em_module_free(b);
    remove(plain);
    remove(ints);
    em_scope_end(s);
}

/* An optimizer saved or loaded with a model it was not made for is refused, and nothing is
 * written: its state is keyed by the module's parameter names, so the file would hold none of
 * it and could not be loaded back into either pair. */
static void test_optimizer_of_another_model_refused(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/mismatch.safetensors", dir);
    remove(path);
    em_scope s = em_scope_begin();
    em_module *a = small_model(), *b = small_model();
    em_optimizer *oa = em_adam(a, 0.01), *ob = em_adam(b, 0.01);
    em_tensor *x = em_randn(EM_SHAPE(4, 6), EM_OPTS(0));
    em_tensor *y = em_from_data((int64_t[]){0, 1, 2, 0}, EM_I64, EM_SHAPE(4), EM_OPTS(.dtype = EM_I64));
    step(b, ob, x, y);
    CHECK(em_checkpoint_save(path, a, ob, NULL, NULL, 0) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "is not a parameter of the module");
    struct stat st;
    CHECK(stat(path, &st) != 0);   /* nothing written */
    off_t largest;
    CHECK(temp_files("mismatch.safetensors", &largest) == 0);
    /* the same pair on loading: a good file of (a, oa) into a with b's optimizer */
    CHECK(em_checkpoint_save(path, a, oa, NULL, NULL, 0) == EM_OK);
    CHECK(em_checkpoint_load(path, a, ob, NULL) == EM_ERR_ARGUMENT);
    CHECK_ERROR(EM_ERR_ARGUMENT, "is not a parameter of the module");
    CHECK(em_optim_steps(ob) == 1);
    CHECK(em_checkpoint_load(path, a, oa, NULL) == EM_OK);
    em_optim_free(oa);
    em_optim_free(ob);
    em_module_free(a);
    em_module_free(b);
    em_scope_end(s);
    em_clear_error();
}

/* Temporary files the atomic writer left in dir for name (".name.tmp.*"). */
static int temp_files(const char *name, off_t *largest) {
    DIR *d = opendir(dir);
    int n = 0;
    char prefix[128];
    snprintf(prefix, sizeof prefix, ".%s.tmp.", name);
    *largest = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
        char p[400];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) == 0 && st.st_size > *largest) *largest = st.st_size;
        n++;
    }
    if (d) closedir(d);
    return n;
}

/* A child saves a large checkpoint over a valid one again and again; it is killed with
 * SIGKILL while a temporary file is being written. The file must still load, whole, with
 * the old values. */
static void test_kill_while_saving_keeps_old_checkpoint(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/big.safetensors", dir);
    enum { IN = 2048, OUT = 2048 };   /* 16 MiB of weights, 48 MiB with Adam's two states */
    em_module *m = em_nn_linear(IN, OUT);
    em_optimizer *o = em_adam(m, 0.01);
    em_named_tensor p[2];
    em_module_parameters(m, p, 2);
    em_scope s = em_scope_begin();
    em_grad_mode g = em_no_grad_begin();   /* in-place on parameters, as under torch.no_grad() */
    CHECK(em_fill_(p[0].tensor, 1.0) == EM_OK && em_fill_(p[1].tensor, 1.0) == EM_OK);
    em_no_grad_end(g);
    CHECK(em_checkpoint_save(path, m, o, (const char *[]){"version"}, (const char *[]){"old"}, 1) == EM_OK);
    int killed_mid_write = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            /* new values, and Adam state, so the file grows */
            em_tensor *x = em_randn(EM_SHAPE(4, IN), EM_OPTS(0));
            em_tensor *loss = em_sum(em_forward(m, x), EM_ALL_DIMS, false);
            em_backward(loss);
            em_step(o);
            for (;;) em_checkpoint_save(path, m, o, (const char *[]){"version"}, (const char *[]){"new"}, 1);
        }
        CHECK(pid > 0);
        off_t size = 0;
        /* wait until a temporary file is half written, then kill */
        for (int i = 0; i < 20000 && size < 20 * 1024 * 1024; i++) {
            temp_files("big.safetensors", &size);
            if (size < 20 * 1024 * 1024) nanosleep(&(struct timespec){0, 100 * 1000}, NULL);
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        off_t left;
        int n = temp_files("big.safetensors", &left);
        killed_mid_write += n > 0 && left > 0;
        /* the checkpoint loads whole: either the old one or a complete new one */
        em_module *r = em_nn_linear(IN, OUT);
        em_optimizer *ro = em_adam(r, 0.01);
        em_safetensors *meta = NULL;
        CHECK(em_checkpoint_load(path, r, ro, &meta) == EM_OK);
        const char *version = meta ? em_safetensors_metadata(meta, "version") : NULL;
        em_named_tensor rp[1];
        em_module_parameters(r, rp, 1);
        double lo = em_item(em_min(rp[0].tensor, EM_ALL_DIMS, false)), hi = em_item(em_max(rp[0].tensor, EM_ALL_DIMS, false));
        bool old = version && !strcmp(version, "old") && lo == 1 && hi == 1;
        bool whole_new = version && !strcmp(version, "new") && em_optim_steps(ro) == 1;
        CHECK(old || whole_new);
        em_safetensors_free(meta);
        em_optim_free(ro);
        em_module_free(r);
        /* what a crash leaves behind is a hidden temporary file, never the checkpoint */
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -f '%s'/.big.safetensors.tmp.*", dir);
        CHECK(system(cmd) == 0);
        if (whole_new) {   /* start the next attempt from an old file again */
            CHECK(em_checkpoint_save(path, m, o, (const char *[]){"version"}, (const char *[]){"old"}, 1) == EM_OK);
        }
    }
    printf("  killed during a write in %d of 3 attempts; the checkpoint loaded whole every time\n", killed_mid_write);
    CHECK(killed_mid_write >= 1);
    em_scope_end(s);
    em_optim_free(o);
    em_module_free(m);
    em_clear_error();
}

int main(void) {
    /* a fresh folder of its own (a fixed name per pid can meet a killed run's leftover) */
    snprintf(dir, sizeof dir, "/tmp/ember_test_ckpt_XXXXXX");
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    RUN(test_roundtrip_continues_exactly);
    RUN(test_errors_change_nothing);
    RUN(test_load_from_one_read);
    RUN(test_kill_while_saving_keeps_old_checkpoint);
    RUN(test_optimizer_of_another_model_refused);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
