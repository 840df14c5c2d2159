/* Where this process sits in the job: rank, size and local rank from the launcher's
 * variables (include/ember/dist.h has the contract). No MPI needed. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "dist_internal.h"
#include "../util/errors.h"

/* -1: not set; -2: set but not a number in [0, max]. */
static long read_int(const char *name, long max) {
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < 0 || x > max) return -2;
    return x;
}

typedef struct source { const char *name, *rank, *size, *local; } source;
static const source SOURCES[] = {
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

static em_status read_source(const source *s, em_dist_env *out, bool *found) {
    long r = read_int(s->rank, 1 << 24), n = read_int(s->size, 1 << 24), l = read_int(s->local, 1 << 24);
    *found = r != -1 || n != -1;
    if (!*found) return EM_OK;
    if (r < 0 || n < 1 || r >= n || l == -2)
        return em_error(EM_ERR_ARGUMENT,
                        "em_dist_init: %s's variables are inconsistent: expected 0 <= %s < %s and %s >= 0, "
                        "found %s=%s, %s=%s, %s=%s",
                        s->name, s->rank, s->size, s->local, s->rank, getenv(s->rank) ? getenv(s->rank) : "(unset)",
                        s->size, getenv(s->size) ? getenv(s->size) : "(unset)", s->local,
                        getenv(s->local) ? getenv(s->local) : "(unset)");
    *out = (em_dist_env){.rank = (int)r, .size = (int)n, .local_rank = l < 0 ? 0 : (int)l, .source = s->name};
    return EM_OK;
}

em_status em_dist_env_read(em_dist_env *out) {
    if (!out) return em__error_unless_pending(EM_ERR_ARGUMENT, "em_dist_env_read: argument 'out' is NULL");
    *out = (em_dist_env){.rank = 0, .size = 1, .local_rank = 0, .source = "none"};
    bool have = false, found;
    for (size_t i = 0; i < sizeof SOURCES / sizeof *SOURCES; i++) {
        em_dist_env e;
        em_status st = read_source(&SOURCES[i], &e, &found);
        if (st != EM_OK) return st;
        if (!found) continue;
        if (!have) {
            *out = e;
            have = true;
        } else if (i == 2 && (e.rank != out->rank || e.size != out->size)) {
            /* ember launch sets torchrun's and mpirun's: they must agree. mpirun inside a
             * Slurm allocation inherits the batch step's SLURM_PROCID: not compared. */
            return em_error(EM_ERR_ARGUMENT,
                            "em_dist_init: the launchers' variables disagree: %s says rank %d of %d, %s says rank %d of %d",
                            out->source, out->rank, out->size, e.source, e.rank, e.size);
        }
    }
    return EM_OK;
}
