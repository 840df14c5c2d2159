/* Printing tensors exactly as PyTorch's repr does (torch/_tensor_str.py): one formatter
 * chooses integer, fixed (4 decimals) or scientific notation and a common width from the
 * visible elements; rows wrap at 80 columns; more than 1000 elements are summarised to
 * the first and last 3 entries of each dim. */
#include "core_internal.h"
#include "../util/errors.h"
#include "../util/strbuf.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define LINEWIDTH 80
#define THRESHOLD 1000
#define EDGEITEMS 3

/* The elements, read to the host, and the formatter's choices. */
typedef struct printer {
    const em_tensor *t;
    const unsigned char *data;
    size_t esize;
    int64_t cstride[EM_MAX_DIMS]; /* row-major strides of the host copy */
    bool summarize, floating, int_mode, sci_mode;
    int width;
    /* formatter statistics over nonzero finite visible values */
    bool any;
    double min_abs, max_abs;
} printer;

static double value_at(const printer *p, int64_t i) { return em__load_f64(p->data + i * p->esize, p->t->dtype); }

/* Plain text of one value without padding. */
static int raw_format(const printer *p, int64_t i, char *out, size_t size) {
    em_dtype dt = p->t->dtype;
    if (dt == EM_BOOL) return snprintf(out, size, "%s", p->data[i] ? "True" : "False");
    if (dt == EM_I64) return snprintf(out, size, "%lld", (long long)*(const int64_t *)(p->data + i * 8));
    double v = value_at(p, i);
    if (!p->floating) return snprintf(out, size, "%lld", (long long)v);
    if (isnan(v)) return snprintf(out, size, "nan");
    if (isinf(v)) return snprintf(out, size, v < 0 ? "-inf" : "inf");
    if (p->sci_mode) return snprintf(out, size, "%.4e", v);
    if (p->int_mode) return snprintf(out, size, "%.0f.", v);
    return snprintf(out, size, "%.4f", v);
}

/* Call fn on every element a summarised print shows, in row-major order. */
typedef void (*visit_fn)(printer *p, int64_t i);
static void visit(printer *p, int dim, int64_t base, visit_fn fn) {
    const em_tensor *t = p->t;
    if (dim == t->ndim) {
        fn(p, base);
        return;
    }
    int64_t n = t->shape[dim];
    for (int64_t k = 0; k < n; k++) {
        if (p->summarize && n > 2 * EDGEITEMS && k == EDGEITEMS) k = n - EDGEITEMS;
        visit(p, dim + 1, base + k * p->cstride[dim], fn);
    }
}

static void stat_value(printer *p, int64_t i) {
    double v = value_at(p, i);
    if (!isfinite(v) || v == 0) return;
    double a = fabs(v);
    if (!p->any || a < p->min_abs) p->min_abs = a;
    if (!p->any || a > p->max_abs) p->max_abs = a;
    p->any = true;
    if (v != ceil(v)) p->int_mode = false;
}

static void width_all(printer *p, int64_t i) {
    char buf[64];
    int n = raw_format(p, i, buf, sizeof buf);
    if (n > p->width) p->width = n;
}

static void width_finite(printer *p, int64_t i) {
    double v = value_at(p, i);
    if (isfinite(v) && v != 0) width_all(p, i);
}

static void setup_formatter(printer *p) {
    p->width = 1;
    p->int_mode = true;
    if (!p->floating) {
        visit(p, 0, 0, width_all);
        return;
    }
    visit(p, 0, 0, stat_value);
    if (!p->any) return;
    double ratio = p->max_abs / p->min_abs;
    if (p->int_mode) p->sci_mode = ratio > 1000. || p->max_abs > 1.e8;
    else p->sci_mode = ratio > 1000. || p->max_abs > 1.e8 || p->min_abs < 1.e-4;
    visit(p, 0, 0, width_finite); /* int mode's "." is already in raw_format's text */
}

static void put_value(const printer *p, em_strbuf *b, int64_t i) {
    char buf[64];
    int n = raw_format(p, i, buf, sizeof buf);
    em__sb_spaces(b, p->width - n);
    em__sb_str(b, buf);
}

static void put_vector(const printer *p, em_strbuf *b, int64_t base, int indent) {
    int64_t n = p->t->shape[p->t->ndim - 1], stride = p->cstride[p->t->ndim - 1];
    int64_t per_line = (LINEWIDTH - indent) / (p->width + 2);
    if (per_line < 1) per_line = 1;
    bool cut = p->summarize && n > 2 * EDGEITEMS;
    int64_t shown = cut ? 2 * EDGEITEMS + 1 : n; /* the " ..." counts as an element */
    em__sb_str(b, "[");
    for (int64_t e = 0; e < shown; e++) {
        if (e > 0) {
            if (e % per_line == 0) {
                em__sb_str(b, ",\n");
                em__sb_spaces(b, indent + 1);
            } else {
                em__sb_str(b, ", ");
            }
        }
        if (cut && e == EDGEITEMS) {
            em__sb_str(b, " ...");
            continue;
        }
        int64_t k = cut && e > EDGEITEMS ? n - (shown - e) : e;
        put_value(p, b, base + k * stride);
    }
    em__sb_str(b, "]");
}

static void put_tensor(const printer *p, em_strbuf *b, int dim, int64_t base, int indent) {
    int nd = p->t->ndim;
    if (dim == nd - 1) {
        put_vector(p, b, base, indent);
        return;
    }
    int64_t n = p->t->shape[dim];
    em__sb_str(b, "[");
    bool cut = p->summarize && n > 2 * EDGEITEMS;
    for (int64_t k = 0; k < n; k++) {
        if (k > 0) {
            em__sb_str(b, ",");
            for (int i = 0; i < nd - dim - 1; i++) em__sb_str(b, "\n");
            em__sb_spaces(b, indent + 1);
        }
        if (cut && k == EDGEITEMS) {
            em__sb_str(b, "...,");
            for (int i = 0; i < nd - dim - 1; i++) em__sb_str(b, "\n");
            em__sb_spaces(b, indent + 1);
            k = n - EDGEITEMS;
        }
        put_tensor(p, b, dim + 1, base + k * p->cstride[dim], indent + 1);
    }
    em__sb_str(b, "]");
}

/* PyTorch's _add_suffixes: wrap a suffix to a new line when it would pass 80 columns. */
static void add_suffix(em_strbuf *b, const char *suffix, int indent, size_t *last_line_len) {
    size_t n = strlen(suffix);
    if (*last_line_len + n + 2 > LINEWIDTH) {
        em__sb_str(b, ",\n");
        em__sb_spaces(b, indent);
        *last_line_len = (size_t)indent + n;
    } else {
        em__sb_str(b, ", ");
        *last_line_len += n + 2;
    }
    em__sb_str(b, suffix);
}

static em_status format_tensor(const em_tensor *t, em_strbuf *b) {
    const int indent = 7; /* strlen("tensor(") */
    int64_t numel = em__numel_raw(t->ndim, t->shape);
    printer p = {.t = t, .esize = em_dtype_size(t->dtype), .floating = em_dtype_is_floating(t->dtype)};
    void *host = NULL;
    em__sb_str(b, "tensor(");
    if (numel == 0) {
        em__sb_str(b, "[]");
    } else {
        host = malloc((size_t)numel * p.esize);
        if (!host) return em_error(EM_ERR_OUT_OF_MEMORY, "em_format: out of host memory");
        if (em__to_host(t, t->dtype, host) != EM_OK) {
            free(host);
            return em_last_status();
        }
        p.data = host;
        em__contiguous_strides(t->ndim, t->shape, p.cstride);
        p.summarize = numel > THRESHOLD;
        setup_formatter(&p);
        if (t->ndim == 0) put_value(&p, b, 0);
        else put_tensor(&p, b, 0, 0, indent);
        free(host);
    }
    if (b->oom) return em_error(EM_ERR_OUT_OF_MEMORY, "em_format: out of host memory");
    const char *nl = strrchr(b->s, '\n');
    size_t last = nl ? (size_t)(b->s + b->len - nl) + 1 : b->len + 2;
    char suffix[96];
    if (t->storage->device.type != EM_CPU) {
        snprintf(suffix, sizeof suffix, "device='%s'", em_device_str(t->storage->device).s);
        add_suffix(b, suffix, indent, &last);
    }
    if (numel == 0 && t->ndim != 1) {
        int n = snprintf(suffix, sizeof suffix, "size=(");
        for (int i = 0; i < t->ndim; i++)
            n += snprintf(suffix + n, sizeof suffix - (size_t)n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
        snprintf(suffix + n, sizeof suffix - (size_t)n, ")");
        add_suffix(b, suffix, indent, &last);
    }
    bool default_dtype = numel == 0 ? t->dtype == EM_F32
                                    : (t->dtype == EM_F32 || t->dtype == EM_I64 || t->dtype == EM_BOOL);
    if (!default_dtype) {
        snprintf(suffix, sizeof suffix, "dtype=torch.%s", em_dtype_name(t->dtype));
        add_suffix(b, suffix, indent, &last);
    }
    if (t->requires_grad && !t->grad_fn) add_suffix(b, "requires_grad=True", indent, &last);
    em__sb_str(b, ")");
    return b->oom ? em_error(EM_ERR_OUT_OF_MEMORY, "em_format: out of host memory") : EM_OK;
}

int em_format(const em_tensor *t, char *buf, size_t size) {
    if (!t) {
        if (!em_failed()) em_error(EM_ERR_ARGUMENT, "em_format: argument 't' is NULL");
        if (buf && size) buf[0] = '\0';
        return -1;
    }
    em_strbuf b = em__sb_growing();
    if (format_tensor(t, &b) != EM_OK) {
        em__sb_free(&b);
        if (buf && size) buf[0] = '\0';
        return -1;
    }
    int n = (int)b.len;
    if (buf && size) snprintf(buf, size, "%s", b.s);
    em__sb_free(&b);
    return n;
}

em_status em_print(const em_tensor *t) {
    if (!t) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_print: argument 't' is NULL");
    em_strbuf b = em__sb_growing();
    em_status st = format_tensor(t, &b);
    if (st == EM_OK) printf("%s\n", b.s);
    em__sb_free(&b);
    return st;
}
