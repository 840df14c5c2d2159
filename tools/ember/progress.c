/* Progress display for `ember train`; see progress.h. */
#define _POSIX_C_SOURCE 200809L
#include "progress.h"

#include <math.h>
#include <string.h>
#include <unistd.h>
#include "mlp.h"

#define BAR_WIDTH 28
#define REDRAW_SECONDS 0.1

void progress_begin(progress *p, FILE *out, const char *label, int64_t total, int64_t first) {
    *p = (progress){.out = out, .tty = isatty(fileno(out)) == 1, .total = total, .first = first};
    snprintf(p->label, sizeof p->label, "%s", label);
    p->t0 = p->last_draw = mlp_now();
    p->next_plain = first + (total + 3) / 4;
}

static void clock_text(double s, char *buf, size_t size) {
    if (!isfinite(s) || s < 0) s = 0;
    if (s > 359999) s = 359999;   /* 99:59:59 */
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, size, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, size, "%d:%02d", t / 60, t % 60);
}

bool progress_due(const progress *p, int64_t done) {
    if (done == p->total) return true;
    return p->tty ? mlp_now() - p->last_draw >= REDRAW_SECONDS : done >= p->next_plain;
}

void progress_draw(progress *p, int64_t done, int64_t samples, double loss) {
    double now = mlp_now(), elapsed = now - p->t0;
    double rate = elapsed > 0 ? (double)(done - p->first) / elapsed : 0;
    double sps = elapsed > 0 ? (double)samples / elapsed : 0;
    char eta[32], spent[32], loss_text[32] = "";
    clock_text(rate > 0 ? (double)(p->total - done) / rate : 0, eta, sizeof eta);
    clock_text(elapsed, spent, sizeof spent);
    if (!isnan(loss)) snprintf(loss_text, sizeof loss_text, "  loss %.4f", loss);
    if (p->tty) {
        char bar[BAR_WIDTH + 1];
        int fill = p->total > 0 ? (int)(BAR_WIDTH * done / p->total) : BAR_WIDTH;
        for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
        bar[BAR_WIDTH] = 0;
        fprintf(p->out, "\r%s [%s] %lld/%lld  %.0f it/s  %.0f samples/s  %s<%s%s\033[K", p->label, bar,
                (long long)done, (long long)p->total, rate, sps, spent, eta, loss_text);
        p->last_draw = now;
    } else {
        fprintf(p->out, "%s %lld/%lld steps  %.0f samples/s  elapsed %s  ETA %s%s\n", p->label, (long long)done,
                (long long)p->total, sps, spent, eta, loss_text);
        while (p->next_plain <= done) p->next_plain += (p->total + 3) / 4 > 0 ? (p->total + 3) / 4 : 1;
    }
    fflush(p->out);
}

void progress_end(progress *p) {
    if (p->tty) fprintf(p->out, "\r\033[K");
    fflush(p->out);
}
