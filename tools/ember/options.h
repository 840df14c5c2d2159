/* The `ember` command's one option parser. Each command describes its options in a table
 * (name, kind, range, metavar, help); opt_parse reads argv against it, and the same table
 * writes the command's --help, its man page section and `ember help --options`, so what
 * the help says and what the parser accepts cannot drift apart.
 *
 * The rules every command gets from here:
 *   - `--name value` and `--name=value` (long options); `-x value` (short aliases);
 *   - an option given twice is a usage error (no option is repeatable: a list is one
 *     comma-separated value, e.g. --sizes 64,256);
 *   - numbers are read whole, in decimal, and range-checked: no hex, no trailing text, no
 *     value that overflows, and none that underflows to 0;
 *   - a value is never taken from the next argument when that argument is one of the
 *     command's options (`--checkpoint --resume` is a missing value, not a file name);
 *   - -h and --help print the help and stop, wherever they come;
 *   - every usage error is one message on the error stream and exit status 2.
 * What a value means beyond its kind (a device that exists, a list's items, a file's folder)
 * is checked by the command itself after opt_parse. */
#ifndef EMBER_TOOL_OPTIONS_H
#define EMBER_TOOL_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum opt_kind {
    OPT_FLAG,     /* no value */
    OPT_INT,      /* a decimal integer in [imin, imax] */
    OPT_DOUBLE,   /* a finite decimal number in [dmin, dmax] (dmin excluded with OPT_ABOVE_MIN) */
    OPT_STRING,   /* any text: a path, a name */
    OPT_CHOICE,   /* one of choices[] */
    OPT_SIZE,     /* bytes with an optional unit (300MB, 1.5GiB), in [imin, imax] */
    OPT_DEVICE,   /* a device string (auto, cpu, cuda:N, opencl:N); the command resolves it */
    OPT_LIST,     /* a comma-separated list; the command reads its items */
} opt_kind;

/* One accepted word of an OPT_CHOICE option. Several words may share an id (aliases: the
 * help shows the first word of each id). The list ends with {NULL, 0}. */
typedef struct opt_choice {
    const char *word;
    int id;
} opt_choice;

enum {
    OPT_HIDDEN = 1u << 0,      /* for the command's own use (ember launch's inner launcher): not in --help */
    OPT_NOCASE = 1u << 1,      /* choices match without regard to case */
    OPT_ABOVE_MIN = 1u << 2,   /* OPT_DOUBLE: dmin itself is refused */
};

typedef struct opt_spec {
    const char *name;      /* "--epochs" */
    const char *alias;     /* "-n", or NULL */
    opt_kind kind;
    const char *metavar;   /* "N", "PATH"; NULL for a choice: its words, "a|b|c" */
    const char *help;      /* what it does; lines are wrapped when printed */
    int64_t imin, imax;    /* OPT_INT, OPT_SIZE */
    double dmin, dmax;     /* OPT_DOUBLE */
    const opt_choice *choices;
    unsigned flags;
} opt_spec;

#define OPTION_FLAG(name_, help_) {.name = name_, .kind = OPT_FLAG, .help = help_}
#define OPTION_INT(name_, metavar_, min_, max_, help_) \
    {.name = name_, .kind = OPT_INT, .metavar = metavar_, .imin = min_, .imax = max_, .help = help_}
#define OPTION_DOUBLE(name_, metavar_, min_, max_, help_) \
    {.name = name_, .kind = OPT_DOUBLE, .metavar = metavar_, .dmin = min_, .dmax = max_, .help = help_}
#define OPTION_STRING(name_, metavar_, help_) {.name = name_, .kind = OPT_STRING, .metavar = metavar_, .help = help_}
#define OPTION_CHOICE(name_, choices_, help_) {.name = name_, .kind = OPT_CHOICE, .choices = choices_, .help = help_}
#define OPTION_SIZE(name_, metavar_, min_, max_, help_) \
    {.name = name_, .kind = OPT_SIZE, .metavar = metavar_, .imin = min_, .imax = max_, .help = help_}
#define OPTION_DEVICE(name_, help_) {.name = name_, .kind = OPT_DEVICE, .metavar = "D", .help = help_}
#define OPTION_LIST(name_, metavar_, help_) {.name = name_, .kind = OPT_LIST, .metavar = metavar_, .help = help_}

/* The most options one command has room for (ember train has the most, 24). */
#define OPT_MAX 40
/* The most arguments that are no option (ember tokenize's MODEL_DIR TEXT). */
#define OPT_MAX_POSITIONAL 4

/* A command: its usage, its options and the text around them. Texts are lines separated by
 * '\n' (a blank line between paragraphs); each line is wrapped when printed. */
typedef struct opt_command {
    const char *name;          /* "ember train": the messages' prefix */
    const char *invocation;    /* "ember train --model gpt" where it differs from name, else NULL */
    const char *usage;         /* "ember train [options]"; more forms on lines of their own */
    const char *about;         /* what the command does */
    const char *positional;    /* "CHECKPOINT": one argument that is no option; NULL: none; with
                                * max_positional, the names of several ("MODEL_DIR TEXT") */
    int max_positional;        /* how many such arguments at most (0: one) */
    const char *positional_help;
    const char *extra;         /* after "unexpected argument 'X': ": what goes where instead */
    bool rest_after_dashdash;  /* "--" ends the options; what follows is the command's (ember launch) */
    const opt_spec *options;
    int count;
    const char *epilogue;      /* after the options: environment, signals, notes */
    const char *exit_status;   /* "0 done, 1 failed, 2 bad arguments" */
} opt_command;

/* In a text: a space that --help never breaks a line at ("128" OPT_NBSP "+" OPT_NBSP "N"). */
#define OPT_NBSP "\x1f"

#define OPT_COUNT(table) ((int)(sizeof table / sizeof table[0]))
/* After each table: a table too long for opt_result fails the build. */
#define OPT_TABLE_FITS(table) _Static_assert(OPT_COUNT(table) <= OPT_MAX, #table " has more options than OPT_MAX")

/* One option's value after parsing. */
typedef struct opt_value {
    bool given;
    const char *as;      /* the spelling used: the name or the alias */
    const char *text;    /* the value as given (NULL for a flag) */
    int64_t i;           /* OPT_INT, OPT_SIZE */
    double d;            /* OPT_DOUBLE */
    int choice;          /* OPT_CHOICE: the word's id */
} opt_value;

typedef struct opt_result {
    opt_value v[OPT_MAX];       /* in the table's order */
    const char *positional;     /* NULL when not given */
    const char *args[OPT_MAX_POSITIONAL];   /* every argument that is no option, in order */
    int nargs;
    char **rest;                /* after "--" (rest_after_dashdash), NULL-terminated as argv is */
    int nrest;
    bool dashdash;              /* "--" was there */
} opt_result;

/* Reads argv[1..argc-1] against c. Returns -1 when the command goes on (r filled), 0 after
 * printing the help to out (-h, --help), or 2 after printing a usage error to err. */
int opt_parse(const opt_command *c, int argc, char **argv, opt_result *r, FILE *out, FILE *err);

/* A usage error: "NAME: message\n" on err; returns 2, the usage status. */
int opt_usage_error(const opt_command *c, FILE *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* --help: usage, about, the options with their ranges, epilogue and exit status. */
void opt_print_help(const opt_command *c, FILE *out);
/* The command's section of the man page (roff), from the same table, under "title". */
void opt_print_man(const opt_command *c, const char *title, FILE *out);
/* One line per option, tab-separated, for scripts, completion and tests:
 *   name alias kind metavar min max flags choices
 * ("-" for a field that does not apply; flags and choices comma-separated). */
void opt_print_table(const opt_command *c, FILE *out);

/* The length of the decimal number that s starts with (digits, an optional fraction and
 * exponent; no sign, no hex, no inf or nan), 0 when it starts with none. */
size_t opt_decimal_prefix(const char *s);

#endif
