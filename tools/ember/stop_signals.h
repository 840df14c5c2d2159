/* How `ember train` and `ember finetune` take SIGINT, SIGTERM and SIGHUP: the first asks for
 * a checkpoint and a stop after the current step, a second stops at once.
 *
 * The signals are blocked in every thread from the start and one thread of their own takes
 * them with sigwait. A handler would run on whichever thread the kernel picks, in the middle
 * of a GEMM's generated code or of malloc, and a stopped run's heap was found corrupted in a
 * later free() in about one run in ten that way. While nothing catches them (before and after
 * training), a signal has its default action, as if none of this were here. */
#ifndef EMBER_TOOL_STOP_SIGNALS_H
#define EMBER_TOOL_STOP_SIGNALS_H

#include <stdbool.h>

/* Block the stop signals and start the thread that takes them. Call before any other thread
 * starts (the device pools, MPI), so that every thread inherits the mask. Without that thread
 * (pthread_create failed) the signals keep their default actions. */
void stop_signals_take(const char *tool);

/* While on, the first stop signal is recorded (stop_signals_pending) and a second exits at
 * once with 128 + the first. With grace_seconds > 0, the process also exits that long after
 * the first signal if catching is still on then, saying so on stderr: a save stuck on a dead
 * disk must not outlive the SIGKILL that Slurm and Kubernetes send 30 s after SIGTERM. */
void stop_signals_catch(bool on, int grace_seconds);

/* The stop signal that arrived while catching (or was requested), 0 if none. */
int stop_signals_pending(void);

/* Stop as if sig had arrived (another rank's signal, a test's --interrupt-after); no grace
 * timer starts. */
void stop_signals_request(int sig);

/* "SIGINT", "SIGTERM", "SIGHUP", or "a signal". */
const char *stop_signal_name(int sig);

#endif
