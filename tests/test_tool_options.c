/* The `ember` command's option tables against what it says and what it does. For every table
 * (`ember help --man` names them: each command, and `train --model gpt`), read as
 * `ember help --options WORDS`:
 *   - its --help lists exactly the table's visible options, each with its metavar and, for a
 *     number, its range; `ember help WORDS` is the same text;
 *   - its man page section has one entry per visible option, and the installed page
 *     (build/ember.1, where the build writes it) holds that section as `ember help --man` does;
 *   - the parser does what the table says, option by option: both spellings (`--opt V`,
 *     `--opt=V`) and every choice accepted, the ends of each range accepted and the values
 *     past them refused, hex, trailing text, leading spaces, empty values and underflow
 *     refused, an option given twice or without its value refused, a flag with a value
 *     refused, an option's value never taken from the next option, a misspelt option
 *     answered with the right one.
 * Each probe runs `ember` and checks its exit status and a fragment of its message; accepted
 * values are probed with --help after them, so nothing is trained or measured. */
#include <float.h>
#include <stdarg.h>
#include <stdlib.h>
#include "test.h"
#include "tool_run.h"

#define MAX_TABLES 16
#define MAX_ROWS 48

typedef struct row {
    char name[64], alias[16], kind[16], metavar[96], min[40], max[40], flags[64], choices[512];
} row;

typedef struct table {
    char words[64];      /* "train --model gpt" */
    char cmd[32];        /* "train" */
    char prefix[64];     /* what selects the table after the command: "--model gpt", or "" */
    row rows[MAX_ROWS];
    int n;
} table;

static table tables[MAX_TABLES];
static int ntables;
static char out[1 << 17], man_all[1 << 18];
static int probes, probes_as_expected;

/* ---- running ember ---- */

static int ember(char *buf, size_t size, const char *fmt, ...) {
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return tool_run(args, buf, size);
}

/* `ember ARGS` exits with rc and says fragment (NULL: anything). */
static void expect(int rc, const char *fragment, const char *fmt, ...) {
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    int got = tool_run(args, out, sizeof out);
    bool ok = got == rc && (!fragment || strstr(out, fragment));
    probes++;
    probes_as_expected += ok;
    if (!ok) fprintf(stderr, "  ember %s -> %d (expected %d and \"%s\"):\n%.1500s\n", args, got, rc,
                     fragment ? fragment : "", out);
    CHECK(ok);
}

/* ---- the tables ---- */

static bool visible(const row *r) { return !strstr(r->flags, "hidden"); }
static bool is(const row *r, const char *kind) { return !strcmp(r->kind, kind); }

/* The tab-separated fields of one line into the row; false when there are not 8. */
static bool parse_row(char *line, row *r) {
    char *f[8];
    int n = 0;
    for (char *save = NULL, *t = strtok_r(line, "\t", &save); t && n < 8; t = strtok_r(NULL, "\t", &save)) f[n++] = t;
    if (n != 8) return false;
    snprintf(r->name, sizeof r->name, "%s", f[0]);
    snprintf(r->alias, sizeof r->alias, "%s", strcmp(f[1], "-") ? f[1] : "");
    snprintf(r->kind, sizeof r->kind, "%s", f[2]);
    snprintf(r->metavar, sizeof r->metavar, "%s", f[3]);
    snprintf(r->min, sizeof r->min, "%s", f[4]);
    snprintf(r->max, sizeof r->max, "%s", f[5]);
    snprintf(r->flags, sizeof r->flags, "%s", f[6]);
    snprintf(r->choices, sizeof r->choices, "%s", f[7]);
    return true;
}

/* Every table `ember help --man` has a section for, read with `ember help --options`. */
static void test_tables_are_listed(void) {
    CHECK(ember(man_all, sizeof man_all, "help --man") == 0);
    for (const char *p = man_all; (p = strstr(p, ".SS ember ")) && ntables < MAX_TABLES; p++) {
        table *t = &tables[ntables];
        const char *eol = strchr(p, '\n');
        if (!eol) break;
        /* the title is roff: "train \-\-model gpt" */
        size_t k = 0;
        for (const char *c = p + 10; c < eol && k + 1 < sizeof t->words; c++)
            if (*c != '\\') t->words[k++] = *c;
        t->words[k] = '\0';
        sscanf(t->words, "%31s", t->cmd);
        const char *rest = t->words + strlen(t->cmd);
        memcpy(t->prefix, rest + (*rest == ' '), strlen(rest + (*rest == ' ')) + 1);
        CHECK(ember(out, sizeof out, "help --options %s", t->words) == 0);
        for (char *save = NULL, *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            CHECK(t->n < MAX_ROWS);
            if (t->n < MAX_ROWS) CHECK(parse_row(line, &t->rows[t->n++]));
        }
        CHECK(t->n >= 2 && !strcmp(t->rows[t->n - 1].name, "--help"));   /* every table ends with --help */
        ntables++;
    }
    printf("  %d tables:", ntables);
    for (int i = 0; i < ntables; i++) printf(" '%s' (%d)", tables[i].words, tables[i].n);
    printf("\n");
    /* every command of `ember --help` has one */
    CHECK(ember(out, sizeof out, "--help") == 0);
    const char *list = strstr(out, "commands:\n");
    CHECK(list != NULL);
    int commands = 0;
    for (const char *p = list ? strchr(list, '\n') + 1 : ""; p[0] == ' ' && p[1] == ' ' && p[2] != ' ';) {
        char name[32];
        if (sscanf(p, "%31s", name) == 1 && strcmp(name, "help")) {
            bool found = false;
            for (int i = 0; i < ntables; i++) found |= !strcmp(tables[i].words, name);
            if (!found) fprintf(stderr, "  ember %s has no option table\n", name);
            CHECK(found);
            commands++;
        }
        const char *eol = strchr(p, '\n');
        if (!eol) break;
        p = eol + 1;
    }
    CHECK(commands >= 7);
    CHECK(ember(out, sizeof out, "help --options frobnicate") == 2 && strstr(out, "names no command"));
    CHECK(ember(out, sizeof out, "help --options") == 2 && strstr(out, "needs a command"));
}

/* ---- --help and the man page ---- */

/* "-n, --nproc N" as --help writes it. */
static void label(const row *r, char *buf, size_t size) {
    snprintf(buf, size, "%s%s%s%s%s", r->alias, r->alias[0] ? ", " : "", r->name, is(r, "flag") ? "" : " ",
             is(r, "flag") ? "" : r->metavar);
}

/* The range --help states for a number, or "" for other kinds. */
static void range(const row *r, char *buf, size_t size) {
    buf[0] = '\0';
    bool above = strstr(r->flags, "above-min") != NULL;
    if (is(r, "int") || is(r, "size")) {
        const char *unit = is(r, "size") ? " bytes" : "";
        if (!strcmp(r->max, "9223372036854775807")) {
            if (is(r, "int")) snprintf(buf, size, "[at least %s]", r->min);
            else snprintf(buf, size, "[above %lld bytes]", atoll(r->min) - 1);
        } else {
            snprintf(buf, size, "[%s to %s%s]", r->min, r->max, unit);
        }
    } else if (is(r, "double")) {
        double lo = atof(r->min), hi = atof(r->max);
        if (hi == DBL_MAX) snprintf(buf, size, "[%s %g]", above ? "above" : "at least", lo);
        else if (above) snprintf(buf, size, "[above %g, at most %g]", lo, hi);
        else snprintf(buf, size, "[%g to %g]", lo, hi);
    }
}

static void check_help(const table *t) {
    static char help[1 << 16], help2[1 << 16];
    CHECK(ember(help, sizeof help, "help %s", t->words) == 0);
    CHECK(ember(help2, sizeof help2, "%s %s --help", t->cmd, t->prefix) == 0);
    CHECK(!strcmp(help, help2));
    char want[256];
    snprintf(want, sizeof want, "usage: ember %s", t->cmd);
    CHECK(!strncmp(help, want, strlen(want)));
    int visible_rows = 0;
    for (int i = 0; i < t->n; i++) {
        const row *r = &t->rows[i];
        char l[200], line_start[256];
        label(r, l, sizeof l);
        snprintf(line_start, sizeof line_start, "\n  %s ", l);
        const char *at = strstr(help, line_start);
        if (!visible(r)) {
            /* a hidden option is nowhere in the help */
            CHECK(!strstr(help, r->name));
            continue;
        }
        visible_rows++;
        if (!at) fprintf(stderr, "  ember %s --help: no line for '%s'\n", t->words, l);
        CHECK(at != NULL);
        char rg[128];
        range(r, rg, sizeof rg);
        if (at && rg[0]) {   /* the range within the option's entry: before the next option's line */
            const char *next = strstr(at + 1, "\n  -");
            const char *hit = strstr(at, rg);
            if (!hit || (next && hit > next)) fprintf(stderr, "  ember %s --help: %s lacks its range %s\n", t->words, l, rg);
            CHECK(hit && (!next || hit < next));
        }
    }
    /* exactly these: every line of the help that starts an option is one of them */
    int option_lines = 0;
    for (const char *p = help; (p = strstr(p, "\n  -")); p++) option_lines++;
    if (option_lines != visible_rows)
        fprintf(stderr, "  ember %s --help: %d option lines, %d visible options\n", t->words, option_lines, visible_rows);
    CHECK(option_lines == visible_rows);
}

/* name with each '-' as roff's "\-" */
static void roff(const char *s, char *buf, size_t size) {
    size_t n = 0;
    for (; *s && n + 3 < size; s++) {
        if (*s == '-') buf[n++] = '\\';
        buf[n++] = *s;
    }
    buf[n] = '\0';
}

/* The man page section of t, as `ember help --man` writes it (malloc'd), or NULL. */
static char *man_section(const table *t) {
    char title[160], words[128];
    roff(t->words, words, sizeof words);
    snprintf(title, sizeof title, ".SS ember %s\n", words);
    const char *sec = strstr(man_all, title);
    if (!sec) return NULL;
    const char *end = strstr(sec + 1, "\n.SS ");
    return strndup(sec, end ? (size_t)(end - sec) + 1 : strlen(sec));
}

static void check_man(const table *t) {
    char *section = man_section(t);
    CHECK(section != NULL);
    if (!section) return;
    int entries = 0, visible_rows = 0;
    for (const char *p = section; (p = strstr(p, ".TP\n")); p++) entries++;
    for (int i = 0; i < t->n; i++) {
        const row *r = &t->rows[i];
        char name[96], alias[32], metavar[160], entry[400];
        roff(r->name, name, sizeof name);
        roff(r->alias, alias, sizeof alias);
        roff(r->metavar, metavar, sizeof metavar);
        if (!visible(r)) {
            CHECK(!strstr(section, name));
            continue;
        }
        visible_rows++;
        snprintf(entry, sizeof entry, ".TP\n%s%s%s\\fB%s\\fR%s%s%s\n", r->alias[0] ? "\\fB" : "", alias,
                 r->alias[0] ? "\\fR, " : "", name, is(r, "flag") ? "" : " \\fI", is(r, "flag") ? "" : metavar,
                 is(r, "flag") ? "" : "\\fR");
        if (!strstr(section, entry)) fprintf(stderr, "  man page, ember %s: no entry %s", t->words, entry);
        CHECK(strstr(section, entry) != NULL);
    }
    /* one entry per visible option, and one for an argument that is no option (CHECKPOINT) */
    bool positional = strstr(section, ".TP\n\\fI") != NULL;
    CHECK(entries == visible_rows + (positional ? 1 : 0));
    free(section);
}

static void test_help_and_man_page_list_each_table(void) {
    for (int i = 0; i < ntables; i++) {
        check_help(&tables[i]);
        check_man(&tables[i]);
    }
}

/* The page the build installs (build/ember.1) holds each section as `ember help --man` writes it. */
static void test_installed_man_page_has_each_section(void) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.1", tool_path());
    FILE *f = fopen(path, "r");
    if (!f) SKIP("%s is not built (sanitizer builds do not write the man page)", path);
    char *page = calloc(1 << 18, 1);
    CHECK(page != NULL);
    if (page) page[fread(page, 1, (1 << 18) - 1, f)] = '\0';
    fclose(f);
    for (int i = 0; page && i < ntables; i++) {
        char *section = man_section(&tables[i]);
        CHECK(section && strstr(page, section));
        free(section);
    }
    free(page);
}

/* ---- the parser, option by option ---- */

/* A value the option accepts. */
static void sample(const row *r, char *buf, size_t size) {
    if (is(r, "int") || is(r, "size")) snprintf(buf, size, "%s", r->min);
    else if (is(r, "double")) snprintf(buf, size, "%s", strstr(r->flags, "above-min") ? r->max : r->min);
    else if (is(r, "choice")) snprintf(buf, size, "%.*s", (int)strcspn(r->choices, ","), r->choices);
    else if (is(r, "device")) snprintf(buf, size, "cpu");
    else snprintf(buf, size, "x");
}

/* Does the table have an option spelled s? */
static bool known(const table *t, const char *s) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->rows[i].name, s) || !strcmp(t->rows[i].alias, s)) return true;
    return false;
}

/* How many of the table's options begin with s. */
static int options_starting_with(const table *t, const char *s) {
    int n = 0;
    for (int i = 0; i < t->n; i++) n += !strncmp(t->rows[i].name, s, strlen(s));
    return n;
}

/* Options of s's length that differ from it in one letter: as near to s as the option s was
 * cut from (--see is one letter from --seq as from --seed). */
static int options_one_letter_from(const table *t, const char *s) {
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        const char *name = t->rows[i].name;
        if (strlen(name) != strlen(s)) continue;
        int diff = 0;
        for (size_t k = 0; s[k]; k++) diff += name[k] != s[k];
        n += diff == 1;
    }
    return n;
}

static void probe_option(const table *t, const row *r) {
    const char *c = t->cmd, *pre = t->prefix;
    char v[160], as[200];
    sample(r, v, sizeof v);
    /* accepted: both spellings, the alias */
    if (is(r, "flag")) {
        expect(0, "usage: ember", "%s %s %s --help", c, pre, r->name);
        expect(2, "takes no value", "%s %s %s=1", c, pre, r->name);
        expect(2, "is given twice", "%s %s %s %s", c, pre, r->name, r->name);
    } else {
        expect(0, "usage: ember", "%s %s %s '%s' --help", c, pre, r->name, v);
        expect(0, "usage: ember", "%s %s %s='%s' --help", c, pre, r->name, v);
        snprintf(as, sizeof as, "option %s needs a value", r->name);
        expect(2, as, "%s %s %s", c, pre, r->name);
        /* never the next option as the value */
        expect(2, "(the next argument, '--help', is an option)", "%s %s %s --help", c, pre, r->name);
        snprintf(as, sizeof as, "%s is given twice: give each option once", r->name);
        expect(2, as, "%s %s %s '%s' %s='%s'", c, pre, r->name, v, r->name, v);
    }
    if (r->alias[0]) {
        expect(0, "usage: ember", "%s %s %s %s --help", c, pre, r->alias, is(r, "flag") ? "" : v);
        snprintf(as, sizeof as, "%s is given twice (first as %s)", r->name, r->alias);
        expect(2, as, "%s %s %s %s %s %s", c, pre, r->alias, is(r, "flag") ? "" : v, r->name, is(r, "flag") ? "" : v);
    }
    /* numbers: the ends of the range, and what lies past them or is no decimal number */
    if (is(r, "int")) {
        long long lo = atoll(r->min), hi = atoll(r->max);
        snprintf(as, sizeof as, "%s expects an integer", r->name);
        expect(0, "usage: ember", "%s %s %s=%s --help", c, pre, r->name, r->max);
        if (lo > INT64_MIN) expect(2, as, "%s %s %s=%lld", c, pre, r->name, lo - 1);
        if (hi < INT64_MAX) expect(2, as, "%s %s %s=%lld", c, pre, r->name, hi + 1);
        else expect(2, "(out of range)", "%s %s %s=9223372036854775808", c, pre, r->name);
        expect(2, "(not a number)", "%s %s %s 0x10", c, pre, r->name);
        expect(2, "(not a number)", "%s %s %s %sx", c, pre, r->name, r->min);
        expect(2, "(not a number)", "%s %s %s ' %s'", c, pre, r->name, r->min);
        expect(2, "(not a number)", "%s %s %s 1e3", c, pre, r->name);
        expect(2, "(empty)", "%s %s %s ''", c, pre, r->name);
    }
    if (is(r, "double")) {
        double lo = atof(r->min), hi = atof(r->max);
        bool above = strstr(r->flags, "above-min") != NULL;
        snprintf(as, sizeof as, "%s expects a number %s %g", r->name, above ? ">" : ">=", lo);
        expect(0, "usage: ember", "%s %s %s=%s --help", c, pre, r->name, r->max);
        if (!above) expect(0, "usage: ember", "%s %s %s=%s --help", c, pre, r->name, r->min);
        if (above) expect(2, "(out of range)", "%s %s %s=%s", c, pre, r->name, r->min);
        else expect(2, "(out of range)", "%s %s %s=%.17g", c, pre, r->name, lo - 1);
        if (hi < DBL_MAX) expect(2, "(out of range)", "%s %s %s=%.17g", c, pre, r->name, hi * 2 + 1);
        expect(2, "(underflows to 0)", "%s %s %s 1e-400", c, pre, r->name);
        expect(2, "(underflows: below the smallest normal double", "%s %s %s 1e-310", c, pre, r->name);
        expect(2, "(not a number)", "%s %s %s 0x10", c, pre, r->name);
        expect(2, "(not a number)", "%s %s %s 0x1p-3", c, pre, r->name);
        expect(2, "(not a number)", "%s %s %s %sx", c, pre, r->name, r->max);
        expect(2, "(not a number)", "%s %s %s ' %s'", c, pre, r->name, r->max);
        expect(2, "(not a number)", "%s %s %s nan", c, pre, r->name);
        expect(2, "(not a number)", "%s %s %s inf", c, pre, r->name);
        expect(2, "(out of range)", "%s %s %s 1e999", c, pre, r->name);
        expect(2, "(empty)", "%s %s %s ''", c, pre, r->name);
    }
    if (is(r, "size")) {
        snprintf(as, sizeof as, "%s: cannot read the size", r->name);
        expect(0, "usage: ember", "%s %s %s 1.5GiB --help", c, pre, r->name);
        expect(2, as, "%s %s %s 0x10", c, pre, r->name);
        expect(2, as, "%s %s %s ' 5MB'", c, pre, r->name);
        expect(2, as, "%s %s %s 5MBx1", c, pre, r->name);
        expect(2, as, "%s %s %s 12QB", c, pre, r->name);
        expect(2, "(underflows to 0)", "%s %s %s 1e-400MB", c, pre, r->name);
        snprintf(as, sizeof as, "%s expects a size", r->name);
        if (atoll(r->min) > 0) expect(2, as, "%s %s %s %lld", c, pre, r->name, atoll(r->min) - 1);
    }
    /* choices: each word accepted (any case where the table says so), others refused */
    if (is(r, "choice")) {
        char words[512];
        snprintf(words, sizeof words, "%s", r->choices);
        for (char *save = NULL, *w = strtok_r(words, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
            expect(0, "usage: ember", "%s %s %s=%s --help", c, pre, r->name, w);
            char upper[64];
            size_t k = 0;
            for (; w[k] && k + 1 < sizeof upper; k++) upper[k] = (char)(w[k] >= 'a' && w[k] <= 'z' ? w[k] - 32 : w[k]);
            upper[k] = '\0';
            if (strcmp(upper, w)) expect(strstr(r->flags, "nocase") ? 0 : 2, strstr(r->flags, "nocase") ? "usage:" : "expects",
                                         "%s %s %s=%s --help", c, pre, r->name, upper);
        }
        snprintf(as, sizeof as, "%s expects", r->name);
        expect(2, as, "%s %s %s no-such-word", c, pre, r->name);
    }
    /* a slip of the keyboard: the last letter left off (where it leaves one option it could be:
     * "--top-" is as near --top-k as --top-p, "--see" as near --seq as --seed) */
    size_t n = strlen(r->name);
    char slip[64];
    snprintf(slip, sizeof slip, "%.*s", (int)n - 1, r->name);
    if (visible(r) && n >= 6 && !known(t, slip) && options_starting_with(t, slip) == 1 &&
        options_one_letter_from(t, slip) == 0) {
        snprintf(as, sizeof as, "unknown option '%s' (did you mean %s?)", slip, r->name);
        expect(2, as, "%s %s %s", c, pre, slip);
    }
}

static void test_the_parser_follows_each_table(void) {
    for (int i = 0; i < ntables; i++) {
        const table *t = &tables[i];
        int before = probes;
        char prefix_opt[64] = "";
        sscanf(t->prefix, "%63s", prefix_opt);
        for (int k = 0; k < t->n; k++)   /* (the option that selects the table is already given) */
            if (strcmp(t->rows[k].name, "--help") && strcmp(t->rows[k].name, prefix_opt)) probe_option(t, &t->rows[k]);
        /* the command as a whole: an unknown option, an argument where none goes (more arguments
         * than any command takes: OPT_MAX_POSITIONAL is 4) */
        expect(2, "unknown option '--no-such-option'", "%s %s --no-such-option", t->cmd, t->prefix);
        expect(2, "--help lists the options", "%s %s --no-such-option", t->cmd, t->prefix);
        expect(2, "--help takes no value", "%s %s --help=1", t->cmd, t->prefix);
        expect(2, "unexpected argument", "%s %s stray1 stray2 stray3 stray4 stray5", t->cmd, t->prefix);
        printf("  ember %s: %d probes\n", t->words, probes - before);
    }
}

static void test_top_level(void) {
    expect(0, "ember ", "--version");
    expect(2, "--version takes no arguments, got 'x'", "--version x");
    expect(2, "--help takes no arguments, got 'x'", "--help x");
    expect(0, "commands:", "help");
    expect(2, "unknown command 'frobnicate'", "help frobnicate");
    expect(2, "unexpected argument 'extra'", "help train extra");
    expect(0, "usage: ember train --model gpt", "help train --model gpt");
}

int main(void) {
    if (!tool_path()) {
        fprintf(stderr, "build/ember is missing: build the ember_cli target first\n");
        return 1;
    }
    RUN(test_tables_are_listed);
    RUN(test_help_and_man_page_list_each_table);
    RUN(test_installed_man_page_has_each_section);
    RUN(test_the_parser_follows_each_table);
    RUN(test_top_level);
    printf("option probes: %d run, %d as the tables say\n", probes, probes_as_expected);
    return test_summary();
}
