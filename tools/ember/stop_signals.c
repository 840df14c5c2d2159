/* The stop signals' own thread (stop_signals.h). */
#include "stop_signals.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int pending;        /* the first stop signal while catching, 0 if none */
static atomic_bool catching;
static atomic_int grace;          /* seconds; 0: no timer */
static sigset_t stop_set;
static const char *tool_name = "ember";

const char *stop_signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

/* The signal's default action: unblocked on this thread only, then raised on it. */
static void default_action(int sig) {
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    signal(sig, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    _exit(128 + sig);   /* a signal whose default is to be ignored (none of these): still stop */
}

static void grace_over(void) {
    char msg[256];
    int n = snprintf(msg, sizeof msg, "%s: the checkpoint was not saved in time after the signal; exiting without it\n",
                     tool_name);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        (void)w;
    }
    _exit(128 + atomic_load(&pending));
}

static void *waiter(void *arg) {
    (void)arg;
    bool timing = false;
    struct timespec deadline = {0};
    for (;;) {
        int sig = 0;
        if (timing) {
            struct timespec now, left;
            clock_gettime(CLOCK_MONOTONIC, &now);
            long long ns = (long long)(deadline.tv_sec - now.tv_sec) * 1000000000LL + (deadline.tv_nsec - now.tv_nsec);
            if (ns > 0) {
                left = (struct timespec){.tv_sec = (time_t)(ns / 1000000000LL), .tv_nsec = (long)(ns % 1000000000LL)};
                sig = sigtimedwait(&stop_set, NULL, &left);
                if (sig < 0 && errno != EAGAIN) continue;   /* EINTR: wait again */
            } else {
                sig = -1;
            }
            if (sig < 0) {   /* the grace period is over */
                timing = false;
                if (atomic_load(&catching)) grace_over();
                continue;
            }
        } else if (sigwait(&stop_set, &sig) != 0) {
            continue;
        }
        if (!atomic_load(&catching)) default_action(sig);
        if (atomic_load(&pending)) _exit(128 + atomic_load(&pending));   /* a second signal: at once */
        atomic_store(&pending, sig);
        int g = atomic_load(&grace);
        if (g > 0) {
            clock_gettime(CLOCK_MONOTONIC, &deadline);
            deadline.tv_sec += g;
            timing = true;
        }
    }
    return NULL;
}

void stop_signals_take(const char *tool) {
    if (tool) tool_name = tool;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGTERM);
    sigaddset(&stop_set, SIGHUP);
    if (pthread_sigmask(SIG_BLOCK, &stop_set, NULL) != 0) return;
    pthread_t t;
    if (pthread_create(&t, NULL, waiter, NULL) != 0) {   /* no waiter: the signals' own actions */
        pthread_sigmask(SIG_UNBLOCK, &stop_set, NULL);
        return;
    }
    pthread_detach(t);
}

void stop_signals_catch(bool on, int grace_seconds) {
    atomic_store(&grace, on && grace_seconds > 0 ? grace_seconds : 0);
    atomic_store(&catching, on);
}

int stop_signals_pending(void) {
    return atomic_load(&pending);
}

void stop_signals_request(int sig) {
    int none = 0;
    atomic_compare_exchange_strong(&pending, &none, sig);
}
