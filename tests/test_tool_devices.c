/* `ember devices`: the report's JSON is valid and complete, strings are escaped, unknown
 * memory is reported as unknown, and EMBER_DEVICE shows up. The report code is included
 * directly (the tool is an executable, not a library). */
#include <stdlib.h>
#include "test.h"
#include "../tools/ember/devices_report.c"

/* ---- a strict little JSON checker (RFC 8259 grammar; strings must be valid UTF-8) ---- */

typedef struct { const char *p; int depth; } jp;

static void ws(jp *j) {
    while (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r') j->p++;
}
static bool value(jp *j);

static bool string(jp *j) {
    if (*j->p != '"') return false;
    j->p++;
    for (;;) {
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            return true;
        }
        if (c < 0x20) return false; /* raw control characters (and the end) are not allowed */
        if (c == '\\') {
            j->p++;
            if (strchr("\"\\/bfnrt", *j->p) && *j->p) j->p++;
            else if (*j->p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", j->p[i]) || !j->p[i]) return false;
                j->p += 5;
            } else return false;
        } else {
            int n = utf8_len((const unsigned char *)j->p);
            if (!n) return false;
            j->p += n;
        }
    }
}

static bool number(jp *j) {
    const char *s = j->p;
    if (*j->p == '-') j->p++;
    if (*j->p == '0') j->p++;
    else if (*j->p >= '1' && *j->p <= '9') while (*j->p >= '0' && *j->p <= '9') j->p++;
    else return false;
    if (*j->p == '.') {
        j->p++;
        if (!(*j->p >= '0' && *j->p <= '9')) return false;
        while (*j->p >= '0' && *j->p <= '9') j->p++;
    }
    if (*j->p == 'e' || *j->p == 'E') {
        j->p++;
        if (*j->p == '+' || *j->p == '-') j->p++;
        if (!(*j->p >= '0' && *j->p <= '9')) return false;
        while (*j->p >= '0' && *j->p <= '9') j->p++;
    }
    return j->p > s;
}

static bool literal(jp *j, const char *w) {
    size_t n = strlen(w);
    if (strncmp(j->p, w, n)) return false;
    j->p += n;
    return true;
}

static bool container(jp *j, char open, char close, bool keys) {
    if (*j->p != open || ++j->depth > 64) return false;
    j->p++;
    ws(j);
    if (*j->p == close) {
        j->p++;
        j->depth--;
        return true;
    }
    for (;;) {
        ws(j);
        if (keys) {
            if (!string(j)) return false;
            ws(j);
            if (*j->p++ != ':') return false;
        }
        if (!value(j)) return false;
        ws(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        if (*j->p != close) return false;
        j->p++;
        j->depth--;
        return true;
    }
}

static bool value(jp *j) {
    ws(j);
    switch (*j->p) {
    case '{': return container(j, '{', '}', true);
    case '[': return container(j, '[', ']', false);
    case '"': return string(j);
    case 't': return literal(j, "true");
    case 'f': return literal(j, "false");
    case 'n': return literal(j, "null");
    default: return number(j);
    }
}

static bool json_valid(const char *s) {
    jp j = {s, 0};
    if (!value(&j)) return false;
    ws(&j);
    return *j.p == '\0';
}

/* ---- rendering into memory ---- */

static char *render(const devrep_report *r, bool json) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    int rc = json ? devrep_write_json(f, r) : devrep_write_text(f, r);
    fclose(f);
    if (rc != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* A report with one made-up device of each type (no Ember queries). */
static devrep_report *fake_report(void) {
    devrep_report *r = calloc(1, sizeof *r);
    for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
        r->types[t].type = (em_device_type)t;
        r->types[t].available = true;
        r->types[t].count = r->types[t].ndevices = 1;
        r->types[t].current = 0;
        devrep_device *d = &r->types[t].devices[0];
        d->device = EM_DEVICE((em_device_type)t, 0);
        d->ok = true;
        snprintf(d->props.name, sizeof d->props.name, "device %d", t);
        d->props.total_memory = 1024LL * 1024 * 1024 * 8;
        d->props.free_memory = 1024LL * 1024 * 1024 * 2;
        d->props.compute_units = 4 + t;
    }
    r->auto_device = EM_DEVICE_CPU;
    snprintf(r->auto_reason, sizeof r->auto_reason, "cpu: made up");
    return r;
}

/* ---- tests ---- */

static void test_json_checker_rejects_bad_json(void) {
    CHECK(json_valid("{\"a\": [1, 2.5e3, -0, true, null, \"x\\u00e9\"]}"));
    CHECK(!json_valid("{\"a\": 1,}"));
    CHECK(!json_valid("{\"a\": \"tab\there\"}"));
    CHECK(!json_valid("{\"a\": \"\xff\"}"));
    CHECK(!json_valid("{\"a\": 01}"));
    CHECK(!json_valid("{\"a\": 1} x"));
}

static void test_json_of_this_machine(void) {
    devrep_report *r = calloc(1, sizeof *r);
    devrep_gather(r);
    CHECK(!em_failed());
    char *s = render(r, true);
    CHECK(s != NULL);
    if (s) {
        CHECK(json_valid(s));
        if (!json_valid(s)) fprintf(stderr, "%s", s);
        static const char *const names[] = {"cpu", "cuda", "mps", "opencl"};
        for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
            char key[64];
            snprintf(key, sizeof key, "{\"type\": \"%s\", \"available\": %s", names[t],
                     em_device_available((em_device_type)t) ? "true" : "false");
            CHECK(strstr(s, key) != NULL);
            snprintf(key, sizeof key, "\"device_count\": %d", em_device_count((em_device_type)t));
            CHECK(strstr(s, key) != NULL);
        }
        /* the CPU is always there, and auto-selection is reported with its reason */
        CHECK(strstr(s, "\"device\": \"cpu:0\"") || strstr(s, "\"device\": \"cpu\""));
        char key[96];
        snprintf(key, sizeof key, "\"auto\": {\"device\": \"%s\"", em_device_str(em_device_auto()).s);
        CHECK(strstr(s, key) != NULL);
        CHECK(strstr(s, "\"reason\": \"") != NULL);
        char feat[300]; /* the CPU's vector features, on the cpu type only */
        snprintf(feat, sizeof feat, "\"features\": \"%s\"", em_cpu_features());
        CHECK(strstr(s, feat) != NULL && strstr(strstr(s, feat) + 1, "\"features\"") == NULL);
    }
    free(s);
    /* the counts agree with the API, and unavailable types say why */
    for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
        CHECK(r->types[t].count == em_device_count((em_device_type)t));
        if (!r->types[t].available) CHECK(r->types[t].reason[0] != '\0');
    }
    CHECK(r->types[EM_CPU].available && r->types[EM_CPU].count == 1);
    CHECK(r->types[EM_CPU].devices[0].ok);
    CHECK(r->types[EM_CPU].devices[0].props.compute_units >= 1);
    CHECK(!r->types[EM_MPS].available); /* Linux */
    free(r);
}

static void test_text_of_this_machine(void) {
    devrep_report *r = calloc(1, sizeof *r);
    devrep_gather(r);
    char *s = render(r, false);
    CHECK(s != NULL);
    if (s) {
        for (int t = 0; t < EM_DEVICE_TYPE_COUNT; t++) {
            char line[600];
            if (r->types[t].available)
                snprintf(line, sizeof line, "%-7s available, %d device", em_device_type_name((em_device_type)t),
                         r->types[t].count);
            else
                snprintf(line, sizeof line, "%-7s not available: %s", em_device_type_name((em_device_type)t),
                         r->types[t].reason);
            CHECK(strstr(s, line) != NULL);
        }
        CHECK(strstr(s, "auto-selection") && strstr(s, r->auto_reason));
        CHECK(strstr(s, "EMBER_DEVICE") != NULL);
        char feat[300];
        snprintf(feat, sizeof feat, "\n  features: %s\n", em_cpu_features());
        CHECK(strstr(s, feat) != NULL);
    }
    free(s);
    /* a report without features (made up) prints no features line */
    r->cpu_features[0] = '\0';
    s = render(r, false);
    CHECK(s && !strstr(s, "features:"));
    free(s);
    free(r);
}

static void test_strings_are_escaped(void) {
    devrep_report *r = fake_report();
    snprintf(r->types[EM_OPENCL].devices[0].props.name, 256, "quote\" back\\slash\nnew\x01 caf\xc3\xa9 bad\xff");
    snprintf(r->types[EM_CUDA].reason, sizeof r->types[EM_CUDA].reason, "tab\there");
    r->types[EM_CUDA].available = false;
    char *s = render(r, true);
    CHECK(s && json_valid(s));
    if (s) {
        CHECK(strstr(s, "quote\\\" back\\\\slash\\nnew\\u0001 caf\xc3\xa9 bad\\ufffd") != NULL);
        CHECK(strstr(s, "\"reason\": \"tab\\there\"") != NULL);
    }
    free(s);
    free(r);
}

static void test_unknown_memory_and_capability(void) {
    devrep_report *r = fake_report();
    r->types[EM_OPENCL].devices[0].props.free_memory = -1;
    r->types[EM_CUDA].devices[0].props.compute_capability = 90;
    r->types[EM_CUDA].devices[0].props.is_gpu = true;
    char *s = render(r, true);
    CHECK(s && json_valid(s));
    if (s) {
        CHECK(strstr(s, "\"free_memory\": null") != NULL);
        CHECK(strstr(s, "\"total_memory\": 8589934592") != NULL);
        CHECK(strstr(s, "\"compute_capability\": \"9.0\"") != NULL);
    }
    free(s);
    s = render(r, false);
    CHECK(s != NULL);
    if (s) {
        CHECK(strstr(s, "8.00 GiB total, unknown free") != NULL);
        CHECK(strstr(s, "8.00 GiB total, 2.00 GiB free") != NULL);
        CHECK(strstr(s, "compute capability 9.0") != NULL);
        CHECK(strstr(s, "[not a GPU]") != NULL); /* the made-up OpenCL device */
    }
    free(s);
    free(r);
}

static void test_device_without_props(void) {
    devrep_report *r = fake_report();
    r->types[EM_OPENCL].devices[0].ok = false;
    snprintf(r->types[EM_OPENCL].devices[0].error, 256, "clGetDeviceInfo failed");
    char *s = render(r, true);
    CHECK(s && json_valid(s) && strstr(s, "\"error\": \"clGetDeviceInfo failed\""));
    free(s);
    free(r);
}

static void test_ember_device_env(void) {
    setenv("EMBER_DEVICE", "cpu", 1);
    devrep_report *r = calloc(1, sizeof *r);
    devrep_gather(r);
    CHECK(r->env_set && !strcmp(r->env, "cpu"));
    CHECK(r->auto_device.type == EM_CPU);
    CHECK(strstr(r->auto_reason, "EMBER_DEVICE") != NULL);
    char *s = render(r, true);
    CHECK(s && json_valid(s) && strstr(s, "\"EMBER_DEVICE\": \"cpu\""));
    free(s);

    setenv("EMBER_DEVICE", "tpu:9", 1); /* not a device: ignored, and the report says so */
    devrep_gather(r);
    CHECK(!em_failed());
    CHECK(strstr(r->auto_reason, "tpu:9") != NULL);
    s = render(r, false);
    CHECK(s && strstr(s, "EMBER_DEVICE=tpu:9"));
    free(s);

    unsetenv("EMBER_DEVICE");
    devrep_gather(r);
    CHECK(!r->env_set);
    s = render(r, true);
    CHECK(s && strstr(s, "\"EMBER_DEVICE\": null"));
    free(s);
    free(r);
}

int main(void) {
    RUN(test_json_checker_rejects_bad_json);
    RUN(test_json_of_this_machine);
    RUN(test_text_of_this_machine);
    RUN(test_strings_are_escaped);
    RUN(test_unknown_memory_and_capability);
    RUN(test_device_without_props);
    RUN(test_ember_device_env);
    return test_summary();
}
