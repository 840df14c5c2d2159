/* The `ember` command's option parser and the help, man page and table it writes from the
 * same option tables (options.h says the rules). */
#define _POSIX_C_SOURCE 200809L
#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ember/ember.h>
#include <ember/parse.h>

/* Help lines are wrapped at this column. */
#define WRAP_COLUMN 100
/* The option column of --help: text starts here unless an option's name is wider. */
#define HELP_COLUMN_MAX 24

/* ---- reading argv ---- */

int opt_usage_error(const opt_command *c, FILE *err, const char *fmt, ...) {
    fprintf(err, "%s: ", c->name);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(err, fmt, ap);
    va_end(ap);
    fputc('\n', err);
    return 2;
}

/* The index of the option spelled name[0..len) (its name or its alias), or -1. */
static int find(const opt_command *c, const char *name, size_t len) {
    for (int k = 0; k < c->count; k++) {
        const opt_spec *s = &c->options[k];
        if ((strlen(s->name) == len && !strncmp(s->name, name, len)) ||
            (s->alias && strlen(s->alias) == len && !strncmp(s->alias, name, len)))
            return k;
    }
    return -1;
}

static bool is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }

/* The name part of an option argument: up to '=' for "--name=value". */
static size_t name_length(const char *a) {
    const char *eq = a[0] == '-' && a[1] == '-' ? strchr(a, '=') : NULL;
    return eq ? (size_t)(eq - a) : strlen(a);
}

/* Is a one of the command's options (or --help, or the "--" that ends them)? Such an argument
 * is never taken as the value of the option before it. */
static bool names_an_option(const opt_command *c, const char *a) {
    if (is_help(a) || (c->rest_after_dashdash && !strcmp(a, "--"))) return true;
    return a[0] == '-' && find(c, a, name_length(a)) >= 0;
}

/* Does a look like an option rather than an argument? "-" alone is an argument (a path), and
 * so is "-5" where the command takes an argument (ember mem's parameter count). */
static bool looks_like_option(const opt_command *c, const char *a) {
    if (a[0] != '-' || !a[1]) return false;
    return !(c->positional && (isdigit((unsigned char)a[1]) || a[1] == '.'));
}

/* Levenshtein distance of two short strings (names), capped at 9. */
static int distance(const char *a, size_t na, const char *b) {
    size_t nb = strlen(b);
    if (na > 40 || nb > 40) return 9;
    int row[41];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb] < 9 ? row[nb] : 9;
}

/* The visible option nearest to an unknown one, if it is near enough to be a slip. */
static const char *suggestion(const opt_command *c, const char *name, size_t len) {
    const char *best = NULL;
    int best_d = 3;   /* two edits at most */
    for (int k = 0; k < c->count; k++) {
        const opt_spec *s = &c->options[k];
        if (s->flags & OPT_HIDDEN) continue;
        int d = distance(name, len, s->name);
        /* "--check" for "--checkpoint": a prefix of one option is as good as a slip */
        if (len >= 4 && strlen(s->name) > len && !strncmp(s->name, name, len)) d = d < 2 ? d : 2;
        if (d < best_d) best_d = d, best = s->name;
    }
    if (distance(name, len, "--help") < best_d) best = "--help";
    return best;
}

static const char *invocation(const opt_command *c) { return c->invocation ? c->invocation : c->name; }

/* "adam, adamw or sgd": the first word of each choice id. */
static void choice_words(const opt_spec *s, const char *sep, const char *last_sep, char *buf, size_t size) {
    size_t n = 0;
    int shown = 0, total = 0;
    buf[0] = '\0';
    for (int pass = 0; pass < 2; pass++)
        for (const opt_choice *ch = s->choices; ch && ch->word; ch++) {
            bool first_of_id = true;
            for (const opt_choice *p = s->choices; p != ch; p++) first_of_id &= p->id != ch->id;
            if (!first_of_id) continue;
            if (pass == 0) {
                total++;
                continue;
            }
            const char *before = shown == 0 ? "" : shown == total - 1 ? last_sep : sep;
            int w = snprintf(n < size ? buf + n : NULL, n < size ? size - n : 0, "%s%s", before, ch->word);
            if (w > 0) n += (size_t)w;
            shown++;
        }
    if (n >= size && size > 4) strcpy(buf + size - 4, "...");
}

size_t opt_decimal_prefix(const char *s) {
    size_t i = 0, digits = 0;
    while (isdigit((unsigned char)s[i])) i++, digits++;
    if (s[i] == '.') {
        i++;
        while (isdigit((unsigned char)s[i])) i++, digits++;
    }
    if (!digits) return 0;
    if (s[i] == 'e' || s[i] == 'E') {
        size_t j = i + 1;
        if (s[j] == '+' || s[j] == '-') j++;
        if (isdigit((unsigned char)s[j])) {
            while (isdigit((unsigned char)s[j])) j++;
            i = j;
        }
    }
    return i;
}

/* Why the decimal text s[0..n) cannot stand for its value: NULL when it can, else it
 * underflows (strtod rounds it to 0, or to a subnormal that has lost precision). */
static const char *underflow(const char *s, size_t n) {
    char buf[128];
    if (n >= sizeof buf) n = sizeof buf - 1;   /* the exponent decides: a long mantissa changes nothing */
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    double v = strtod(buf, NULL);
    if (errno != ERANGE || fabs(v) >= DBL_MIN) return NULL;
    return v == 0 ? "underflows to 0" : "underflows: below the smallest normal double, 2.2e-308";
}

static bool read_int(const opt_command *c, const opt_spec *s, const char *as, const char *v, opt_value *out,
                     FILE *err) {
    em_num_result r = em_parse_i64(v, s->imin, s->imax, &out->i);
    if (r == EM_NUM_OK) return true;
    if (s->imax == INT64_MAX)
        opt_usage_error(c, err, "%s expects an integer >= %lld, got '%s' (%s)", as, (long long)s->imin, v,
                        em_num_why(r));
    else
        opt_usage_error(c, err, "%s expects an integer from %lld to %lld, got '%s' (%s)", as, (long long)s->imin,
                        (long long)s->imax, v, em_num_why(r));
    return false;
}

static void double_range(const opt_spec *s, char *buf, size_t size) {
    if (s->dmax == DBL_MAX) snprintf(buf, size, "%s %g", s->flags & OPT_ABOVE_MIN ? ">" : ">=", s->dmin);
    else snprintf(buf, size, "%s %g and <= %g", s->flags & OPT_ABOVE_MIN ? ">" : ">=", s->dmin, s->dmax);
}

static bool read_double(const opt_command *c, const opt_spec *s, const char *as, const char *v, opt_value *out,
                        FILE *err) {
    em_num_result r = em_parse_f64(v, -DBL_MAX, DBL_MAX, &out->d);
    const char *why = r == EM_NUM_OK ? NULL : em_num_why(r);
    if (!why) why = underflow(v, strlen(v));
    if (!why && (out->d < s->dmin || out->d > s->dmax || ((s->flags & OPT_ABOVE_MIN) && out->d == s->dmin)))
        why = em_num_why(EM_NUM_RANGE);
    if (!why) return true;
    char range[96];
    double_range(s, range, sizeof range);
    opt_usage_error(c, err, "%s expects a number %s, got '%s' (%s)", as, range, v, why);
    return false;
}

static bool read_choice(const opt_command *c, const opt_spec *s, const char *as, const char *v, opt_value *out,
                        FILE *err) {
    for (const opt_choice *ch = s->choices; ch && ch->word; ch++)
        if ((s->flags & OPT_NOCASE) ? !strcasecmp(ch->word, v) : !strcmp(ch->word, v)) {
            out->choice = ch->id;
            return true;
        }
    char words[256];
    choice_words(s, ", ", " or ", words, sizeof words);
    opt_usage_error(c, err, "%s expects %s, got '%s'", as, words, v);
    return false;
}

static bool read_size(const opt_command *c, const opt_spec *s, const char *as, const char *v, opt_value *out,
                      FILE *err) {
    size_t n = opt_decimal_prefix(v);
    bool unit_only = n > 0;
    for (const char *u = v + n; unit_only && *u; u++) unit_only = isalpha((unsigned char)*u);
    if (!unit_only) {   /* em_memory_parse_size also reads " 1", "0x10" and "-0": an option's size is plain */
        opt_usage_error(c, err, "%s: cannot read the size '%s': expected a decimal number with an optional unit "
                        "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 512MiB", as, v);
        return false;
    }
    const char *why = underflow(v, n);
    if (!why && em_memory_parse_size(v, &out->i) != EM_OK) {
        opt_usage_error(c, err, "%s: %s", as, em_last_error());
        em_clear_error();
        return false;
    }
    if (!why && out->i >= s->imin && out->i <= s->imax) return true;
    if (s->imax == INT64_MAX)
        opt_usage_error(c, err, "%s expects a size above %lld bytes, got '%s'%s%s%s", as, (long long)s->imin - 1, v,
                        why ? " (" : "", why ? why : "", why ? ")" : "");
    else
        opt_usage_error(c, err, "%s expects a size from %lld to %lld bytes, got '%s'%s%s%s", as, (long long)s->imin,
                        (long long)s->imax, v, why ? " (" : "", why ? why : "", why ? ")" : "");
    return false;
}

static bool read_value(const opt_command *c, const opt_spec *s, const char *as, const char *v, opt_value *out,
                       FILE *err) {
    out->text = v;
    switch (s->kind) {
    case OPT_INT: return read_int(c, s, as, v, out, err);
    case OPT_DOUBLE: return read_double(c, s, as, v, out, err);
    case OPT_CHOICE: return read_choice(c, s, as, v, out, err);
    case OPT_SIZE: return read_size(c, s, as, v, out, err);
    case OPT_FLAG: case OPT_STRING: case OPT_DEVICE: case OPT_LIST: return true;
    }
    return true;
}

int opt_parse(const opt_command *c, int argc, char **argv, opt_result *r, FILE *out, FILE *err) {
    memset(r, 0, sizeof *r);
    if (c->count > OPT_MAX)   /* a table too long for opt_result: the build's mistake, said plainly */
        return opt_usage_error(c, err, "internal error: %d options, more than OPT_MAX (%d)", c->count, OPT_MAX);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (c->rest_after_dashdash && !strcmp(a, "--")) {
            r->dashdash = true;
            r->rest = argv + i + 1;
            r->nrest = argc - i - 1;
            return -1;
        }
        if (is_help(a)) {
            opt_print_help(c, out);
            return 0;
        }
        if (!looks_like_option(c, a)) {
            if (!c->positional) {
                opt_usage_error(c, err, "unexpected argument '%s'%s%s", a, c->extra ? ": " : "", c->extra ? c->extra : "");
                fprintf(err, "(%s --help lists the options)\n", invocation(c));
                return 2;
            }
            int most = c->max_positional > 0 ? c->max_positional : 1;
            if (most > OPT_MAX_POSITIONAL) most = OPT_MAX_POSITIONAL;
            if (r->nargs >= most)   /* one argument too many is a mistake, not a replacement */
                return opt_usage_error(c, err, "unexpected argument '%s'%s%s (already '%s')", a, c->extra ? ": " : "",
                                       c->extra ? c->extra : "", r->args[r->nargs - 1]);
            r->args[r->nargs++] = a;
            if (!r->positional) r->positional = a;
            continue;
        }
        size_t len = name_length(a);
        const char *inline_value = a[len] == '=' ? a + len + 1 : NULL;
        int k = find(c, a, len);
        if (k < 0) {
            if (len == 6 && !strncmp(a, "--help", 6)) return opt_usage_error(c, err, "--help takes no value, got '%s'", a);
            const char *near = suggestion(c, a, len);
            fprintf(err, "%s: unknown option '%.*s'", c->name, (int)len, a);
            if (near) fprintf(err, " (did you mean %s?)", near);
            fprintf(err, "\n(%s --help lists the options)\n", invocation(c));
            return 2;
        }
        const opt_spec *s = &c->options[k];
        opt_value *v = &r->v[k];
        char as[64];
        snprintf(as, sizeof as, "%.*s", (int)len, a);
        if (v->given) {
            if (strcmp(v->as, as) != 0)
                return opt_usage_error(c, err, "%s is given twice (first as %s): give each option once", as, v->as);
            return opt_usage_error(c, err, "%s is given twice: give each option once", as);
        }
        v->given = true;
        v->as = !strcmp(as, s->name) ? s->name : s->alias;
        if (s->kind == OPT_FLAG) {
            if (inline_value) return opt_usage_error(c, err, "%s takes no value, got '%s'", as, a);
            continue;
        }
        const char *value = inline_value;
        if (!value) {
            if (i + 1 >= argc) return opt_usage_error(c, err, "option %s needs a value", as);
            if (names_an_option(c, argv[i + 1]))
                return opt_usage_error(c, err, "option %s needs a value (the next argument, '%s', is an option)", as,
                                       argv[i + 1]);
            value = argv[++i];
        }
        if (!read_value(c, s, as, value, v, err)) return 2;
    }
    return -1;
}

/* ---- writing the help ---- */

/* Writes text from column col, wrapping at WRAP_COLUMN; each of its lines starts at column
 * indent (or at col, when the first one is already past it), and a wrapped line goes on at
 * indent plus its line's own leading spaces. OPT_NBSP joins words as a space that is never a
 * break. */
static void put_wrapped(FILE *out, const char *text, int col, int indent) {
    const char *p = text;
    for (bool first = true;; first = false) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (!first) {
            fputc('\n', out);
            col = 0;
        }
        if (len > 0) {
            size_t lead = 0;
            while (lead < len && p[lead] == ' ') lead++;
            int start = (col < indent ? indent : col) + (int)lead, hang = indent + (int)lead;
            fprintf(out, "%*s", start - col, "");
            col = start;
            bool at_start = true;
            for (size_t k = lead; k < len;) {
                while (k < len && p[k] == ' ') k++;
                size_t e = k;
                while (e < len && p[e] != ' ') e++;
                if (e == k) break;
                int w = (int)(e - k);
                if (!at_start && col + 1 + w > WRAP_COLUMN) {
                    fprintf(out, "\n%*s", hang, "");
                    col = hang;
                    at_start = true;
                }
                if (!at_start) fputc(' ', out), col++;
                for (size_t j = k; j < e; j++) fputc(p[j] == OPT_NBSP[0] ? ' ' : p[j], out);
                col += w;
                at_start = false;
                k = e;
            }
        }
        if (!eol) break;
        p = eol + 1;
    }
}

/* "--epochs N", "-n, --nproc N", "--optimizer adam|adamw|sgd". */
static void option_label(const opt_spec *s, char *buf, size_t size) {
    char words[256] = "";
    const char *metavar = s->metavar;
    if (s->kind == OPT_CHOICE && !metavar) {
        choice_words(s, "|", "|", words, sizeof words);
        metavar = words;
    }
    snprintf(buf, size, "%s%s%s%s%s", s->alias ? s->alias : "", s->alias ? ", " : "", s->name,
             s->kind == OPT_FLAG ? "" : " ", s->kind == OPT_FLAG ? "" : metavar ? metavar : "VALUE");
}

/* The range a numeric option accepts, as its help states it: " [1 to 4096]". */
static void range_text(const opt_spec *s, char *buf, size_t size) {
    buf[0] = '\0';
    if (s->kind == OPT_INT && s->imax == INT64_MAX)
        snprintf(buf, size, " [at" OPT_NBSP "least" OPT_NBSP "%lld]", (long long)s->imin);
    else if (s->kind == OPT_INT)
        snprintf(buf, size, " [%lld" OPT_NBSP "to" OPT_NBSP "%lld]", (long long)s->imin, (long long)s->imax);
    else if (s->kind == OPT_DOUBLE && (s->flags & OPT_ABOVE_MIN)) {
        if (s->dmax == DBL_MAX) snprintf(buf, size, " [above" OPT_NBSP "%g]", s->dmin);
        else snprintf(buf, size, " [above" OPT_NBSP "%g," OPT_NBSP "at" OPT_NBSP "most" OPT_NBSP "%g]", s->dmin, s->dmax);
    } else if (s->kind == OPT_DOUBLE) {
        if (s->dmax == DBL_MAX) snprintf(buf, size, " [at" OPT_NBSP "least" OPT_NBSP "%g]", s->dmin);
        else snprintf(buf, size, " [%g" OPT_NBSP "to" OPT_NBSP "%g]", s->dmin, s->dmax);
    } else if (s->kind == OPT_SIZE && s->imax == INT64_MAX) {
        snprintf(buf, size, " [above" OPT_NBSP "%lld" OPT_NBSP "bytes]", (long long)s->imin - 1);
    } else if (s->kind == OPT_SIZE) {
        snprintf(buf, size, " [%lld" OPT_NBSP "to" OPT_NBSP "%lld" OPT_NBSP "bytes]", (long long)s->imin,
                 (long long)s->imax);
    }
}

static const opt_spec help_spec = {.name = "--help", .alias = "-h", .kind = OPT_FLAG, .help = "this text"};

static void put_option(FILE *out, const opt_spec *s, int column) {
    char label[300], range[96];
    option_label(s, label, sizeof label);
    range_text(s, range, sizeof range);
    size_t n = strlen(s->help) + strlen(range) + 1;
    char *text = malloc(n);
    fprintf(out, "  %s", label);
    int col = 2 + (int)strlen(label);
    if (col + 2 > column) fprintf(out, "  "), col += 2;
    if (text) {
        snprintf(text, n, "%s%s", s->help, range);
        put_wrapped(out, text, col, column);
    } else {
        put_wrapped(out, s->help, col, column);   /* no room for the range: the help alone */
    }
    fputc('\n', out);
    free(text);
}

void opt_print_help(const opt_command *c, FILE *out) {
    /* the usage's forms, "usage: " before the first and its width of spaces before the rest */
    const char *p = c->usage;
    for (bool first = true; p && *p; first = false) {
        const char *eol = strchr(p, '\n');
        int len = eol ? (int)(eol - p) : (int)strlen(p);
        fprintf(out, "%s%.*s\n", first ? "usage: " : "       ", len, p);
        p = eol ? eol + 1 : p + len;
    }
    if (c->about) {
        put_wrapped(out, c->about, 0, 0);
        fputc('\n', out);
    }
    fputc('\n', out);
    int column = 0;
    for (int k = -1; k < c->count; k++) {
        const opt_spec *s = k < 0 ? &help_spec : &c->options[k];
        char label[300];
        option_label(s, label, sizeof label);
        int w = 2 + (int)strlen(label) + 2;
        if (!(s->flags & OPT_HIDDEN) && w <= HELP_COLUMN_MAX && w > column) column = w;
    }
    if (c->positional) {
        char label[64];
        snprintf(label, sizeof label, "%s", c->positional);
        int w = 2 + (int)strlen(label) + 2;
        if (w <= HELP_COLUMN_MAX && w > column) column = w;
        fprintf(out, "  %s", label);
        int col = 2 + (int)strlen(label);
        if (col + 2 > column) fprintf(out, "  "), col += 2;
        put_wrapped(out, c->positional_help ? c->positional_help : "", col, column);
        fputc('\n', out);
    }
    for (int k = 0; k < c->count; k++)
        if (!(c->options[k].flags & OPT_HIDDEN)) put_option(out, &c->options[k], column);
    put_option(out, &help_spec, column);
    if (c->epilogue) {
        fputc('\n', out);
        put_wrapped(out, c->epilogue, 0, 0);
        fputc('\n', out);
    }
    if (c->exit_status) {
        fputc('\n', out);
        char line[512];
        snprintf(line, sizeof line, "Exit status: %s.", c->exit_status);
        put_wrapped(out, line, 0, 0);
        fputc('\n', out);
    }
}

/* ---- the man page ---- */

/* Text for roff: '\' as \e, '-' as \- (an option's hyphen, not a break point), and a line
 * that would start with '.' or '\'' (a request) protected by \&. */
static void roff_text(FILE *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (i == 0 && (s[0] == '.' || s[0] == '\'')) fputs("\\&", out);
        if (s[i] == '\\') fputs("\\e", out);
        else if (s[i] == '-') fputs("\\-", out);
        else if (s[i] == OPT_NBSP[0]) fputs("\\ ", out);
        else fputc(s[i], out);
    }
}

/* Paragraphs for roff: each line of text on a line of its own (roff fills them), a blank
 * line a new paragraph, a line that starts with spaces a line break. */
static void roff_paragraphs(FILE *out, const char *text) {
    fputs(".PP\n", out);
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        size_t lead = 0;
        while (lead < len && p[lead] == ' ') lead++;
        if (len == lead) fputs(".PP\n", out);
        else {
            if (lead) fputs(".br\n", out);
            roff_text(out, p + lead, len - lead);
            fputc('\n', out);
        }
        p = eol ? eol + 1 : p + len;
    }
}

static void roff_option(FILE *out, const opt_spec *s) {
    char words[256] = "", range[96];
    const char *metavar = s->metavar;
    if (s->kind == OPT_CHOICE && !metavar) {
        choice_words(s, "|", "|", words, sizeof words);
        metavar = words;
    }
    fputs(".TP\n", out);
    if (s->alias) {
        fputs("\\fB", out);
        roff_text(out, s->alias, strlen(s->alias));
        fputs("\\fR, ", out);
    }
    fputs("\\fB", out);
    roff_text(out, s->name, strlen(s->name));
    fputs("\\fR", out);
    if (s->kind != OPT_FLAG) {
        fputs(" \\fI", out);
        roff_text(out, metavar ? metavar : "VALUE", strlen(metavar ? metavar : "VALUE"));
        fputs("\\fR", out);
    }
    fputc('\n', out);
    range_text(s, range, sizeof range);
    for (const char *p = s->help; *p;) {   /* the help's lines, filled by roff */
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        while (len && *p == ' ') p++, len--;
        if (len) {
            roff_text(out, p, len);
            fputc('\n', out);
        }
        p = eol ? eol + 1 : p + len;
    }
    if (range[0]) {
        roff_text(out, range + 1, strlen(range + 1));
        fputc('\n', out);
    }
}

void opt_print_man(const opt_command *c, const char *title, FILE *out) {
    fputs(".SS ", out);
    roff_text(out, title, strlen(title));
    fputs("\n.nf\n", out);
    for (const char *p = c->usage; p && *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        fputs(p == c->usage ? "usage: " : "       ", out);
        roff_text(out, p, len);
        fputc('\n', out);
        p = eol ? eol + 1 : p + len;
    }
    fputs(".fi\n", out);
    if (c->about) roff_paragraphs(out, c->about);
    if (c->positional) {
        fputs(".TP\n\\fI", out);
        roff_text(out, c->positional, strlen(c->positional));
        fputs("\\fR\n", out);
        if (c->positional_help) {
            roff_text(out, c->positional_help, strlen(c->positional_help));
            fputc('\n', out);
        }
    }
    for (int k = 0; k < c->count; k++)
        if (!(c->options[k].flags & OPT_HIDDEN)) roff_option(out, &c->options[k]);
    roff_option(out, &help_spec);
    if (c->epilogue) roff_paragraphs(out, c->epilogue);
    if (c->exit_status) {
        fputs(".PP\nExit status: ", out);
        roff_text(out, c->exit_status, strlen(c->exit_status));
        fputs(".\n", out);
    }
}

/* ---- the table, for scripts ---- */

static const char *kind_name(opt_kind k) {
    switch (k) {
    case OPT_FLAG: return "flag";
    case OPT_INT: return "int";
    case OPT_DOUBLE: return "double";
    case OPT_STRING: return "string";
    case OPT_CHOICE: return "choice";
    case OPT_SIZE: return "size";
    case OPT_DEVICE: return "device";
    case OPT_LIST: return "list";
    }
    return "?";
}

static void table_row(FILE *out, const opt_spec *s) {
    char words[256] = "";
    const char *metavar = s->metavar;
    if (s->kind == OPT_CHOICE && !metavar) {
        choice_words(s, "|", "|", words, sizeof words);
        metavar = words;
    }
    fprintf(out, "%s\t%s\t%s\t%s\t", s->name, s->alias ? s->alias : "-", kind_name(s->kind),
            s->kind == OPT_FLAG ? "-" : metavar ? metavar : "VALUE");
    if (s->kind == OPT_INT || s->kind == OPT_SIZE) fprintf(out, "%lld\t%lld\t", (long long)s->imin, (long long)s->imax);
    else if (s->kind == OPT_DOUBLE) fprintf(out, "%.17g\t%.17g\t", s->dmin, s->dmax);
    else fprintf(out, "-\t-\t");
    const char *flags[3];
    int nf = 0;
    if (s->flags & OPT_HIDDEN) flags[nf++] = "hidden";
    if (s->flags & OPT_NOCASE) flags[nf++] = "nocase";
    if (s->flags & OPT_ABOVE_MIN) flags[nf++] = "above-min";
    for (int f = 0; f < nf; f++) fprintf(out, "%s%s", f ? "," : "", flags[f]);
    fprintf(out, "%s\t", nf ? "" : "-");
    if (!s->choices) fputc('-', out);
    for (const opt_choice *ch = s->choices; ch && ch->word; ch++) fprintf(out, "%s%s", ch == s->choices ? "" : ",", ch->word);
    fputc('\n', out);
}

void opt_print_table(const opt_command *c, FILE *out) {
    for (int k = 0; k < c->count; k++) table_row(out, &c->options[k]);
    table_row(out, &help_spec);
}
